"""Gauss-Hermite quadrature for Gaussian q, and GLM likelihoods on linear predictors.

``gauss_hermite(n)`` evaluates E_q[log f] with the n-point (probabilists')
Gauss-Hermite rule in each independent block of q: per element for a diagonal q
(``NormalStats``), on an n^d tensor grid for full blocks (``MVNStats``, d <= 3 by
default). Every block uses the same node index at once, so log f must be
*separable across blocks* (a sum of terms each touching one element, or one
block); within a full block it may be anything. The natural gradient is the
exact gradient of the quadrature value with respect to μ (``jax.grad``, through
m and the Cholesky factor), so value and gradient are consistent, and both are
exact when log f is a polynomial of degree < 2n in each block; with n = 3 a
Normal likelihood gives exactly the conjugate message (y/σ², -1/(2σ²)).

``linear_predictor_quadrature(n)`` is the GLM case (Khan & Lin 2017): the
likelihood touches a full-covariance block β only through η_n = x_nᵀβ + o_n, so
one-dimensional quadrature on each η_n gives the site parameter for β and, in
two numbers per observation, the site parameter on η_n itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from blrppl._types import Array, ArrayLike, ArrayTree, PRNGKey
from blrppl.estimators.gaussian import (
    GaussianEstimator,
    GaussianStats,
    is_full,
    loc_cov,
    loc_scale,
    total_log_factor,
)
from blrppl.families.mvn import MVNStats
from blrppl.families.normal import NormalStats


def hermite_rule(num_points: int, dim: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Return nodes (n^dim, dim) and weights (n^dim,) for E over N(0, I_dim).

    The weights sum to one; the rule is exact for polynomials of degree < 2n
    in each coordinate.
    """
    nodes, weights = np.polynomial.hermite_e.hermegauss(num_points)
    weights = weights / weights.sum()
    grid = np.array(list(itertools.product(nodes, repeat=dim)))
    grid_weights = np.prod(
        np.array(list(itertools.product(weights, repeat=dim))), axis=1
    )
    return grid.reshape(-1, dim), grid_weights


def _check_num_points(num_points: int) -> None:
    if not isinstance(num_points, int) or num_points < 1:
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}.")


def gauss_hermite(num_points: int, *, max_dim: int = 3) -> GaussianEstimator:
    """Build the Gauss-Hermite estimator; exact for polynomial log f of degree < 2n.

    .. math::

        E_q[\\log f] \\approx \\sum_k w_k \\log f(m + L t_k), \\qquad
        \\hat g = \\nabla_\\mu \\sum_k w_k \\log f(m + L t_k)

    with L L ᵀ = Σ (√v for a diagonal q). The gradient with respect to μ is the
    natural gradient (Khan & Rue, Sec. 2); for exact expectations it equals
    Bonnet and Price's (E[g] - E[H] m, E[H] / 2), Eqs. 10-11.

    Args:
      num_points: n, nodes per dimension.
      max_dim: the largest full block dimension d accepted (n^d evaluations).

    Returns:
      A :class:`GaussianEstimator` with ``method="quadrature"``; its ``estimate``
      ignores ``rng_key``. ``log_factor`` must be separable across q's blocks
      (see the module docstring); it may return per-element values or their sum.

    Raises:
      ValueError: for a bad ``num_points``, or (when ``estimate`` is traced) a
        full block with d > ``max_dim``.

    Example:
        >>> from blrppl.families.normal import NormalStats
        >>> mean = NormalStats(x=jnp.array(0.2), x_sq=jnp.array(2.04))
        >>> y, var = 1.3, 0.5  # log N(y | x, var): the conjugate message is (y/var, -1/(2 var))
        >>> _, g = gauss_hermite(3).estimate(None, mean, lambda x: -0.5 * (y - x) ** 2 / var)
        >>> [round(float(v), 5) for v in g]
        [2.6, -1.0]
    """
    _check_num_points(num_points)

    def expected_log_factor(
        mean: GaussianStats, log_factor: Callable[[Array], Array]
    ) -> Array:
        if not isinstance(mean, (NormalStats, MVNStats)):
            raise TypeError(
                "gauss_hermite takes one Gaussian block (NormalStats or MVNStats), got "
                f"{type(mean).__name__}; for a factor of several Gaussian variables use "
                "delta or monte_carlo, or linear_predictor_quadrature for a GLM."
            )
        total = total_log_factor(log_factor)
        loc, scale = loc_scale(mean)
        if is_full(mean):
            dim = loc.shape[-1]
            if dim > max_dim:
                raise ValueError(
                    f"gauss_hermite on a full Gaussian block of dimension {dim} needs "
                    f"{num_points}**{dim} evaluations (max_dim={max_dim}); use "
                    "linear_predictor_quadrature for GLM likelihoods, monte_carlo, or "
                    "delta, or raise max_dim."
                )
            nodes, weights = hermite_rule(num_points, dim)
            nodes = jnp.asarray(nodes, loc.dtype)
            points = loc + jnp.einsum("...ij,kj->k...i", scale, nodes)
        else:
            nodes, weights = hermite_rule(num_points)
            nodes = jnp.asarray(nodes[:, 0], loc.dtype).reshape((-1,) + (1,) * loc.ndim)
            points = loc + scale * nodes
        values = jax.vmap(total)(points)
        return jnp.dot(jnp.asarray(weights, loc.dtype), values)

    def estimate(
        rng_key: PRNGKey | None,
        mean: GaussianStats,
        log_factor: Callable[[Array], Array],
    ) -> tuple[Array, GaussianStats]:
        del rng_key  # Deterministic.
        return jax.value_and_grad(expected_log_factor)(mean, log_factor)

    return GaussianEstimator(estimate=estimate, method="quadrature")


