"""The Categorical family over {0, ..., K-1}.

    q(x = k) = π_k,   T(x) = one_hot(x) ∈ {0, 1}^K,   λ = log π + c,
    μ = softmax(λ) = π,   A(λ) = log Σₖ exp λ_k,   h(x) = 1.

The parametrisation is overcomplete: λ and λ + c·1 are the same distribution, so
only K - 1 natural parameters are free and the Fisher matrix ∇²A is singular
along 1 (positive definite on any K - 1 coordinates). ``from_usual``,
``from_numpyro`` and ``natural_params`` return the representative with A(λ) = 0,
λ = log π.

.. warning::
    A value x is an integer category (event_ndim 0, as in numpyro), but its
    statistic has a trailing K axis, so ``sufficient_stats`` needs
    ``num_categories``. A category with π_k = 0 has λ_k = -∞, and then
    <λ, μ> (so the entropy and the KL) is NaN from 0 · ∞; keep π_k > 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout


class CategoricalStats(NamedTuple):
    """T(x) = one_hot(x), shape (..., K); λ = log π (+ const); μ = π."""

    one_hot: Array


def sufficient_stats(
    x: ArrayLike, num_categories: int | None = None
) -> CategoricalStats:
    """Return T(x) = one_hot(x, K) for integer categories ``x``.

    Args:
        x: integer categories, any shape.
        num_categories: K, required (the value alone does not determine it).

    Raises:
        TypeError: if ``num_categories`` is missing.
    """
    if num_categories is None:
        raise TypeError("Categorical sufficient_stats needs num_categories=K.")
    return CategoricalStats(
        one_hot=jax.nn.one_hot(x, num_categories, dtype=jnp.result_type(float))
    )


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0, shaped like ``x``."""
    return jnp.zeros(jnp.shape(x), jnp.result_type(float))


