"""The chain Categorical family: a distribution over discrete chains (an HMM posterior).

    q(z) ∝ exp(Σ_t θ_t(z_t) + Σ_t ψ_t(z_t, z_{t+1})),     z_t ∈ {0, ..., K-1},

    T(z) = (one_hot(z_t),  one_hot(z_t) ⊗ one_hot(z_{t+1})),   shapes (T, K), (T-1, K, K),
    λ    = (θ, ψ)  (unary and pairwise log potentials),
    μ    = (q(z_t = k),  q(z_t = i, z_{t+1} = j))  (marginals and pairwise marginals),
    A(λ) = log Σ_z exp(...)  by the forward algorithm,   h(z) = 1.

A is computed by the forward algorithm and μ = ∇A by forward-backward, O(T K²),
with messages normalised at every step (Rabiner's scaling). In float64 the
recursions run on probabilities (:func:`_mean_and_norm_scaled`: each step's
potentials exponentiated less their maximum, outside the sequential loop,
2.4x faster than log space); in float32, whose 87 nats of range an outlier
against a confident transition can exhaust, in log space with ``logsumexp``.

The parametrisation is overcomplete: adding c_t(z_t) to θ_t and subtracting it
from a row or column of a neighbouring ψ leaves q unchanged (a gauge freedom),
so ``natural_params`` returns one representative, the canonical
(Bethe / junction-tree) one with A(λ) = 0:

    θ_t = log q(z_t),   ψ_t(i, j) = log q(z_t = i, z_{t+1} = j) - log q(z_t = i) - log q(z_{t+1} = j).

.. warning::
    A value z is an integer chain (event shape (T,)), but its statistics have
    trailing K axes, so ``sufficient_stats`` needs ``num_categories``. Zero
    probabilities give -∞ natural parameters. ``to_numpyro(λ).mean`` and
    ``.variance`` are those of the integer value z_t per step (Σ_k k q(z_t = k)),
    not the marginal probabilities (use ``.marginals``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import logsumexp
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families.categorical import value_moments
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.layout import Layout, elementwise_layout
from blrppl.families.chain_gaussian import vmap_over_batch


class ChainCategoricalStats(NamedTuple):
    """T(z) = (one_hot(z_t), one_hot(z_t) ⊗ one_hot(z_{t+1})): shapes (..., T, K), (..., T-1, K, K).

    As natural parameters: unary and pairwise log potentials; as mean parameters:
    marginals q(z_t = k) and pairwise marginals q(z_t = i, z_{t+1} = j).
    """

    one_hot: Array
    pair: Array


_STATS_NDIM = (2, 3)


def _batch_shape(natural: ChainCategoricalStats) -> tuple[int, ...]:
    return tuple(jnp.shape(natural.one_hot)[:-2])


def _over_batch(fn, natural: ChainCategoricalStats):
    return vmap_over_batch(fn, natural, _STATS_NDIM, _batch_shape(natural))


# Scan bodies live at module level so that JAX reuses their traces (and
# compiled code) across calls outside jit. Forward and backward messages are
# normalised at every step (the scaled forward-backward of Rabiner 1989, in
# log space): they stay O(1) however long the chain, which float32 needs.
def _forward_step(carry, inputs):
    log_alpha, log_norm = carry
    unary, pair = inputs
    new = unary + logsumexp(log_alpha[:, None] + pair, axis=0)
    scale = logsumexp(new)
    new = new - scale
    return (new, log_norm + scale), new


def _backward_step(log_beta, inputs):
    unary_next, pair = inputs
    new = logsumexp(pair + (unary_next + log_beta)[None, :], axis=1)
    new = new - logsumexp(new)
    return new, new


def _forward(natural: ChainCategoricalStats) -> tuple[Array, Array]:
    """Return normalised log α_t (T, K) and A(λ).

    α_t(k) ∝ Σ_{z_1..z_{t-1}} exp(potentials up to z_t = k), each step scaled
    to sum to one; A(λ) is the sum of the log scales.
    """
    first = natural.one_hot[0]
    scale = logsumexp(first)
    (_, log_norm), rest = jax.lax.scan(
        _forward_step, (first - scale, scale), (natural.one_hot[1:], natural.pair)
    )
    return jnp.concatenate([(first - scale)[None], rest]), log_norm


def _backward(natural: ChainCategoricalStats) -> Array:
    """Return normalised log β_t(k) ∝ log Σ_{z_{t+1}..z_T} exp(potentials after z_t = k), shape (T, K)."""
    last = jnp.zeros_like(natural.one_hot[-1])
    _, rest = jax.lax.scan(
        _backward_step, last, (natural.one_hot[1:], natural.pair), reverse=True
    )
    return jnp.concatenate([rest, last[None]])


def _in_probabilities(natural: ChainCategoricalStats) -> bool:
    """Whether the recursions run on probabilities: float64, whose 708 nats of range a scaled
    step exhausts only where every path into the step is that unlikely (module docstring)."""
    return jnp.result_type(natural.one_hot) == jnp.float64


def _scaled_potentials(natural: ChainCategoricalStats) -> tuple[Array, Array, Array]:
    """``(exp(θ_t - max θ_t), exp(ψ_t - max ψ_t), Σ of the maxima)``: every step's potentials as
    numbers in [0, 1] (the largest 1), made outside the sequential loop, and what A gets back."""
    unary_max = jnp.max(natural.one_hot, axis=-1, keepdims=True)
    pair_max = jnp.max(natural.pair, axis=(-2, -1), keepdims=True)
    shift = jnp.sum(unary_max) + jnp.sum(pair_max)
    return jnp.exp(natural.one_hot - unary_max), jnp.exp(natural.pair - pair_max), shift


def _scaled_forward_step(alpha, inputs):
    unary, pair = inputs
    new = (alpha @ pair) * unary
    scale = jnp.sum(new)
    new = new / scale
    return new, (new, scale)


def _scaled_backward_step(beta, inputs):
    unary_next, pair, alpha = inputs
    new = pair @ (unary_next * beta)
    new = new / jnp.sum(new)
    return new, (new, jnp.dot(alpha, new))


def _scaled_forward(unary: Array, pair: Array, shift: Array) -> tuple[Array, Array, Array]:
    """Normalised α_t (T, K) on probabilities, the step scales c_t (T-1,: α_t's sums before
    normalising, from t = 2) and A(λ): the log scales, the first step's and the shift."""
    first_scale = jnp.sum(unary[0])
    first = unary[0] / first_scale
    _, (rest, scales) = jax.lax.scan(_scaled_forward_step, first, (unary[1:], pair))
    log_norm = jnp.log(first_scale) + jnp.sum(jnp.log(scales)) + shift
    return jnp.concatenate([first[None], rest]), scales, log_norm


