"""The Wishart family over d x d positive-definite matrices.

For X ~ Wishart(n, V) (degrees of freedom n > d - 1, scale matrix V, E[X] = nV):

    q(X) = |X|^{(n-d-1)/2} exp(-tr(V⁻¹X)/2) / (2^{nd/2} |V|^{n/2} Γ_d(n/2)),
    T(X) = (X, log|X|),   λ = (-V⁻¹/2, (n - d - 1)/2),
    μ = (nV, ψ_d(n/2) + d log 2 + log|V|),
    A(λ) = (n/2)(d log 2 - log|R|) + log Γ_d(n/2),   R = V⁻¹ = -(λ₁ + λ₁ᵀ),
    h(X) = 1,

with ψ_d(a) = Σ_{i=0}^{d-1} ψ(a - i/2) the multivariate digamma function. Only the
symmetric part of λ₁ matters, so ∇_{λ₁}A is symmetric.

.. warning::
    numpyro's ``Wishart(concentration, scale_matrix)`` calls the degrees of
    freedom n ``concentration``; ``scale_matrix`` is V (scipy's ``scale``, with
    E[X] = nV), not a precision. ``rate_matrix`` is V⁻¹. The natural parameter
    λ₁ = -V⁻¹/2 is negative definite.

The inverse map μ → λ reduces to one equation in n,

    ψ_d(n/2) + d log 2 - d log n = μ₂ - log|μ₁|,

solved by a fixed number of Newton steps in t = 1/(n - d + 1) (for d = 1 this is
Minka's Gamma iteration); then V = μ₁ / n.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import digamma, multigammaln, polygamma
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.gamma_draws import gamma_draws
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout

NEWTON_STEPS = 8
"""Newton steps in 1/(n - d + 1); the iteration is monotone from the start used."""


class WishartStats(NamedTuple):
    """T(X) = (X, log|X|), shapes (..., d, d) and (...); λ = (-V⁻¹/2, (n-d-1)/2)."""

    x: Array
    log_det_x: Array


def _multidigamma(a: Array, d: int) -> Array:
    """Return ψ_d(a) = Σ_{i=0}^{d-1} ψ(a - i/2)."""
    offsets = jnp.arange(d, dtype=a.dtype) / 2
    return jnp.sum(digamma(a[..., None] - offsets), axis=-1)


def _multitrigamma(a: Array, d: int) -> Array:
    offsets = jnp.arange(d, dtype=a.dtype) / 2
    return jnp.sum(polygamma(1, a[..., None] - offsets), axis=-1)


def _df_rate(natural: WishartStats) -> tuple[Array, Array]:
    """Return (n, R = V⁻¹) with R the symmetrised -2λ₁."""
    d = natural.x.shape[-1]
    rate = -(natural.x + jnp.swapaxes(natural.x, -1, -2))
    return 2.0 * natural.log_det_x + d + 1.0, rate


def solve_degrees_of_freedom(
    target: Array, d: int, num_steps: int = NEWTON_STEPS
) -> Array:
    """Solve f(n) = ψ_d(n/2) + d log 2 - d log n = target (< 0) for n > d - 1.

    Newton's method in t = 1/(n - d + 1). The start n₀ - d + 1 = d(d + 1)/(2|c|)
    comes from f(n) ≈ -d(d + 1)/(2n) for large n; it never lies left of the
    root in n - d + 1, so the iterates approach the root from one side.

    Args:
        target: c = μ₂ - log|μ₁| (negative by Jensen's inequality).
        d: the matrix dimension.
        num_steps: fixed number of Newton steps (a ``fori_loop``).

    Returns:
        n, shaped like ``target``.
    """
    excess = d * (d + 1) / (-2.0 * target)  # n - d + 1
    excess, _ = jax.lax.fori_loop(0, num_steps, _partial_step(d), (excess, target))
    return excess + d - 1.0


@functools.cache
def _partial_step(d: int):
    return functools.partial(_newton_step, d)


def _newton_step(d, _, carry):
    excess, target = carry
    n = excess + d - 1.0
    residual = _multidigamma(n / 2, d) + d * math.log(2.0) - d * jnp.log(n) - target
    slope = 0.5 * _multitrigamma(n / 2, d) - d / n  # f'(n) > 0
    # t = 1/excess: t ← t - F / (dF/dt), dF/dt = -excess² f'(n).
    return 1.0 / (1.0 / excess + residual / (excess**2 * slope)), target


def sufficient_stats(x: ArrayLike) -> WishartStats:
    """Return T(X) = (X, log|X|)."""
    (x,) = common.as_floats(x)
    log_det = common.cholesky_log_det(jnp.linalg.cholesky(common.symmetrize(x)))
    return WishartStats(x=x, log_det_x=log_det)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(X) = 0, batch shaped."""
    (x,) = common.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-2], x.dtype)


