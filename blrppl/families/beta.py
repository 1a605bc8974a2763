"""The Beta family on (0, 1).

    q(x) = Beta(x | α, β) = x^{α-1} (1 - x)^{β-1} / B(α, β),
    T(x) = (log x, log(1 - x)),   λ = (α - 1, β - 1),
    μ = (ψ(α) - ψ(α + β), ψ(β) - ψ(α + β)),
    A(λ) = log Γ(α) + log Γ(β) - log Γ(α + β),   h(x) = 1.

The Beta family is the K = 2 Dirichlet on (x, 1 - x); μ → λ reuses the
Dirichlet Newton solver (``dirichlet.solve_dirichlet``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.gamma_draws import log_gamma_draws, restart_log_gamma
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout
from blrppl.families.dirichlet import solve_dirichlet


class BetaStats(NamedTuple):
    """T(x) = (log x, log(1 - x)); λ = (α - 1, β - 1)."""

    log_x: Array
    log1m_x: Array


def _concentrations(natural: BetaStats) -> tuple[Array, Array]:
    return natural.log_x + 1.0, natural.log1m_x + 1.0


def sufficient_stats(x: ArrayLike) -> BetaStats:
    """Return T(x) = (log x, log(1 - x))."""
    (x,) = common.as_floats(x)
    return BetaStats(log_x=jnp.log(x), log1m_x=jnp.log1p(-x))


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0."""
    (x,) = common.as_floats(x)
    return jnp.zeros_like(x)


def expected_log_base_measure(natural: BetaStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros_like(natural.log_x)


def log_normalizer(natural: BetaStats) -> Array:
    """Return A(λ) = log Γ(α) + log Γ(β) - log Γ(α + β)."""
    a, b = _concentrations(natural)
    return gammaln(a) + gammaln(b) - gammaln(a + b)


def mean_params(natural: BetaStats) -> BetaStats:
    """Return μ = (ψ(α) - ψ(α + β), ψ(β) - ψ(α + β))."""
    a, b = _concentrations(natural)
    total = digamma(a + b)
    return BetaStats(log_x=digamma(a) - total, log1m_x=digamma(b) - total)


def natural_params(mean: BetaStats) -> BetaStats:
    """Return λ from μ by the K = 2 Dirichlet Newton solver."""
    alpha = solve_dirichlet(jnp.stack([mean.log_x, mean.log1m_x], axis=-1))
    return BetaStats(log_x=alpha[..., 0] - 1.0, log1m_x=alpha[..., 1] - 1.0)


def from_usual(concentration1: ArrayLike, concentration0: ArrayLike) -> BetaStats:
    """Return λ of numpyro's Beta(concentration1=α, concentration0=β).

    Example:
        >>> [float(v) for v in from_usual(2.0, 3.0)]
        [1.0, 2.0]
    """
    a, b = jnp.broadcast_arrays(*common.as_floats(concentration1, concentration0))
    return BetaStats(log_x=a - 1.0, log1m_x=b - 1.0)


def to_usual(natural: BetaStats) -> dict[str, Array]:
    """Return ``{"concentration1": α, "concentration0": β}``."""
    a, b = _concentrations(natural)
    return {"concentration1": a, "concentration0": b}


def is_standard_uniform(d: dist.Distribution) -> bool:
    """Whether ``d`` is ``Uniform(0, 1)`` (with concrete bounds), i.e. ``Beta(1, 1)``."""
    if not isinstance(d, dist.Uniform):
        return False
    try:
        return bool(np.all(np.asarray(d.low) == 0.0) and np.all(np.asarray(d.high) == 1.0))
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return False


def _accepts(d: dist.Distribution) -> bool:
    return isinstance(d, dist.Beta) or is_standard_uniform(d)


def from_numpyro(d: dist.Distribution) -> BetaStats:
    """Return λ of a numpyro ``Beta``, or of ``Uniform(0, 1)`` (= Beta(1, 1))."""
    base = common.unwrap(d)
    if isinstance(base, dist.Beta):
        nat = from_usual(base.concentration1, base.concentration0)
    elif is_standard_uniform(base):
        nat = from_usual(jnp.ones(jnp.shape(base.low)), jnp.ones(jnp.shape(base.high)))
    else:
        raise common.not_in_family(d, "Beta")
    shape = common.target_batch_shape(d, 0)
    return jax.tree.map(lambda v: jnp.broadcast_to(v, shape), nat)


def to_numpyro(natural: BetaStats) -> dist.Beta:
    """Return ``dist.Beta(α, β)``."""
    return dist.Beta(*_concentrations(natural))


def sample(rng_key: PRNGKey, natural: BetaStats, sample_shape: tuple = ()) -> Array:
    """Draw x ~ Beta(α, β), shape ``sample_shape + batch_shape``."""
    a, b = _concentrations(natural)
    shape = tuple(sample_shape) + jnp.shape(a)
    log_g = log_gamma_draws(rng_key, jnp.stack(jnp.broadcast_arrays(a, b), -1), shape + (2,), a.dtype)  # one call site
    return jnp.exp(log_g[..., 0] - jnp.logaddexp(log_g[..., 0], log_g[..., 1]))


def restart_draw(rng_key: PRNGKey, natural: BetaStats, sample_shape: tuple = ()) -> Array:
    """A random point for a restart: the Beta's two Gamma components drawn log-normal with
    their means and variances, normalised (cheap to compile)."""
    a, b = _concentrations(natural)
    shape = tuple(sample_shape) + jnp.shape(a)
    log_g = restart_log_gamma(rng_key, jnp.stack(jnp.broadcast_arrays(a, b), -1), shape + (2,), a.dtype)
    return jnp.exp(log_g[..., 0] - jnp.logaddexp(log_g[..., 0], log_g[..., 1]))


def is_valid(natural: BetaStats) -> Array:
    """Return α > 0 and β > 0 (λ > -1), elementwise."""
    a, b = _concentrations(natural)
    return jnp.isfinite(a) & jnp.isfinite(b) & (a > 0) & (b > 0)


def start_at(natural: BetaStats, value: ArrayLike) -> BetaStats:
    """λ with mean ``value`` and λ's total concentration α + β."""
    usual = to_usual(natural)
    total = usual["concentration1"] + usual["concentration0"]
    return from_usual(value * total, (1.0 - value) * total)


BETA = ExpFamily(
    name="Beta",
    stats_type=BetaStats,
    event_ndim=0,
    support=constraints.unit_interval,
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
    restart_draw=restart_draw,
    is_valid=is_valid,
    batch_shape=lambda natural: tuple(jnp.shape(natural.log_x)),
    kind="beta",
    statistics=((("log", 1), "log_x"), (("log1m", 1), "log1m_x")),
    layout=elementwise_layout(),
    reparameterised=True,
    prior_types=(dist.Beta, dist.Uniform),
    accepts=_accepts,
    fixed_support=constraints.unit_interval,
    start_at=start_at,
)
"""Beta(concentration1 α, concentration0 β) over (0, 1); the default q of Beta and Uniform(0, 1) priors."""