# GLM likelihoods on linear predictors (Khan & Lin 2017).


class PredictorSites(NamedTuple):
    """Per-observation results of :func:`linear_predictor_quadrature`.

    Attributes:
      natural: the Gaussian site parameter on each η_n, natural-parameter
        layout of a scalar Normal: ``x`` = α_n = E[ℓ'] - E[ℓ''] η̄_n and
        ``x_sq`` = β_n = E[ℓ''] / 2 (so the site is exp(α_n η + β_n η²)),
        shapes batch + (N,).
      expected: E_q[ℓ(y_n, η_n)], shape batch + (N,).
    """

    natural: NormalStats
    expected: Array


def _check_design(
    mean: MVNStats, design: Array, offset: Any, observations: ArrayTree
) -> None:
    if not isinstance(mean, MVNStats):
        raise TypeError(
            "linear_predictor_quadrature needs a full-covariance block (MVNStats) for the "
            f"coefficients, got {type(mean).__name__}."
        )
    dim = mean.x.shape[-1]
    if design.ndim < 2 or design.shape[-1] != dim:
        raise ValueError(
            f"design must have shape (..., N, D) with D = {dim} (the coefficient block's "
            f"size), got {design.shape}."
        )
    predictor_shape = jnp.broadcast_shapes(design.shape[:-1], mean.x.shape[:-1] + (1,))
    for name, value in [("offset", offset)] + [
        ("observations", leaf) for leaf in jax.tree.leaves(observations)
    ]:
        if value is None:
            continue
        try:
            jnp.broadcast_shapes(jnp.shape(value), predictor_shape)
        except ValueError:
            raise ValueError(
                f"{name} of shape {jnp.shape(value)} does not broadcast against the "
                f"linear predictor's shape {predictor_shape} (design {design.shape})."
            ) from None


def predictor_moments(
    mean: MVNStats, design: ArrayLike, offset: ArrayLike | None = None
) -> tuple[Array, Array]:
    """Return the mean X m + o and variance diag(X Σ Xᵀ) of η = Xβ + o under q(β).

    The variance is computed as row sums Σ_de X_nd Σ_de X_ne, O(N D²), never
    forming an N x N matrix. Shapes: ``design`` (..., N, D), results (..., N).
    """
    loc, cov = loc_cov(mean)
    design = jnp.asarray(design, loc.dtype)
    eta_mean = jnp.einsum("...nd,...d->...n", design, loc)
    if offset is not None:
        eta_mean = eta_mean + offset
    eta_var = jnp.sum(jnp.einsum("...nd,...de->...ne", design, cov) * design, axis=-1)
    return eta_mean, eta_var


def predictor_to_block(
    design: ArrayLike, sites: NormalStats, offset: ArrayLike | None = None
) -> MVNStats:
    """Pull per-observation sites on η_n = x_nᵀβ + o_n back to the block β.

    exp(Σ_n α_n η_n + β_n η_n²) as a function of β has natural parameters::

        (Xᵀ (α + 2 β ⊙ o),  Xᵀ diag(β) X)

    in ``MVNStats`` layout (the ``xxT`` coefficient, -Λ/2 convention).
    """
    design = jnp.asarray(design)
    linear = sites.x if offset is None else sites.x + 2.0 * sites.x_sq * offset
    return MVNStats(
        x=jnp.einsum("...nd,...n->...d", design, linear),
        xxT=jnp.einsum("...nd,...n,...ne->...de", design, sites.x_sq, design),
    )