def expected_log_base_measure(natural: WishartStats) -> Array:
    """Return E_q[log h(X)] = 0."""
    return jnp.zeros_like(natural.log_det_x)


def log_normalizer(natural: WishartStats) -> Array:
    """Return A(λ) = (n/2)(d log 2 - log|R|) + log Γ_d(n/2)."""
    d = natural.x.shape[-1]
    n, rate = _df_rate(natural)
    log_det_rate = common.cholesky_log_det(jnp.linalg.cholesky(rate))
    return 0.5 * n * (d * math.log(2.0) - log_det_rate) + multigammaln(0.5 * n, d)


def mean_params(natural: WishartStats) -> WishartStats:
    """Return μ = (nV, ψ_d(n/2) + d log 2 + log|V|), V = R⁻¹."""
    d = natural.x.shape[-1]
    n, rate = _df_rate(natural)
    chol = jnp.linalg.cholesky(rate)
    scale = common.cholesky_inverse(chol)
    log_det = (
        _multidigamma(0.5 * n, d) + d * math.log(2.0) - common.cholesky_log_det(chol)
    )
    return WishartStats(x=n[..., None, None] * scale, log_det_x=log_det)


def natural_params(mean: WishartStats) -> WishartStats:
    """Return λ from μ: n by Newton (``solve_degrees_of_freedom``), then V = μ₁ / n."""
    d = mean.x.shape[-1]
    chol = jnp.linalg.cholesky(common.symmetrize(mean.x))
    n = solve_degrees_of_freedom(mean.log_det_x - common.cholesky_log_det(chol), d)
    rate = n[..., None, None] * common.cholesky_inverse(chol)
    return WishartStats(x=-0.5 * rate, log_det_x=0.5 * (n - d - 1.0))


def from_usual(
    concentration: ArrayLike,
    scale_matrix: ArrayLike | None = None,
    *,
    rate_matrix: ArrayLike | None = None,
    scale_tril: ArrayLike | None = None,
) -> WishartStats:
    """Return λ of Wishart(n = concentration, V) from exactly one of V, V⁻¹, chol(V).

    Raises:
        ValueError: if not exactly one matrix argument is given.

    Example:
        >>> float(from_usual(4.0, jnp.eye(2)).log_det_x)
        0.5
    """
    given = [m is not None for m in (scale_matrix, rate_matrix, scale_tril)]
    if sum(given) != 1:
        raise ValueError("give exactly one of scale_matrix, rate_matrix or scale_tril.")
    matrix = next(m for m in (scale_matrix, rate_matrix, scale_tril) if m is not None)
    n, matrix = common.as_floats(concentration, matrix)
    if rate_matrix is not None:
        rate = common.symmetrize(matrix)
    elif scale_tril is not None:
        rate = common.cholesky_inverse(jnp.tril(matrix))
    else:
        rate = common.cholesky_inverse(jnp.linalg.cholesky(common.symmetrize(matrix)))
    d = rate.shape[-1]
    batch = jnp.broadcast_shapes(n.shape, rate.shape[:-2])
    return WishartStats(
        x=jnp.broadcast_to(-0.5 * rate, batch + (d, d)),
        log_det_x=jnp.broadcast_to(0.5 * (n - d - 1.0), batch),
    )