def _mean_and_norm_scaled(natural: ChainCategoricalStats) -> tuple[ChainCategoricalStats, Array]:
    """:func:`_mean_and_norm_one` on probabilities (float64): the scaled forward-backward of
    Rabiner (1989), with each step's potentials exponentiated less their maximum beforehand.

    No marginal is normalised by a sum over its categories: the backward pass also returns
    n_t = Σ_k α_t(k) β_t(k), so q(z_t) = α_t β_t / n_t, and the pairwise marginal's normaliser
    Σ_ij α_t(i) P_t(i, j) u_{t+1}(j) β_{t+1}(j) = c_{t+1} n_{t+1} (c: the forward scales), so
    q(z_t, z_{t+1}) is one elementwise product over (T-1, K, K), with no reduction over K x K.
    """
    unary, pair, shift = _scaled_potentials(natural)
    alpha, scales, log_norm = _scaled_forward(unary, pair, shift)
    last = jnp.ones_like(unary[-1])
    _, (rest, norms) = jax.lax.scan(_scaled_backward_step, last, (unary[1:], pair, alpha[:-1]), reverse=True)
    beta = jnp.concatenate([rest, last[None]])
    norms = jnp.concatenate([norms, jnp.sum(alpha[-1])[None]])
    marginals = alpha * (beta / norms[:, None])
    weights = unary[1:] * beta[1:] / (scales * norms[1:])[:, None]
    joint = alpha[:-1, :, None] * pair * weights[:, None, :]
    return ChainCategoricalStats(one_hot=marginals, pair=joint), log_norm


