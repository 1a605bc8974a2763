"""The Gamma family (shape a, rate b).

    q(x) = Gamma(x | a, b) = bᵃ xᵃ⁻¹ e^{-bx} / Γ(a),   T(x) = (log x, x),
    λ = (a - 1, -b),   μ = (ψ(a) - log b, a / b),   A(λ) = log Γ(a) - a log b,
    h(x) = 1.

.. warning::
    ``b`` is a **rate** (numpyro's ``Gamma(concentration, rate)``), not scipy's
    ``scale = 1 / b``. ``Exponential(rate)`` is ``Gamma(1, rate)`` here.

The inverse map μ → λ solves log a - ψ(a) = log μ₂ - μ₁ with Minka's
initialisation and a fixed number of Newton steps in 1/a (Minka 2002,
"Estimating a Gamma distribution"), so it is jit-safe.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln, polygamma
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.gamma_draws import gamma_draws, restart_log_gamma
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout

NEWTON_STEPS = 4
"""Newton steps in 1/a; from Minka's start 3 already reach float64 conditioning."""


class GammaStats(NamedTuple):
    """T(x) = (log x, x); λ = (a - 1, -b); μ = (ψ(a) - log b, a / b)."""

    log_x: Array
    x: Array


def solve_log_minus_digamma(target: Array, num_steps: int = NEWTON_STEPS) -> Array:
    """Solve log a - ψ(a) = target (> 0) for a > 0, elementwise and jit-safe.

    Newton's method in t = 1/a: f(t) = ψ(1/t) + log t + target is concave and
    decreasing, so from any start after the first step the iterates decrease
    monotonically to the root and stay positive. Minka's start
    a₀ = (3 - s + sqrt((s - 3)² + 24 s)) / (12 s), s = target, is within a few
    percent everywhere.

    Args:
        target: s = log a - ψ(a), positive (the Jensen gap log E[x] - E[log x]).
        num_steps: fixed number of Newton steps (a ``fori_loop``).

    Returns:
        a, the same shape and dtype as ``target``.
    """
    s = target
    a = (3.0 - s + jnp.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    a, _ = jax.lax.fori_loop(0, num_steps, _newton_step, (a, s))
    return a


def _newton_step(_, carry):
    # Module level, so eager calls reuse one compiled loop.
    a, s = carry
    residual = digamma(a) - jnp.log(a) + s
    slope = a * (a * polygamma(1, a) - 1.0)  # a² (ψ'(a) - 1/a) > 0
    return 1.0 / (1.0 / a + residual / slope), s


def _shape_rate(natural: GammaStats) -> tuple[Array, Array]:
    return natural.log_x + 1.0, -natural.x


def sufficient_stats(x: ArrayLike) -> GammaStats:
    """Return T(x) = (log x, x)."""
    (x,) = common.as_floats(x)
    return GammaStats(log_x=jnp.log(x), x=x)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0."""
    (x,) = common.as_floats(x)
    return jnp.zeros_like(x)


def expected_log_base_measure(natural: GammaStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros_like(natural.x)


def log_normalizer(natural: GammaStats) -> Array:
    """Return A(λ) = log Γ(a) - a log b."""
    a, b = _shape_rate(natural)
    return gammaln(a) - a * jnp.log(b)


def mean_params(natural: GammaStats) -> GammaStats:
    """Return μ = (ψ(a) - log b, a / b)."""
    a, b = _shape_rate(natural)
    return GammaStats(log_x=digamma(a) - jnp.log(b), x=a / b)


def natural_params(mean: GammaStats) -> GammaStats:
    """Return λ from μ: solve log a - ψ(a) = log μ₂ - μ₁ (Newton), then b = a / μ₂."""
    a = solve_log_minus_digamma(jnp.log(mean.x) - mean.log_x)
    return GammaStats(log_x=a - 1.0, x=-a / mean.x)


def from_usual(concentration: ArrayLike, rate: ArrayLike) -> GammaStats:
    """Return λ = (a - 1, -b) of Gamma(concentration=a, rate=b).

    Example:
        >>> [float(v) for v in from_usual(2.0, 3.0)]
        [1.0, -3.0]
    """
    a, b = jnp.broadcast_arrays(*common.as_floats(concentration, rate))
    return GammaStats(log_x=a - 1.0, x=-b)


def to_usual(natural: GammaStats) -> dict[str, Array]:
    """Return ``{"concentration": a, "rate": b}``."""
    a, b = _shape_rate(natural)
    return {"concentration": a, "rate": b}


def from_numpyro(d: dist.Distribution) -> GammaStats:
    """Return λ of a numpyro ``Gamma`` (``Chi2`` included) or ``Exponential``."""
    base = common.unwrap(d)
    if isinstance(base, dist.Gamma):
        nat = from_usual(base.concentration, base.rate)
    elif isinstance(base, dist.Exponential):
        nat = from_usual(1.0, base.rate)
    else:
        raise common.not_in_family(d, "Gamma")
    shape = common.target_batch_shape(d, 0)
    return jax.tree.map(lambda v: jnp.broadcast_to(v, shape), nat)


def to_numpyro(natural: GammaStats) -> dist.Gamma:
    """Return ``dist.Gamma(concentration=a, rate=b)``."""
    return dist.Gamma(*_shape_rate(natural))


def sample(rng_key: PRNGKey, natural: GammaStats, sample_shape: tuple = ()) -> Array:
    """Draw x ~ Gamma(a, b), shape ``sample_shape + batch_shape``."""
    a, b = _shape_rate(natural)
    shape = tuple(sample_shape) + jnp.shape(a)
    return gamma_draws(rng_key, a, shape, a.dtype) / b


def restart_draw(rng_key: PRNGKey, natural: GammaStats, sample_shape: tuple = ()) -> Array:
    """A random point for a restart: log-normal with q's mean and variance (cheap to compile)."""
    a, b = _shape_rate(natural)
    return jnp.exp(restart_log_gamma(rng_key, a, tuple(sample_shape) + jnp.shape(a), a.dtype)) / b


def is_valid(natural: GammaStats) -> Array:
    """Return a > 0 and b > 0 (λ₁ > -1, λ₂ < 0), elementwise."""
    a, b = _shape_rate(natural)
    return jnp.isfinite(a) & jnp.isfinite(b) & (a > 0) & (b > 0)


def start_at(natural: GammaStats, value: ArrayLike) -> GammaStats:
    """λ of the Gamma with λ's shape a and mean ``value`` (rate a / value)."""
    a = to_usual(natural)["concentration"]
    return from_usual(a, a / value)


GAMMA = ExpFamily(
    name="Gamma",
    stats_type=GammaStats,
    event_ndim=0,
    support=constraints.positive,
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
    batch_shape=lambda natural: tuple(jnp.shape(natural.x)),
    kind="gamma",
    statistics=((("x", 1), "x"), (("log", 1), "log_x")),
    layout=elementwise_layout(),
    reparameterised=True,
    prior_types=(dist.Gamma, dist.Exponential),
    fixed_support=constraints.positive,
    start_at=start_at,
)
"""Gamma(concentration a, rate b) over positive scalars."""