def to_usual(natural: WishartStats) -> dict[str, Array]:
    """Return ``{"concentration": n, "scale_matrix": V}`` (numpyro's names)."""
    n, rate = _df_rate(natural)
    return {
        "concentration": n,
        "scale_matrix": common.cholesky_inverse(jnp.linalg.cholesky(rate)),
    }


def from_numpyro(d: dist.Distribution) -> WishartStats:
    """Return λ of a numpyro ``Wishart``."""
    base = common.unwrap(d)
    if not isinstance(base, dist.Wishart):
        raise common.not_in_family(d, "Wishart")
    nat = from_usual(base.concentration, scale_tril=base.scale_tril)
    batch = common.target_batch_shape(d, 2)
    dim = nat.x.shape[-1]
    return WishartStats(
        x=jnp.broadcast_to(nat.x, batch + (dim, dim)),
        log_det_x=jnp.broadcast_to(nat.log_det_x, batch),
    )


def to_numpyro(natural: WishartStats) -> dist.Wishart:
    """Return ``dist.Wishart(concentration=n, scale_tril=chol(V))``."""
    usual = to_usual(natural)
    return dist.Wishart(
        usual["concentration"], scale_tril=jnp.linalg.cholesky(usual["scale_matrix"])
    )


def sample(rng_key: PRNGKey, natural: WishartStats, sample_shape: tuple = ()) -> Array:
    """Draw X ~ Wishart(n, V) by the Bartlett decomposition.

    With R = V⁻¹ = C Cᵀ (Cholesky) and A lower triangular, A_ii = sqrt(χ²_{n-i}),
    i = 0, ..., d-1, and A_ij ~ N(0, 1) below the diagonal, A Aᵀ ~ W(n, I), so
    X = (C⁻ᵀA)(C⁻ᵀA)ᵀ ~ W(n, C⁻ᵀC⁻¹) = W(n, V).

    Returns:
        X of shape ``sample_shape + batch_shape + (d, d)``.
    """
    n, rate = _df_rate(natural)
    d = rate.shape[-1]
    shape = tuple(sample_shape) + n.shape
    chi2_key, normal_key = jax.random.split(rng_key)
    half_df = (n[..., None] - jnp.arange(d, dtype=n.dtype)) / 2  # (n - i) / 2
    chi2 = 2.0 * gamma_draws(chi2_key, half_df, shape + (d,), n.dtype)
    normal = jax.random.normal(normal_key, shape + (d, d), dtype=n.dtype)
    bartlett = jnp.tril(normal, -1) + jnp.sqrt(chi2)[..., None] * jnp.eye(
        d, dtype=n.dtype
    )
    chol_t = jnp.broadcast_to(
        jnp.swapaxes(jnp.linalg.cholesky(rate), -1, -2), shape + (d, d)
    )
    factor = solve_triangular(chol_t, bartlett, lower=False)  # C⁻ᵀ A
    return factor @ jnp.swapaxes(factor, -1, -2)


def is_valid(natural: WishartStats) -> Array:
    """Return R = -(λ₁ + λ₁ᵀ) positive definite and n > d - 1 (λ₂ > -1).

    The result is batch shaped.
    """
    n, rate = _df_rate(natural)
    d = natural.x.shape[-1]
    ok_df = jnp.isfinite(n) & (n > d - 1.0)
    return ok_df & common.is_positive_definite(rate)


def start_at(natural: WishartStats, value: ArrayLike) -> WishartStats:
    """λ with mean ``value`` (scale value / n) and λ's degrees of freedom n."""
    n = to_usual(natural)["concentration"]
    return from_usual(n, value / n[..., None, None])


WISHART = ExpFamily(
    name="Wishart",
    stats_type=WishartStats,
    event_ndim=2,
    support=constraints.positive_definite,
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
    batch_shape=lambda natural: tuple(jnp.shape(natural.log_det_x)),
    kind="wishart",
    statistics=((("x", 1), "x"), (("logdet", 1), "log_det_x")),
    layout=elementwise_layout(symmetric=("x",)),
    reparameterised=True,
    prior_types=(dist.Wishart,),
    fixed_support=constraints.positive_definite,
    start_at=start_at,
)
"""Wishart(n, V) over d x d positive-definite matrices."""
