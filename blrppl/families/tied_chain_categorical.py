"""The tied chain Categorical family: a discrete chain whose pair potential is the same at every step.

    q(z) ∝ exp(Σ_t θ_t(z_t) + Σ_t ψ(z_t, z_{t+1})),     z_t ∈ {0, ..., K-1},

    T(z) = (one_hot(z_t),  Σ_t one_hot(z_t) ⊗ one_hot(z_{t+1})),   shapes (T, K), (K, K),
    λ    = (θ, ψ)  (unary log potentials, one pair log potential),
    μ    = (q(z_t = k),  Σ_t q(z_t = i, z_{t+1} = j))  (marginals, expected transition counts),
    A(λ) = log Σ_z exp(...)  by the forward algorithm,   h(z) = 1.

It is the posterior of a hidden Markov model with a stationary transition
matrix (Khan & Rue, Sec. 5.2, EM and VMP on an HMM): every factor that pairs
neighbouring states does so through one (K, K) log potential, so the pair
statistic summed over time is sufficient. Each member is the chain
Categorical whose ψ_t are all ψ (:func:`expand`); what the tie saves is the
(T-1, K, K) arrays: the update adds (K, K) site parameters, forward-backward
exponentiates ψ once, and the expected transition counts are one (K, T-1) x
(T-1, K) product instead of T-1 pairwise marginals. A plan uses this family
for a chain Categorical wherever every factor reads its pairs with one
potential for all steps (:func:`blrppl.symbolic.chain_reads.tie_transitions`),
else the untied :mod:`~blrppl.families.chain_categorical`.

In float64 the recursions run on probabilities (scaled, as the untied
family's); in float32 in log space, through the untied family's code.

.. warning::
    ``natural_params`` (μ -> λ) has no closed form here (the canonical λ of
    the untied family is not tied) and raises; nothing in a fit needs it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.errors import ModelError
from blrppl.families import chain_categorical as untied
from blrppl.families.base import ExpFamily
from blrppl.families.chain_gaussian import vmap_over_batch
from blrppl.families.layout import Layout, elementwise_layout


class TiedChainStats(NamedTuple):
    """T(z) = (one_hot(z_t), Σ_t one_hot(z_t) ⊗ one_hot(z_{t+1})): shapes (..., T, K), (..., K, K)."""

    one_hot: Array
    transitions: Array


_STATS_NDIM = (2, 2)


def _over_batch(fn, natural: TiedChainStats):
    return vmap_over_batch(fn, natural, _STATS_NDIM, untied._batch_shape(natural))


def expand(natural: TiedChainStats) -> untied.ChainCategoricalStats:
    """The same member of the untied family: ψ_t = ψ at each of the T-1 steps."""
    length, k = jnp.shape(natural.one_hot)[-2:]
    pair = jnp.broadcast_to(natural.transitions[..., None, :, :], untied._batch_shape(natural) + (length - 1, k, k))
    return untied.ChainCategoricalStats(one_hot=natural.one_hot, pair=pair)


def _potentials(natural: TiedChainStats) -> tuple[Array, Array, Array]:
    """``(exp(θ_t - max θ_t), exp(ψ - max ψ), Σ of the maxima)`` for one chain."""
    unary_max = jnp.max(natural.one_hot, axis=-1, keepdims=True)
    pair_max = jnp.max(natural.transitions)
    shift = jnp.sum(unary_max) + (natural.one_hot.shape[-2] - 1) * pair_max
    return jnp.exp(natural.one_hot - unary_max), jnp.exp(natural.transitions - pair_max), shift


def _forward(unary: Array, pair: Array, shift: Array) -> tuple[Array, Array, Array]:
    """Normalised α_t (T, K), the step scales (T-1,) and A(λ), on probabilities."""

    def step(alpha, u):
        new = (alpha @ pair) * u
        scale = jnp.sum(new)
        new = new / scale
        return new, (new, scale)

    first_scale = jnp.sum(unary[0])
    first = unary[0] / first_scale
    _, (rest, scales) = jax.lax.scan(step, first, unary[1:])
    log_norm = jnp.log(first_scale) + jnp.sum(jnp.log(scales)) + shift
    return jnp.concatenate([first[None], rest]), scales, log_norm


def _mean_and_norm_scaled(natural: TiedChainStats) -> tuple[TiedChainStats, Array]:
    """Forward-backward of one chain on probabilities (float64), as the untied family's
    :func:`~blrppl.families.chain_categorical._mean_and_norm_scaled` with one pair matrix P:
    the counts Σ_t α_t(i) P(i, j) u_{t+1}(j) β_{t+1}(j) / (c_{t+1} n_{t+1}) are P ⊙ (αᵀ W)."""
    unary, pair, shift = _potentials(natural)
    alpha, scales, log_norm = _forward(unary, pair, shift)

    def step(beta, inputs):
        u, a = inputs
        new = pair @ (u * beta)
        new = new / jnp.sum(new)
        return new, (new, jnp.dot(a, new))

    last = jnp.ones_like(unary[-1])
    _, (rest, norms) = jax.lax.scan(step, last, (unary[1:], alpha[:-1]), reverse=True)
    beta = jnp.concatenate([rest, last[None]])
    norms = jnp.concatenate([norms, jnp.sum(alpha[-1])[None]])
    marginals = alpha * (beta / norms[:, None])
    weights = unary[1:] * beta[1:] / (scales * norms[1:])[:, None]
    counts = pair * (alpha[:-1].T @ weights)
    return TiedChainStats(one_hot=marginals, transitions=counts), log_norm


def _mean_and_norm_one(natural: TiedChainStats) -> tuple[TiedChainStats, Array]:
    if untied._in_probabilities(natural):
        return _mean_and_norm_scaled(natural)
    mean, log_norm = untied._mean_and_norm_log(expand(natural))  # float32: log space
    return TiedChainStats(one_hot=mean.one_hot, transitions=jnp.sum(mean.pair, axis=-3)), log_norm


def mean_and_log_normalizer(natural: TiedChainStats) -> tuple[TiedChainStats, Array]:
    """Return ``(μ, A(λ))`` from one forward-backward pass."""
    return _over_batch(_mean_and_norm_one, natural)


def mean_params(natural: TiedChainStats) -> TiedChainStats:
    """Return μ = ∇A(λ): the marginals and the expected transition counts."""
    return mean_and_log_normalizer(natural)[0]


def log_normalizer(natural: TiedChainStats) -> Array:
    """Return A(λ) by the forward algorithm, batch shaped.

    Example:
        >>> nat = TiedChainStats(jnp.zeros((3, 2)), jnp.zeros((2, 2)))
        >>> float(log_normalizer(nat))  # log 2³
        2.0794415416798357
    """
    if untied._in_probabilities(natural):
        return _over_batch(lambda n: _forward(*_potentials(n))[2], natural)
    return untied.log_normalizer(expand(natural))


def sufficient_stats(z: ArrayLike, num_categories: int | None = None) -> TiedChainStats:
    """Return T(z) for integer chains ``z`` of shape (..., T) (``num_categories`` K required)."""
    stats = untied.sufficient_stats(z, num_categories)
    return TiedChainStats(one_hot=stats.one_hot, transitions=jnp.sum(stats.pair, axis=-3))


def natural_params(mean: TiedChainStats) -> TiedChainStats:
    """Not available: the λ of given marginals and transition counts has no closed form."""
    raise ModelError(
        "TiedChainCategorical: natural parameters from mean parameters have no closed form (the "
        "canonical λ of given marginals is not tied); use families={site: 'ChainCategorical'} for that."
    )


def from_usual(*, initial_probs: ArrayLike, transition_probs: ArrayLike, num_steps: int) -> TiedChainStats:
    """Return λ of a stationary Markov chain: ``initial_probs`` (..., K), ``transition_probs`` (..., K, K)."""
    nat = untied.from_usual(initial_probs=initial_probs, transition_probs=transition_probs, num_steps=num_steps)
    return TiedChainStats(one_hot=nat.one_hot, transitions=nat.pair[..., 0, :, :])


def to_usual(natural: TiedChainStats) -> dict[str, Array]:
    """Return ``{"initial_probs": q(z_1), "transition_probs": q(z_{t+1} | z_t)}`` (per step)."""
    return untied.to_usual(expand(natural))


def from_numpyro(d) -> TiedChainStats:
    """Return λ of a chain distribution whose pair potentials are equal at every step.

    Raises:
        ModelError: for any other distribution, or untied pair potentials.
    """
    nat = untied.from_numpyro(d)
    if not bool(jnp.all(nat.pair == nat.pair[..., :1, :, :])):
        raise ModelError("TiedChainCategorical: this chain's pair potentials differ between steps.")
    return TiedChainStats(one_hot=nat.one_hot, transitions=nat.pair[..., 0, :, :])


def to_numpyro(natural: TiedChainStats) -> untied.ChainCategoricalDistribution:
    """Return the chain distribution (event shape (T,)); its ``pair_marginals`` are per step."""
    return untied.ChainCategoricalDistribution(expand(natural))


def sample(rng_key: PRNGKey, natural: TiedChainStats, sample_shape: tuple = ()) -> Array:
    """Draw integer chains of shape ``sample_shape + batch + (T,)`` (forward filter, backward sample)."""
    return untied.sample(rng_key, expand(natural), sample_shape)


def is_valid(natural: TiedChainStats) -> Array:
    """Return A(λ) finite and no +∞/NaN potential, as the untied family: the forward pass runs
    only where the bound |A(λ)| <= Σ|θ| + (T-1) Σ|ψ| + T log K is not finite."""
    length, k = natural.one_hot.shape[-2:]
    bound = (
        jnp.sum(jnp.abs(natural.one_hot), axis=(-2, -1))
        + (length - 1) * jnp.sum(jnp.abs(natural.transitions), axis=(-2, -1))
        + length * math.log(k)
    )
    bounded = jnp.isfinite(bound)

    def exact(n):
        return untied._no_nan(n) & jnp.isfinite(log_normalizer(n))

    return jax.lax.cond(jnp.all(bounded), lambda n: bounded, exact, natural)


def checked_moments(natural: TiedChainStats) -> tuple[TiedChainStats, Array, Array]:
    """Return ``(μ, A(λ), is_valid(λ))`` from one forward-backward pass."""
    mean, log_norm = mean_and_log_normalizer(natural)
    return mean, log_norm, untied._no_nan(natural) & jnp.isfinite(log_norm)


def _example(q) -> TiedChainStats:
    batch, length, k = q.batch_shape, q.shape[q.num_batch], q.num_categories
    return TiedChainStats(one_hot=jnp.zeros(batch + (length, k)), transitions=jnp.zeros(batch + (k, k)))


TIED_CHAIN_CATEGORICAL = ExpFamily(
    name="TiedChainCategorical",
    stats_type=TiedChainStats,
    event_ndim=1,
    support=constraints.independent(constraints.nonnegative_integer, 1),
    sufficient_stats=sufficient_stats,
    log_base_measure=untied.log_base_measure,
    expected_log_base_measure=untied.expected_log_base_measure,
    log_normalizer=log_normalizer,
    mean_params=mean_params,
    natural_params=natural_params,
    from_usual=from_usual,
    to_usual=to_usual,
    from_numpyro=from_numpyro,
    to_numpyro=to_numpyro,
    sample=sample,
    is_valid=is_valid,
    batch_shape=untied._batch_shape,
    kind="tied_chain_categorical",
    layout=Layout(elementwise_layout().to_value, elementwise_layout().from_value, _example),
    start_at=untied.start_at,
    random_restart=False,
    index_valued=True,
    chain=True,
    mean_and_log_normalizer=mean_and_log_normalizer,
    checked_moments=checked_moments,
)
"""Discrete chain z_1..z_T in {0..K-1} with one pair log potential for every step (a stationary HMM posterior)."""
