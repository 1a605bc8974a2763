"""The univariate Normal family and its diagonal (event) version.

    q(x) = N(x | m, v),   T(x) = (x, x²),   λ = (m / v, -1 / (2v)),
    μ = (m, m² + v),       A(λ) = -λ₁² / (4λ₂) + ½ log(-π / λ₂),   h(x) = 1.

``NORMAL`` has scalar events (any batch shape); ``DIAGONAL_NORMAL`` has the same
statistics with one event dimension, a mean-field Gaussian over a vector
(numpyro's ``Normal(loc, scale).to_event(1)``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.layout import Layout


class NormalStats(NamedTuple):
    """T(x) = (x, x²); also λ = (m / v, -1 / (2v)) and μ = (m, m² + v)."""

    x: Array
    x_sq: Array


def _loc_var(natural: NormalStats) -> tuple[Array, Array]:
    var = -0.5 / natural.x_sq
    return natural.x * var, var


def sufficient_stats(x: ArrayLike) -> NormalStats:
    """Return T(x) = (x, x²)."""
    (x,) = common.as_floats(x)
    return NormalStats(x=x, x_sq=x**2)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0 (A absorbs the constant)."""
    (x,) = common.as_floats(x)
    return jnp.zeros_like(x)


def expected_log_base_measure(natural: NormalStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros_like(natural.x)


def log_normalizer(natural: NormalStats) -> Array:
    """Return A(λ) = -λ₁² / (4λ₂) + ½ log(-π / λ₂), elementwise."""
    return -(natural.x**2) / (4.0 * natural.x_sq) + 0.5 * jnp.log(
        -math.pi / natural.x_sq
    )


def mean_params(natural: NormalStats) -> NormalStats:
    """Return μ = ∇A(λ) = (m, m² + v)."""
    loc, var = _loc_var(natural)
    return NormalStats(x=loc, x_sq=loc**2 + var)


def natural_params(mean: NormalStats) -> NormalStats:
    """Return λ = (m / v, -1 / (2v)) with m = μ₁, v = μ₂ - μ₁²."""
    var = mean.x_sq - mean.x**2
    return NormalStats(x=mean.x / var, x_sq=-0.5 / var)


def from_usual(loc: ArrayLike, scale: ArrayLike) -> NormalStats:
    """Return λ of N(loc, scale²), broadcast to a common shape.

    Example:
        >>> [float(v) for v in from_usual(1.0, 2.0)]
        [0.25, -0.125]
    """
    loc, scale = common.as_floats(loc, scale)
    loc, scale = jnp.broadcast_arrays(loc, scale)
    var = scale**2
    return NormalStats(x=loc / var, x_sq=-0.5 / var)


def to_usual(natural: NormalStats) -> dict[str, Array]:
    """Return ``{"loc": m, "scale": sqrt(v)}``."""
    loc, var = _loc_var(natural)
    return {"loc": loc, "scale": jnp.sqrt(var)}


def _normal_params(d: dist.Distribution, family: str) -> tuple[Array, Array]:
    base = common.unwrap(d)
    if not isinstance(base, dist.Normal):
        raise common.not_in_family(d, family)
    return base.loc, base.scale


def from_numpyro(d: dist.Distribution) -> NormalStats:
    """Return λ of a numpyro ``Normal`` (possibly expanded, masked or ``to_event``).

    The result has the shape of one draw, ``batch_shape + event_shape``.
    """
    loc, scale = _normal_params(d, "Normal")
    shape = common.target_batch_shape(d, 0)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, shape), from_usual(loc, scale))


def to_numpyro(natural: NormalStats) -> dist.Normal:
    """Return ``dist.Normal(m, sqrt(v))``."""
    return dist.Normal(**to_usual(natural))


def sample(rng_key: PRNGKey, natural: NormalStats, sample_shape: tuple = ()) -> Array:
    """Draw x = m + sqrt(v) ε, shape ``sample_shape + batch_shape``."""
    loc, var = _loc_var(natural)
    shape = tuple(sample_shape) + jnp.shape(loc)
    eps = jax.random.normal(rng_key, shape, dtype=loc.dtype)
    return loc + jnp.sqrt(var) * eps


def is_valid(natural: NormalStats) -> Array:
    """Return λ₂ < 0 and both parameters finite, elementwise."""
    finite = jnp.isfinite(natural.x) & jnp.isfinite(natural.x_sq)
    return finite & (natural.x_sq < 0)


# Diagonal Normal: the same statistics with one event dimension (d,).


def _diagonal_log_base_measure(x: ArrayLike) -> Array:
    (x,) = common.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-1], x.dtype)