def sufficient_stats(
    z: ArrayLike, num_categories: int | None = None
) -> ChainCategoricalStats:
    """Return T(z) for integer chains ``z`` of shape (..., T).

    Raises:
        TypeError: if ``num_categories`` is missing.
    """
    if num_categories is None:
        raise TypeError("ChainCategorical sufficient_stats needs num_categories=K.")
    one_hot = jax.nn.one_hot(z, num_categories, dtype=jnp.result_type(float))
    return ChainCategoricalStats(
        one_hot=one_hot, pair=one_hot[..., :-1, :, None] * one_hot[..., 1:, None, :]
    )


def log_base_measure(z: ArrayLike) -> Array:
    """Return log h(z) = 0, batch shaped."""
    return jnp.zeros(jnp.shape(z)[:-1], jnp.result_type(float))


def expected_log_base_measure(natural: ChainCategoricalStats) -> Array:
    """Return E_q[log h(z)] = 0."""
    return jnp.zeros(_batch_shape(natural), natural.one_hot.dtype)


def log_normalizer(natural: ChainCategoricalStats) -> Array:
    """Return A(λ) = log Σ_k α_T(k) (the scaled forward algorithm: the sum of the step scales), batch shaped.

    Example:
        >>> nat = ChainCategoricalStats(jnp.zeros((3, 2)), jnp.zeros((2, 2, 2)))
        >>> float(log_normalizer(nat))  # log 2³
        2.0794415416798357
    """
    if _in_probabilities(natural):
        return _over_batch(lambda n: _scaled_forward(*_scaled_potentials(n))[2], natural)
    return _over_batch(lambda n: _forward(n)[1], natural)


def _mean_and_norm_one(natural: ChainCategoricalStats) -> tuple[ChainCategoricalStats, Array]:
    if _in_probabilities(natural):
        return _mean_and_norm_scaled(natural)
    return _mean_and_norm_log(natural)


def _mean_and_norm_log(natural: ChainCategoricalStats) -> tuple[ChainCategoricalStats, Array]:
    """``(μ, A(λ))`` of one chain by forward-backward in log space (float32's; float64's reference)."""
    log_alpha, log_norm = _forward(natural)
    log_beta = _backward(natural)
    # Normalised per step, so each marginal is a softmax of O(1) numbers.
    marginals = jax.nn.softmax(log_alpha + log_beta, axis=-1)
    log_pair = (
        log_alpha[:-1, :, None]
        + natural.pair
        + (natural.one_hot[1:] + log_beta[1:])[:, None, :]
    )
    pair = jnp.exp(log_pair - logsumexp(log_pair, axis=(-2, -1), keepdims=True))
    return ChainCategoricalStats(one_hot=marginals, pair=pair), log_norm


def mean_params(natural: ChainCategoricalStats) -> ChainCategoricalStats:
    """Return μ = ∇A(λ): marginals q(z_t) ∝ α_t β_t and pairwise marginals
    q(z_t = i, z_{t+1} = j) ∝ α_t(i) exp(ψ_t(i, j) + θ_{t+1}(j)) β_{t+1}(j) (forward-backward)."""
    return mean_and_log_normalizer(natural)[0]


def mean_and_log_normalizer(natural: ChainCategoricalStats) -> tuple[ChainCategoricalStats, Array]:
    """Return ``(μ, A(λ))`` from one forward-backward pass: A is the sum of the
    forward pass's log scales, so the entropy A(λ) - <λ, μ> costs no second forward pass."""
    return _over_batch(_mean_and_norm_one, natural)


def _safe_log(p: Array) -> Array:
    positive = p > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, p, 1.0)), -jnp.inf)


def natural_params(mean: ChainCategoricalStats) -> ChainCategoricalStats:
    """Return the canonical λ (A(λ) = 0): θ_t = log μ₁ₜ, ψ_t = log μ₂ₜ - log μ₁ₜ ⊗ 1 - 1 ⊗ log μ₁,ₜ₊₁.

    Valid because a chain factorises as q(z) = Π_t q(z_t) Π_t q(z_t, z_{t+1}) /
    (q(z_t) q(z_{t+1})). Impossible pairs get ψ = -∞.
    """
    log_marg = _safe_log(mean.one_hot)
    log_pair = _safe_log(mean.pair)
    denom = log_marg[..., :-1, :, None] + log_marg[..., 1:, None, :]
    pair = jnp.where(
        mean.pair > 0, log_pair - jnp.where(mean.pair > 0, denom, 0.0), -jnp.inf
    )
    return ChainCategoricalStats(one_hot=log_marg, pair=pair)