def expected_log_base_measure(natural: CategoricalStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros(natural.one_hot.shape[:-1], natural.one_hot.dtype)


def log_normalizer(natural: CategoricalStats) -> Array:
    """Return A(λ) = log Σₖ exp λ_k."""
    return jax.nn.logsumexp(natural.one_hot, axis=-1)


def mean_and_log_normalizer(natural: CategoricalStats) -> tuple[CategoricalStats, Array]:
    """``(μ, A(λ))`` from one log-sum-exp: μ = exp(λ - A(λ))."""
    log_norm = jax.nn.logsumexp(natural.one_hot, axis=-1)
    return CategoricalStats(one_hot=jnp.exp(natural.one_hot - log_norm[..., None])), log_norm


def mean_params(natural: CategoricalStats) -> CategoricalStats:
    """Return μ = softmax(λ) = π."""
    return CategoricalStats(one_hot=jax.nn.softmax(natural.one_hot, axis=-1))


def natural_params(mean: CategoricalStats) -> CategoricalStats:
    """Return λ = log μ (the representative with A(λ) = 0 when Σμ = 1)."""
    return CategoricalStats(one_hot=jnp.log(mean.one_hot))


def from_usual(
    probs: ArrayLike | None = None, logits: ArrayLike | None = None
) -> CategoricalStats:
    """Return λ = log π from exactly one of ``probs`` or (unnormalised) ``logits``.

    Example:
        >>> nat = from_usual(probs=jnp.array([0.25, 0.25, 0.5]))
        >>> [round(float(v), 4) for v in nat.one_hot]
        [-1.3863, -1.3863, -0.6931]
    """
    if (probs is None) == (logits is None):
        raise ValueError("give exactly one of probs or logits.")
    if probs is not None:
        (probs,) = common.as_floats(probs)
        return CategoricalStats(one_hot=jnp.log(probs / probs.sum(-1, keepdims=True)))
    (logits,) = common.as_floats(logits)
    return CategoricalStats(one_hot=jax.nn.log_softmax(logits, axis=-1))


def to_usual(natural: CategoricalStats) -> dict[str, Array]:
    """Return ``{"probs": softmax(λ)}``."""
    return {"probs": jax.nn.softmax(natural.one_hot, axis=-1)}


def from_numpyro(d: dist.Distribution) -> CategoricalStats:
    """Return λ of a numpyro ``Categorical`` (probs or logits)."""
    base = common.unwrap(d)
    if not isinstance(base, (dist.CategoricalProbs, dist.CategoricalLogits)):
        raise common.not_in_family(d, "Categorical")
    nat = from_usual(logits=base.logits)
    shape = common.target_batch_shape(d, 0) + nat.one_hot.shape[-1:]
    return CategoricalStats(one_hot=jnp.broadcast_to(nat.one_hot, shape))


class CategoricalQ(dist.CategoricalLogits):
    """``dist.Categorical(logits=λ)`` with the moments of its integer value.

    numpyro's ``Categorical.mean`` and ``.variance`` are NaN; here they are
    Σ_k k π_k and Σ_k k² π_k - mean², as for any other q (``.probs`` gives π).
    """

    @property
    def mean(self):
        return value_moments(self.probs)[0]

    @property
    def variance(self):
        return value_moments(self.probs)[1]


def value_moments(probs: Array) -> tuple[Array, Array]:
    """Mean and variance of an integer value over 0..K-1 with probabilities ``probs`` (last axis)."""
    values = jnp.arange(probs.shape[-1], dtype=probs.dtype)
    mean = probs @ values
    return mean, probs @ values**2 - mean**2


def to_numpyro(natural: CategoricalStats) -> CategoricalQ:
    """Return ``dist.Categorical(logits=λ)`` (:class:`CategoricalQ`: with finite moments)."""
    return CategoricalQ(natural.one_hot)


def sample(
    rng_key: PRNGKey, natural: CategoricalStats, sample_shape: tuple = ()
) -> Array:
    """Draw integer categories, shape ``sample_shape + batch_shape``."""
    shape = tuple(sample_shape) + natural.one_hot.shape[:-1]
    return jax.random.categorical(rng_key, natural.one_hot, axis=-1, shape=shape)


def is_valid(natural: CategoricalStats) -> Array:
    """Return no λ_k is NaN or +∞ and at least one is finite, batch shaped."""
    lam = natural.one_hot
    allowed = jnp.all(~jnp.isnan(lam) & (lam < jnp.inf), axis=-1)
    return allowed & jnp.any(jnp.isfinite(lam), axis=-1)


def start_at(natural: CategoricalStats, value: ArrayLike) -> CategoricalStats:
    """Probabilities 0.9 on category ``value`` and 0.1 spread over all K."""
    num = natural.one_hot.shape[-1]
    probs = 0.9 * jax.nn.one_hot(jnp.asarray(value).astype(jnp.int32), num) + 0.1 / num
    return CategoricalStats(one_hot=jnp.log(probs))


def support_probs(q, mean: CategoricalStats) -> Array:
    """The probabilities π of the support 0..K-1, shaped ``q.shape + (K,)``."""
    return mean.one_hot


CATEGORICAL = ExpFamily(
    name="Categorical",
    stats_type=CategoricalStats,
    event_ndim=0,
    support=constraints.nonnegative_integer,
    sufficient_stats=sufficient_stats,
    log_base_measure=log_base_measure,
    expected_log_base_measure=expected_log_base_measure,
    log_normalizer=log_normalizer,
    mean_params=mean_params,
    mean_and_log_normalizer=mean_and_log_normalizer,
    natural_params=natural_params,
    from_usual=from_usual,
    to_usual=to_usual,
    from_numpyro=from_numpyro,
    to_numpyro=to_numpyro,
    sample=sample,
    is_valid=is_valid,
    batch_shape=lambda natural: tuple(natural.one_hot.shape[:-1]),
    kind="categorical",
    statistics=((("one_hot", 1), "one_hot"),),
    layout=elementwise_layout(),
    prior_types=(dist.CategoricalProbs, dist.CategoricalLogits),
    start_at=start_at,
    random_restart=False,
    index_valued=True,
    support_probs=support_probs,
)
"""Categorical over {0, ..., K-1}; λ shaped (..., K)."""
