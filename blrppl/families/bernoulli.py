"""The Bernoulli family over {0, 1}.

q(x = 1) = p,   T(x) = x,   λ = logit p,   μ = sigmoid(λ) = p,
A(λ) = softplus(λ) = log(1 + e^λ),   h(x) = 1.
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


class BernoulliStats(NamedTuple):
    """T(x) = x; λ = logit p; μ = p."""

    x: Array


def sufficient_stats(x: ArrayLike) -> BernoulliStats:
    """Return T(x) = x as a float."""
    (x,) = common.as_floats(x)
    return BernoulliStats(x=x)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0."""
    (x,) = common.as_floats(x)
    return jnp.zeros_like(x)


def expected_log_base_measure(natural: BernoulliStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros_like(natural.x)


def log_normalizer(natural: BernoulliStats) -> Array:
    """Return A(λ) = softplus(λ)."""
    return jax.nn.softplus(natural.x)


def mean_params(natural: BernoulliStats) -> BernoulliStats:
    """Return μ = sigmoid(λ) = p."""
    return BernoulliStats(x=jax.nn.sigmoid(natural.x))


def natural_params(mean: BernoulliStats) -> BernoulliStats:
    """Return λ = logit μ = log μ - log(1 - μ)."""
    return BernoulliStats(x=jnp.log(mean.x) - jnp.log1p(-mean.x))


def from_usual(
    probs: ArrayLike | None = None, logits: ArrayLike | None = None
) -> BernoulliStats:
    """Return λ = logit p from exactly one of ``probs`` or ``logits``.

    Example:
        >>> from_usual(probs=0.5).x.tolist()
        0.0
    """
    if (probs is None) == (logits is None):
        raise ValueError("give exactly one of probs or logits.")
    if probs is not None:
        (probs,) = common.as_floats(probs)
        return natural_params(BernoulliStats(x=probs))
    (logits,) = common.as_floats(logits)
    return BernoulliStats(x=logits)


def to_usual(natural: BernoulliStats) -> dict[str, Array]:
    """Return ``{"probs": sigmoid(λ)}``."""
    return {"probs": jax.nn.sigmoid(natural.x)}


def from_numpyro(d: dist.Distribution) -> BernoulliStats:
    """Return λ of a numpyro ``Bernoulli`` (probs or logits)."""
    base = common.unwrap(d)
    if not isinstance(base, (dist.BernoulliProbs, dist.BernoulliLogits)):
        raise common.not_in_family(d, "Bernoulli")
    nat = from_usual(logits=base.logits)
    return BernoulliStats(x=jnp.broadcast_to(nat.x, common.target_batch_shape(d, 0)))


def to_numpyro(natural: BernoulliStats) -> dist.BernoulliLogits:
    """Return ``dist.Bernoulli(logits=λ)``."""
    return dist.BernoulliLogits(natural.x)


def sample(
    rng_key: PRNGKey, natural: BernoulliStats, sample_shape: tuple = ()
) -> Array:
    """Draw integer 0/1 values as numpyro does, shape ``sample_shape + batch_shape``."""
    return to_numpyro(natural).sample(rng_key, tuple(sample_shape))


def is_valid(natural: BernoulliStats) -> Array:
    """Return λ finite, elementwise."""
    return jnp.isfinite(natural.x)


def start_at(natural: BernoulliStats, value: ArrayLike) -> BernoulliStats:
    """Probability 0.9 on ``value`` (0 or 1)."""
    return BernoulliStats(x=jnp.where(jnp.asarray(value) > 0.5, 1.0, -1.0) * jnp.log(9.0))


def support_probs(q, mean: BernoulliStats) -> Array:
    """The probabilities (1 - p, p) of the support (0, 1), shaped ``q.shape + (2,)``."""
    return jnp.stack([1.0 - mean.x, mean.x], axis=-1)


BERNOULLI = ExpFamily(
    name="Bernoulli",
    stats_type=BernoulliStats,
    event_ndim=0,
    support=constraints.boolean,
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
    batch_shape=lambda natural: tuple(jnp.shape(natural.x)),
    kind="bernoulli",
    layout=elementwise_layout(),
    prior_types=(dist.BernoulliProbs, dist.BernoulliLogits),
    start_at=start_at,
    support_probs=support_probs,
)
"""Bernoulli over {0, 1}; λ is the logit."""