def predictor_expectations(
    log_likelihood: Callable[[Array], Array],
    eta_mean: Array,
    eta_var: Array,
    nodes: np.ndarray,
    weights: np.ndarray,
) -> tuple[Array, Array, Array]:
    """E[ℓ(η_n)], E[ℓ'(η_n)], E[ℓ''(η_n)] for η_n ~ N(mean_n, var_n), elementwise ℓ.

    ``nodes``/``weights`` from :func:`hermite_rule` (one dimension). One
    forward pass gives ℓ, ℓ' and (as the tangent of ℓ') ℓ''.
    """
    dtype = eta_mean.dtype
    t = jnp.asarray(nodes[:, 0], dtype).reshape((-1,) + (1,) * eta_mean.ndim)
    eta = eta_mean + jnp.sqrt(eta_var) * t  # (K, ..., N)

    def total(e: Array) -> Array:
        return jnp.sum(log_likelihood(e))

    def value_and_slope(e: Array) -> tuple[Array, Array]:
        return jnp.broadcast_to(log_likelihood(e), e.shape), jax.grad(total)(e)

    (values, first), (_, second) = jax.jvp(value_and_slope, (eta,), (jnp.ones_like(eta),))
    w = jnp.asarray(weights, dtype)
    return tuple(jnp.tensordot(w, a, axes=1) for a in (values, first, second))


def linear_predictor_quadrature(num_points: int) -> GaussianEstimator:
    """Build the GLM estimator: Gauss-Hermite on each linear predictor (Khan & Lin 2017).

    For log f(β) = Σ_n ℓ(y_n, η_n), η_n = x_nᵀβ + o_n, and q(β) = N(m, Σ), each
    η_n is N(η̄_n, s_n²) with η̄ = X m + o and s² = diag(X Σ Xᵀ); n-point
    Gauss-Hermite on each gives E[ℓ], E[ℓ'] and E[ℓ''] (derivatives in η), and
    Bonnet and Price (Khan & Rue, Eqs. 10-11) with g = Xᵀℓ', H = Xᵀdiag(ℓ'')X::

        ∇_{μ1} = Xᵀ (E[ℓ'] - E[ℓ''] ⊙ X m),     ∇_{μ2} = ½ Xᵀ diag(E[ℓ'']) X
        α_n = E[ℓ'_n] - E[ℓ''_n] η̄_n,           β_n = E[ℓ''_n] / 2

    and ``predictor_to_block(X, (α, β), o)`` reproduces the block site exactly.

    Returns:
      A :class:`GaussianEstimator` with ``method="quadrature"`` whose
      ``estimate(rng_key, mean, log_likelihood, design, observations,
      offset=None)`` returns ``(value, nat_grad, sites)``: the scalar
      Σ_n E[ℓ_n], the ``MVNStats`` site parameter for β, and
      :class:`PredictorSites`. ``mean`` is the ``MVNStats`` μ of β, shapes
      (..., D) and (..., D, D); ``design`` is (..., N, D); ``log_likelihood
      (observations, eta)`` is vectorised and elementwise (output n depends on
      η_n only), e.g. ``lambda y, eta: y * eta - jnp.logaddexp(0, eta)``;
      ``observations`` is any pytree ``log_likelihood`` understands, its
      leaves broadcasting against (..., N).

    Raises:
      ValueError: for a bad ``num_points``, or (when ``estimate`` is traced) a
        design, offset or observations of the wrong shape.
      TypeError: if ``mean`` is not ``MVNStats``.
    """
    _check_num_points(num_points)
    nodes, weights = hermite_rule(num_points)

    def estimate(
        rng_key: PRNGKey | None,
        mean: MVNStats,
        log_likelihood: Callable[[ArrayTree, Array], Array],
        design: ArrayLike,
        observations: ArrayTree,
        offset: ArrayLike | None = None,
    ) -> tuple[Array, MVNStats, PredictorSites]:
        del rng_key  # Deterministic.
        design = jnp.asarray(design, jnp.result_type(mean.x))
        _check_design(mean, design, offset, observations)
        eta_mean, eta_var = predictor_moments(mean, design, offset)
        expected, d1, d2 = predictor_expectations(
            lambda e: log_likelihood(observations, e), eta_mean, eta_var, nodes, weights
        )
        fitted = eta_mean if offset is None else eta_mean - offset  # X m
        nat_grad = MVNStats(
            x=jnp.einsum("...nd,...n->...d", design, d1 - d2 * fitted),  # Eq. 10
            xxT=0.5
            * jnp.einsum("...nd,...n,...ne->...de", design, d2, design),  # Eq. 11
        )
        sites = PredictorSites(
            natural=NormalStats(x=d1 - d2 * eta_mean, x_sq=0.5 * d2), expected=expected
        )
        return jnp.sum(expected), nat_grad, sites

    return GaussianEstimator(estimate=estimate, method="quadrature")