def from_usual(
    *,
    initial_probs: ArrayLike | None = None,
    transition_probs: ArrayLike | None = None,
    unary_logits: ArrayLike | None = None,
    pair_logits: ArrayLike | None = None,
    num_steps: int | None = None,
) -> ChainCategoricalStats:
    """Return λ of a Markov chain or of log potentials.

    Markov form (what :func:`to_usual` returns): ``initial_probs`` q(z_1) (..., K)
    and ``transition_probs`` q(z_{t+1} = j | z_t = i) (..., T-1, K, K); a single
    (..., K, K) matrix is shared by ``num_steps`` steps if ``num_steps`` is given.
    Potential form: ``unary_logits`` θ (..., T, K) and ``pair_logits`` ψ (..., T-1, K, K).

    Raises:
        ValueError: unless exactly one complete form is given.

    Example:
        >>> nat = from_usual(initial_probs=jnp.array([0.5, 0.5]),
        ...                  transition_probs=jnp.array([[0.9, 0.1], [0.2, 0.8]]), num_steps=3)
        >>> nat.one_hot.shape, nat.pair.shape
        ((3, 2), (2, 2, 2))
    """
    if unary_logits is not None and pair_logits is not None and initial_probs is None:
        if transition_probs is not None:
            raise ValueError(
                "give either the Markov form or the potential form, not both."
            )
        unary, pair = common.as_floats(unary_logits, pair_logits)
        batch = jnp.broadcast_shapes(unary.shape[:-2], pair.shape[:-3])
        t, k = unary.shape[-2:]
        return ChainCategoricalStats(
            one_hot=jnp.broadcast_to(unary, batch + (t, k)),
            pair=jnp.broadcast_to(pair, batch + (t - 1, k, k)),
        )
    if (
        initial_probs is not None
        and transition_probs is not None
        and unary_logits is None
    ):
        if pair_logits is not None:
            raise ValueError(
                "give either the Markov form or the potential form, not both."
            )
        init, trans = common.as_floats(initial_probs, transition_probs)
        if num_steps is not None:
            trans = jnp.broadcast_to(
                trans[..., None, :, :],
                trans.shape[:-2] + (num_steps - 1,) + trans.shape[-2:],
            )
        batch = jnp.broadcast_shapes(init.shape[:-1], trans.shape[:-3])
        t1, k = trans.shape[-3], trans.shape[-1]
        unary = jnp.concatenate(
            [
                _safe_log(init)[..., None, :],
                jnp.zeros(init.shape[:-1] + (t1, k), init.dtype),
            ],
            axis=-2,
        )
        return ChainCategoricalStats(
            one_hot=jnp.broadcast_to(unary, batch + (t1 + 1, k)),
            pair=jnp.broadcast_to(_safe_log(trans), batch + (t1, k, k)),
        )
    raise ValueError(
        "give either initial_probs and transition_probs (and optionally num_steps), "
        "or unary_logits and pair_logits."
    )


def to_usual(natural: ChainCategoricalStats) -> dict[str, Array]:
    """Return ``{"initial_probs": q(z_1), "transition_probs": q(z_{t+1} | z_t)}``.

    Rows of states with zero marginal probability are set uniform.
    """
    mean = mean_params(natural)
    marg = mean.one_hot[..., :-1, :, None]
    k = mean.one_hot.shape[-1]
    trans = jnp.where(marg > 0, mean.pair / jnp.where(marg > 0, marg, 1.0), 1.0 / k)
    return {"initial_probs": mean.one_hot[..., 0, :], "transition_probs": trans}


def from_numpyro(d: dist.Distribution) -> ChainCategoricalStats:
    """Return λ of a :class:`ChainCategoricalDistribution` (numpyro has no other chain law).

    Raises:
        ModelError: for any other distribution.
    """
    base = common.unwrap(d)
    if not isinstance(base, ChainCategoricalDistribution):
        raise common.not_in_family(d, "ChainCategorical")
    full = tuple(d.batch_shape) + tuple(d.event_shape)
    batch = full[:-1]
    return ChainCategoricalStats(
        *(
            jnp.broadcast_to(a, batch + a.shape[a.ndim - n :])
            for a, n in zip(base.natural, _STATS_NDIM)
        )
    )


