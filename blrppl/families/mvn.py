"""The full-covariance multivariate Normal family.

    q(x) = N(x | m, Σ),  Λ = Σ⁻¹,   T(x) = (x, x xᵀ),   λ = (Λm, -Λ/2),
    μ = (m, Σ + m mᵀ),
    A(λ) = ½ λ₁ᵀ Λ⁻¹ λ₁ - ½ log|Λ| + (d/2) log 2π,   h(x) = 1,

with Λ = -(λ₂ + λ₂ᵀ), so only the symmetric part of λ₂ matters and ∇_{λ₂}A is
symmetric. Every formula goes through one Cholesky factor; no explicit inverse of
an unfactorised matrix is formed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.linalg import cho_solve, solve_triangular
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.layout import Layout


class MVNStats(NamedTuple):
    """T(x) = (x, x xᵀ), shapes (..., d) and (..., d, d).

    λ = (Λm, -Λ/2) and μ = (m, Σ + m mᵀ) have the same fields and shapes.
    """

    x: Array
    xxT: Array


def _precision(natural: MVNStats) -> Array:
    return -(natural.xxT + jnp.swapaxes(natural.xxT, -1, -2))


def _precision_chol(natural: MVNStats) -> tuple[Array, Array]:
    """Return (lower Cholesky factor of Λ, λ₁ broadcast to its batch shape)."""
    chol = jnp.linalg.cholesky(_precision(natural))
    eta = jnp.broadcast_to(natural.x, chol.shape[:-1])
    return chol, eta


def _loc_cov(natural: MVNStats) -> tuple[Array, Array]:
    chol, eta = _precision_chol(natural)
    cov = common.cholesky_inverse(chol)
    loc = jnp.einsum("...ij,...j->...i", cov, eta)
    return loc, cov


def sufficient_stats(x: ArrayLike) -> MVNStats:
    """Return T(x) = (x, x xᵀ)."""
    (x,) = common.as_floats(x)
    return MVNStats(x=x, xxT=common.outer(x))


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0, shaped like the batch of ``x``."""
    (x,) = common.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-1], x.dtype)


