"""The inverse-Gamma family (shape a, scale b).

    q(x) = InvGamma(x | a, b) = bᵃ x^{-a-1} e^{-b/x} / Γ(a),   T(x) = (log x, 1/x),
    λ = (-(a + 1), -b),   μ = (log b - ψ(a), a / b),   A(λ) = log Γ(a) - a log b,
    h(x) = 1.

.. warning::
    numpyro calls ``b`` the ``rate`` of ``InverseGamma(concentration, rate)``; it is
    the rate of the Gamma variable 1/x, i.e. the scale of x (scipy's ``scale``).

The inverse map μ → λ solves log a - ψ(a) = μ₁ + log μ₂ with the Gamma family's
Newton solver (``gamma.solve_log_minus_digamma``), then b = a / μ₂.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.gamma_draws import log_gamma_draws, restart_log_gamma
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout
from blrppl.families.gamma import solve_log_minus_digamma


class InverseGammaStats(NamedTuple):
    """T(x) = (log x, 1/x); λ = (-(a + 1), -b); μ = (log b - ψ(a), a / b)."""

    log_x: Array
    inv_x: Array


def _shape_scale(natural: InverseGammaStats) -> tuple[Array, Array]:
    return -natural.log_x - 1.0, -natural.inv_x


def sufficient_stats(x: ArrayLike) -> InverseGammaStats:
    """Return T(x) = (log x, 1/x)."""
    (x,) = common.as_floats(x)
    return InverseGammaStats(log_x=jnp.log(x), inv_x=1.0 / x)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0."""
    (x,) = common.as_floats(x)
    return jnp.zeros_like(x)


def expected_log_base_measure(natural: InverseGammaStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros_like(natural.inv_x)


def log_normalizer(natural: InverseGammaStats) -> Array:
    """Return A(λ) = log Γ(a) - a log b."""
    a, b = _shape_scale(natural)
    return gammaln(a) - a * jnp.log(b)


def mean_params(natural: InverseGammaStats) -> InverseGammaStats:
    """Return μ = (log b - ψ(a), a / b)."""
    a, b = _shape_scale(natural)
    return InverseGammaStats(log_x=jnp.log(b) - digamma(a), inv_x=a / b)


def natural_params(mean: InverseGammaStats) -> InverseGammaStats:
    """Return λ from μ: solve log a - ψ(a) = μ₁ + log μ₂ (Newton), then b = a / μ₂."""
    a = solve_log_minus_digamma(mean.log_x + jnp.log(mean.inv_x))
    return InverseGammaStats(log_x=-a - 1.0, inv_x=-a / mean.inv_x)


def from_usual(concentration: ArrayLike, rate: ArrayLike) -> InverseGammaStats:
    """Return λ = (-(a + 1), -b) of numpyro's InverseGamma(concentration=a, rate=b).

    Example:
        >>> [float(v) for v in from_usual(2.0, 3.0)]
        [-3.0, -3.0]
    """
    a, b = jnp.broadcast_arrays(*common.as_floats(concentration, rate))
    return InverseGammaStats(log_x=-a - 1.0, inv_x=-b)


def to_usual(natural: InverseGammaStats) -> dict[str, Array]:
    """Return ``{"concentration": a, "rate": b}`` (numpyro's names; b scales x)."""
    a, b = _shape_scale(natural)
    return {"concentration": a, "rate": b}


def from_numpyro(d: dist.Distribution) -> InverseGammaStats:
    """Return λ of a numpyro ``InverseGamma``."""
    base = common.unwrap(d)
    if not isinstance(base, dist.InverseGamma):
        raise common.not_in_family(d, "InverseGamma")
    nat = from_usual(base.concentration, base.rate)
    shape = common.target_batch_shape(d, 0)
    return jax.tree.map(lambda v: jnp.broadcast_to(v, shape), nat)


def to_numpyro(natural: InverseGammaStats) -> dist.InverseGamma:
    """Return ``dist.InverseGamma(concentration=a, rate=b)``."""
    return dist.InverseGamma(*_shape_scale(natural))


def sample(
    rng_key: PRNGKey, natural: InverseGammaStats, sample_shape: tuple = ()
) -> Array:
    """Draw x = b / g with g ~ Gamma(a, 1), shape ``sample_shape + batch_shape``."""
    a, b = _shape_scale(natural)
    shape = tuple(sample_shape) + jnp.shape(a)
    return b * jnp.exp(-log_gamma_draws(rng_key, a, shape, a.dtype))


def restart_draw(rng_key: PRNGKey, natural: InverseGammaStats, sample_shape: tuple = ()) -> Array:
    """A random point for a restart: b / g with g log-normal with the mean and variance of
    Gamma(a, 1) (cheap to compile)."""
    a, b = _shape_scale(natural)
    return b * jnp.exp(-restart_log_gamma(rng_key, a, tuple(sample_shape) + jnp.shape(a), a.dtype))


def is_valid(natural: InverseGammaStats) -> Array:
    """Return a > 0 and b > 0 (λ₁ < -1, λ₂ < 0), elementwise."""
    a, b = _shape_scale(natural)
    return jnp.isfinite(a) & jnp.isfinite(b) & (a > 0) & (b > 0)


def start_at(natural: InverseGammaStats, value: ArrayLike) -> InverseGammaStats:
    """λ with mean ``value``: shape max(a, 2) (a finite mean), scale value (a - 1)."""
    a = jnp.maximum(to_usual(natural)["concentration"], 2.0)
    return from_usual(a, value * (a - 1.0))


INVERSE_GAMMA = ExpFamily(
    name="InverseGamma",
    stats_type=InverseGammaStats,
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
    batch_shape=lambda natural: tuple(jnp.shape(natural.inv_x)),
    kind="inverse_gamma",
    statistics=((("x", -1), "inv_x"), (("log", 1), "log_x")),
    layout=elementwise_layout(),
    reparameterised=True,
    prior_types=(dist.InverseGamma,),
    fixed_support=constraints.positive,
    start_at=start_at,
)
"""InverseGamma(concentration a, scale b) over positive scalars."""