def _sample_one(rng_key: PRNGKey, natural: ChainCategoricalStats, num: int) -> Array:
    """Forward filter, backward sample: z_T ~ α_T, z_t | z_{t+1} ∝ α_t(i) exp ψ_t(i, z_{t+1})."""
    log_alpha, _ = _forward(natural)
    key_last, key_rest = jax.random.split(rng_key)
    last = jax.random.categorical(key_last, log_alpha[-1], shape=(num,))

    def step(z_next, inputs):
        key, alpha, pair = inputs
        z = jax.random.categorical(key, alpha[None, :] + pair[:, z_next].T, axis=-1)
        return z, z

    keys = jax.random.split(key_rest, natural.pair.shape[0])
    _, rest = jax.lax.scan(
        step, last, (keys, log_alpha[:-1], natural.pair), reverse=True
    )
    return jnp.concatenate([rest, last[None]]).T  # (num, T)


def sample(
    rng_key: PRNGKey, natural: ChainCategoricalStats, sample_shape: tuple = ()
) -> Array:
    """Draw integer chains of shape ``sample_shape + batch + (T,)`` (forward filter, backward sample)."""
    sample_shape = tuple(sample_shape)
    batch = _batch_shape(natural)
    num = math.prod(sample_shape)
    size = math.prod(batch)
    keys = jax.random.split(rng_key, size)
    keys = keys.reshape(batch + keys.shape[1:])
    fn = lambda args: _sample_one(args[0], args[1], num)
    zs = vmap_over_batch(
        fn, (keys, natural), (keys.ndim - len(batch),) + _STATS_NDIM, batch
    )
    zs = jnp.moveaxis(zs, len(batch), 0)
    return zs.reshape(sample_shape + zs.shape[1:])


def is_valid(natural: ChainCategoricalStats) -> Array:
    """Return A(λ) finite (some path has positive probability) and no +∞/NaN potential.

    The forward pass runs only when needed: every path's log weight lies
    within ±(Σ|θ| + Σ|ψ|), and there are K^T paths, so
    |A(λ)| <= Σ|θ| + Σ|ψ| + T log K. A finite bound (one reduction per
    field, which NaN and ±∞ make non-finite) proves A finite and every
    potential finite without the O(T) sequential recursion.
    """
    length, k = natural.one_hot.shape[-2:]
    bound = (
        jnp.sum(jnp.abs(natural.one_hot), axis=(-2, -1))
        + jnp.sum(jnp.abs(natural.pair), axis=(-3, -2, -1))
        + length * math.log(k)
    )
    bounded = jnp.isfinite(bound)

    def exact(n):
        return _no_nan(n) & jnp.isfinite(log_normalizer(n))

    return jax.lax.cond(jnp.all(bounded), lambda n: bounded, exact, natural)


def _no_nan(natural) -> Array:
    """No NaN and no +∞ potential (-∞ forbids a state or pair), batch shaped (any chain
    Categorical's statistics: the unary field's last two axes are time and state)."""
    batch = natural.one_hot.ndim - 2
    ok = [
        jnp.all(~jnp.isnan(field) & (field < jnp.inf), axis=tuple(range(batch, field.ndim)))
        for field in natural
    ]
    return functools.reduce(jnp.logical_and, ok)


def checked_moments(natural: ChainCategoricalStats) -> tuple[ChainCategoricalStats, Array, Array]:
    """Return ``(μ, A(λ), is_valid(λ))`` from one forward-backward pass: the verdict of
    :func:`is_valid` read off the pass's own A (no separate forward pass, even under ``vmap``)."""
    mean, log_norm = mean_and_log_normalizer(natural)
    return mean, log_norm, _no_nan(natural) & jnp.isfinite(log_norm)