def expected_log_base_measure(natural: MVNStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros(jnp.shape(natural.x)[:-1], natural.x.dtype)


def log_normalizer(natural: MVNStats) -> Array:
    """Return A(λ) = ½ |L⁻¹λ₁|² - Σᵢ log Lᵢᵢ + (d/2) log 2π with Λ = L Lᵀ."""
    chol, eta = _precision_chol(natural)
    whitened = solve_triangular(chol, eta[..., None], lower=True)[..., 0]
    d = eta.shape[-1]
    return (
        0.5 * jnp.sum(whitened**2, axis=-1)
        - 0.5 * common.cholesky_log_det(chol)
        + 0.5 * d * math.log(2 * math.pi)
    )


def mean_params(natural: MVNStats) -> MVNStats:
    """Return μ = ∇A(λ) = (m, Σ + m mᵀ), Σ = Λ⁻¹, m = Σλ₁."""
    loc, cov = _loc_cov(natural)
    return MVNStats(x=loc, xxT=cov + common.outer(loc))


def natural_params(mean: MVNStats) -> MVNStats:
    """Return λ = (Λm, -Λ/2) with m = μ₁, Σ = μ₂ - μ₁μ₁ᵀ (symmetrised), Λ = Σ⁻¹."""
    cov = common.symmetrize(mean.xxT - common.outer(mean.x))
    precision = common.cholesky_inverse(jnp.linalg.cholesky(cov))
    return _from_loc_precision(mean.x, precision)


def _from_loc_precision(loc: Array, precision: Array) -> MVNStats:
    precision = common.symmetrize(precision)
    loc = jnp.broadcast_to(loc, precision.shape[:-1])
    return MVNStats(
        x=jnp.einsum("...ij,...j->...i", precision, loc), xxT=-0.5 * precision
    )


def from_usual(
    loc: ArrayLike,
    covariance_matrix: ArrayLike | None = None,
    *,
    precision_matrix: ArrayLike | None = None,
    scale_tril: ArrayLike | None = None,
) -> MVNStats:
    """Return λ of N(loc, Σ) from exactly one of Σ, Λ = Σ⁻¹ or chol(Σ).

    Raises:
        ValueError: if not exactly one matrix argument is given.

    Example:
        >>> nat = from_usual(jnp.zeros(2), precision_matrix=2.0 * jnp.eye(2))
        >>> (nat.xxT + 0.0).tolist()
        [[-1.0, 0.0], [0.0, -1.0]]
    """
    given = [m is not None for m in (covariance_matrix, precision_matrix, scale_tril)]
    if sum(given) != 1:
        raise ValueError(
            "give exactly one of covariance_matrix, precision_matrix or scale_tril."
        )
    matrix = next(
        m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None
    )
    loc, matrix = common.as_floats(loc, matrix)
    if precision_matrix is not None:
        precision = matrix
    elif scale_tril is not None:
        precision = common.cholesky_inverse(jnp.tril(matrix))
    else:
        precision = common.cholesky_inverse(
            jnp.linalg.cholesky(common.symmetrize(matrix))
        )
    batch = jnp.broadcast_shapes(loc.shape[:-1], precision.shape[:-2])
    d = precision.shape[-1]
    precision = jnp.broadcast_to(precision, batch + (d, d))
    return _from_loc_precision(jnp.broadcast_to(loc, batch + (d,)), precision)


def to_usual(natural: MVNStats) -> dict[str, Array]:
    """Return ``{"loc": m, "covariance_matrix": Σ}``."""
    loc, cov = _loc_cov(natural)
    return {"loc": loc, "covariance_matrix": cov}


def from_numpyro(d: dist.Distribution) -> MVNStats:
    """Return λ of a numpyro ``MultivariateNormal``, or of a ``Normal`` over vectors.

    A ``Normal`` (usually ``Normal(...).to_event(1)``) is read as a Gaussian over
    its last dimension with diagonal precision.
    """
    base = common.unwrap(d)
    batch = common.target_batch_shape(d, 1)
    if isinstance(base, dist.MultivariateNormal):
        nat = from_usual(base.loc, scale_tril=base.scale_tril)
    elif isinstance(base, dist.Normal):
        loc, scale = common.as_floats(base.loc, base.scale)
        shape = tuple(d.batch_shape) + tuple(d.event_shape)
        precision = jnp.broadcast_to(scale**-2, shape)
        eye = jnp.eye(shape[-1], dtype=precision.dtype)
        nat = _from_loc_precision(
            jnp.broadcast_to(loc, shape), precision[..., None] * eye
        )
    else:
        raise common.not_in_family(d, "MultivariateNormal")
    dim = nat.x.shape[-1]
    return MVNStats(
        x=jnp.broadcast_to(nat.x, batch + (dim,)),
        xxT=jnp.broadcast_to(nat.xxT, batch + (dim, dim)),
    )


def to_numpyro(natural: MVNStats) -> dist.MultivariateNormal:
    """Return ``dist.MultivariateNormal(m, scale_tril=chol(Σ))``."""
    loc, cov = _loc_cov(natural)
    return dist.MultivariateNormal(loc, scale_tril=jnp.linalg.cholesky(cov))


def sample(rng_key: PRNGKey, natural: MVNStats, sample_shape: tuple = ()) -> Array:
    """Draw x = m + L⁻ᵀ ε with Λ = L Lᵀ, shape ``sample_shape + batch + (d,)``
    (one triangular solve per block, the draws its columns: :func:`common.solve_draws`)."""
    chol, eta = _precision_chol(natural)
    loc = jnp.einsum("...ij,...j->...i", common.cholesky_inverse(chol), eta)
    eps = jax.random.normal(rng_key, tuple(sample_shape) + loc.shape, dtype=loc.dtype)
    return loc + common.solve_draws(chol, eps)


def is_valid(natural: MVNStats) -> Array:
    """Return Λ = -(λ₂ + λ₂ᵀ) positive definite and λ₁ finite, batch shaped."""
    finite = jnp.all(jnp.isfinite(natural.x), axis=-1)
    return finite & common.is_positive_definite(_precision(natural))


def improved_step(natural: MVNStats, target: MVNStats, rho: ArrayLike) -> MVNStats:
    """The improved BLR step of Lin, Schmidt & Khan (2020) for full Gaussians.

    With S = Λ the current precision, Ŝ the target's (possibly indefinite),
    G = Ŝ - S and m = S⁻¹ λ₁::

        S_new = (1 - ρ) S + ρ Ŝ + (ρ² / 2) G S⁻¹ G            (positive definite)
        m_new = m + ρ S_new⁻¹ (λ̂₁ - Ŝ m)                      (Khan & Rue, Eq. 12)

    See :func:`blrppl.families.gaussian_step.positive_definite_step`.
    """
    rho = jnp.asarray(rho, dtype=jnp.result_type(natural.x))
    s_old, s_target = _precision(natural), _precision(target)
    gap = s_target - s_old
    chol = jnp.linalg.cholesky(common.symmetrize(s_old))
    loc = cho_solve((chol, True), natural.x[..., None])[..., 0]
    whitened = solve_triangular(chol, gap, lower=True)  # L⁻¹ G
    correction = jnp.swapaxes(whitened, -1, -2) @ whitened  # G S⁻¹ G
    s_new = common.symmetrize((1.0 - rho) * s_old + rho * s_target + 0.5 * rho**2 * correction)
    newton = target.x - jnp.einsum("...ij,...j->...i", s_target, loc)
    eta = jnp.einsum("...ij,...j->...i", s_new, loc) + rho * newton
    return MVNStats(x=eta, xxT=-0.5 * s_new)


def safe_step(natural: MVNStats, target: MVNStats, rho: ArrayLike) -> MVNStats:
    """Eq. 58 for every block where it stays valid, :func:`improved_step` elsewhere."""
    plain = jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58
    valid = is_valid(plain)
    improved = improved_step(natural, target, rho)
    return MVNStats(
        x=jnp.where(valid[..., None], plain.x, improved.x),
        xxT=jnp.where(valid[..., None, None], plain.xxT, improved.xxT),
    )


def start_at(natural: MVNStats, value: ArrayLike) -> MVNStats:
    """λ centred at ``value`` (shape batch + (d,)) with λ's precision."""
    return natural._replace(x=-2.0 * jnp.einsum("...ij,...j->...i", natural.xxT, value))


def _to_value_layout(q, mean: MVNStats) -> dict:
    return {"x": jnp.reshape(mean.x, q.shape), "xx": jnp.reshape(mean.xxT, q.shape + q.block_shape)}


def _from_value_layout(q, grads: dict) -> MVNStats:
    d = math.prod(q.block_shape)
    xxT = jnp.reshape(grads["xx"], q.batch_shape + (d, d))
    return MVNStats(x=jnp.reshape(grads["x"], q.batch_shape + (d,)), xxT=common.symmetrize(xxT))


def _example(q) -> MVNStats:
    d = math.prod(q.block_shape)
    eye = jnp.broadcast_to(jnp.eye(d), q.batch_shape + (d, d))
    return MVNStats(x=jnp.zeros(q.batch_shape + (d,)), xxT=-0.5 * eye)


LAYOUT = Layout(_to_value_layout, _from_value_layout, _example)
"""One full-covariance block over the value's trailing (block) axes, flattened to d."""


MULTIVARIATE_NORMAL = ExpFamily(
    name="MultivariateNormal",
    stats_type=MVNStats,
    event_ndim=1,
    support=constraints.real_vector,
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
    batch_shape=lambda natural: tuple(jnp.shape(natural.x)[:-1]),
    kind="gaussian",
    statistics=((("x", 1), "x"),),
    layout=LAYOUT,
    reparameterised=True,
    gaussian=True,
    prior_types=(dist.MultivariateNormal, dist.LowRankMultivariateNormal),
    start_at=start_at,
    safe_step=safe_step,
)
"""Full-covariance Gaussian over vectors (..., d)."""