def _diagonal_from_numpyro(d: dist.Distribution) -> NormalStats:
    """Return λ of a numpyro ``Normal`` with at least one value dimension."""
    loc, scale = _normal_params(d, "DiagonalNormal")
    common.target_batch_shape(d, 1)  # Raises for scalar-valued distributions.
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, shape), from_usual(loc, scale))


def _diagonal_is_valid(natural: NormalStats) -> Array:
    return jnp.all(is_valid(natural), axis=-1)


def improved_step(natural: NormalStats, target: NormalStats, rho: ArrayLike) -> NormalStats:
    """The improved BLR step of Lin, Schmidt & Khan (2020), elementwise.

    With s = -2 λ₂ the current precision, ŝ that of the target λ̂ (possibly
    negative) and g = ŝ - s, m = λ₁ / s::

        s_new = (1 - ρ) s + ρ ŝ + (ρ² / 2) g² / s          (positive)
        λ_new = (s_new m + ρ (λ̂₁ - ŝ m), -s_new / 2)

    See :func:`blrppl.families.gaussian_step.positive_definite_step`.
    """
    rho = jnp.asarray(rho, dtype=jnp.result_type(natural.x))
    s_old, s_target = -2.0 * natural.x_sq, -2.0 * target.x_sq
    gap = s_target - s_old
    loc = natural.x / s_old
    s_new = (1.0 - rho) * s_old + rho * s_target + 0.5 * rho**2 * gap**2 / s_old
    return NormalStats(x=s_new * loc + rho * (target.x - s_target * loc), x_sq=-0.5 * s_new)


def safe_step(natural: NormalStats, target: NormalStats, rho: ArrayLike) -> NormalStats:
    """Eq. 58 where it stays a valid Gaussian, :func:`improved_step` elsewhere (no clipping)."""
    plain = jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58
    valid = is_valid(plain)
    improved = improved_step(natural, target, rho)
    return jax.tree.map(lambda p, i: jnp.where(valid, p, i), plain, improved)


def start_at(natural: NormalStats, value: ArrayLike) -> NormalStats:
    """λ centred at ``value`` with λ's variance."""
    return natural._replace(x=-2.0 * natural.x_sq * value)


def _to_value_layout(q, mean: NormalStats) -> dict:
    return {"x": jnp.reshape(mean.x, q.shape), "xx": jnp.reshape(mean.x_sq, q.shape)}


def _from_value_layout(q, grads: dict) -> NormalStats:
    return NormalStats(x=jnp.reshape(grads["x"], q.shape), x_sq=jnp.reshape(grads["xx"], q.shape))


def _example(q) -> NormalStats:
    return NormalStats(x=jnp.zeros(q.shape), x_sq=jnp.full(q.shape, -0.5))


LAYOUT = Layout(_to_value_layout, _from_value_layout, _example)
"""Independent scalar Gaussians, one per element of the value (value layout = family layout)."""


NORMAL = ExpFamily(
    name="Normal",
    stats_type=NormalStats,
    event_ndim=0,
    support=constraints.real,
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
    kind="gaussian",
    statistics=((("x", 1), "x"),),
    layout=LAYOUT,
    reparameterised=True,
    gaussian=True,
    prior_types=(dist.Normal,),
    start_at=start_at,
    safe_step=safe_step,
)
"""Normal(loc, scale) over scalars; any batch shape."""


DIAGONAL_NORMAL = ExpFamily(
    name="DiagonalNormal",
    stats_type=NormalStats,
    event_ndim=1,
    support=constraints.real_vector,
    sufficient_stats=sufficient_stats,
    log_base_measure=_diagonal_log_base_measure,
    expected_log_base_measure=lambda natural: jnp.zeros_like(natural.x[..., 0]),
    log_normalizer=lambda natural: jnp.sum(log_normalizer(natural), axis=-1),
    mean_params=mean_params,
    natural_params=natural_params,
    from_usual=from_usual,
    to_usual=to_usual,
    from_numpyro=_diagonal_from_numpyro,
    to_numpyro=lambda natural: dist.Normal(**to_usual(natural)).to_event(1),
    sample=sample,
    is_valid=_diagonal_is_valid,
    batch_shape=lambda natural: tuple(jnp.shape(natural.x)[:-1]),
    kind="gaussian",
    statistics=((("x", 1), "x"),),
    layout=LAYOUT,
    reparameterised=True,
    gaussian=True,
    start_at=start_at,
    safe_step=safe_step,
)
"""Mean-field Normal over vectors, ``Normal(loc, scale).to_event(1)``; λ is (..., d)."""