class ChainCategoricalDistribution(dist.Distribution):
    """A numpyro distribution over integer chains (..., T) from chain-Categorical natural parameters.

    ``mean`` and ``variance`` (..., T) are of the integer value z_t per step;
    ``marginals`` (..., T, K) and ``pair_marginals`` (..., T-1, K, K) are the
    mean parameters.
    """

    pytree_data_fields = ("natural",)

    def __init__(self, natural: ChainCategoricalStats, *, validate_args=None):
        self.natural = ChainCategoricalStats(*natural)
        shape = jnp.shape(self.natural.one_hot)
        super().__init__(
            batch_shape=shape[:-2],
            event_shape=shape[-2:-1],
            validate_args=validate_args,
        )

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        k = self.natural.one_hot.shape[-1]
        return constraints.independent(constraints.integer_interval(0, k - 1), 1)

    def sample(self, key, sample_shape=()):
        return sample(key, self.natural, sample_shape)

    def log_prob(self, value):
        k = self.natural.one_hot.shape[-1]
        stats = sufficient_stats(value, k)
        # An unused -inf potential must contribute 0, not -inf * 0 = nan.
        unary = jnp.where(stats.one_hot > 0, self.natural.one_hot * stats.one_hot, 0.0)
        pair = jnp.where(stats.pair > 0, self.natural.pair * stats.pair, 0.0)
        inner = jnp.sum(unary, axis=(-2, -1)) + jnp.sum(pair, axis=(-3, -2, -1))
        return inner - log_normalizer(self.natural)

    @property
    def marginals(self):
        return _compiled_mean_params(self.natural).one_hot

    @property
    def pair_marginals(self):
        return _compiled_mean_params(self.natural).pair

    @property
    def mean(self):
        return _value_moments(self.natural)[0]

    @property
    def variance(self):
        return _value_moments(self.natural)[1]


# Compiled once per shape: eagerly, forward-backward would compile each of its operations.
_compiled_mean_params = jax.jit(mean_params)


@jax.jit
def _value_moments(natural: ChainCategoricalStats) -> tuple[Array, Array]:
    """Mean and variance of the integer value z_t per step."""
    return value_moments(mean_params(natural).one_hot)


def to_numpyro(natural: ChainCategoricalStats) -> ChainCategoricalDistribution:
    """Return :class:`ChainCategoricalDistribution` with event shape (T,)."""
    return ChainCategoricalDistribution(natural)


def _to_value_layout(q, mean: ChainCategoricalStats) -> dict:
    return dict(mean._asdict())


def _example(q) -> ChainCategoricalStats:
    batch, length, k = q.batch_shape, q.shape[q.num_batch], q.num_categories
    return ChainCategoricalStats(
        one_hot=jnp.zeros(batch + (length, k)), pair=jnp.zeros(batch + (length - 1, k, k))
    )


def start_at(natural, value: ArrayLike):
    """Marginals 0.9 on the states ``value`` (0.1 spread over all K), no pair potentials (any
    chain Categorical's statistics: every field after the unary one is a pair potential)."""
    num = natural.one_hot.shape[-1]
    probs = 0.9 * jax.nn.one_hot(jnp.asarray(value).astype(jnp.int32), num) + 0.1 / num
    return type(natural)(jnp.log(probs), *(jnp.zeros_like(field) for field in natural[1:]))


CHAIN_CATEGORICAL = ExpFamily(
    name="ChainCategorical",
    stats_type=ChainCategoricalStats,
    event_ndim=1,
    support=constraints.independent(constraints.nonnegative_integer, 1),
    sufficient_stats=sufficient_stats,
    log_base_measure=log_base_measure,
    expected_log_base_measure=expected_log_base_measure,
    log_normalizer=log_normalizer,
    mean_params=mean_params,
    natural_params=natural_params,
    from_usual=from_usual,
    to_usual=to_usual,
    from_numpyro=from_numpyro,
    to_numpyro=to_numpyro,
    sample=sample,
    is_valid=is_valid,
    batch_shape=_batch_shape,
    kind="chain_categorical",
    layout=Layout(_to_value_layout, elementwise_layout().from_value, _example),
    start_at=start_at,
    random_restart=False,
    index_valued=True,
    chain=True,
    mean_and_log_normalizer=mean_and_log_normalizer,
    checked_moments=checked_moments,
)
"""Discrete chain z_1..z_T in {0..K-1} with unary and pairwise log potentials (an HMM posterior)."""
