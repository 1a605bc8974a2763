"""Gauss-Hermite quadrature for Gaussian q, and on GLM linear predictors.

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

``predictor_expectations`` is the GLM case (Khan & Lin 2017): when the
likelihood touches its Gaussian neighbours only through per-observation linear
predictors η_n (found by :mod:`~blrppl.estimators.linear_predictor`),
one-dimensional quadrature on each η_n gives the expectations the site
parameters need (:func:`~blrppl.estimators.nonconjugate.nonconjugate_estimator`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from blrppl._types import Array, PRNGKey
from blrppl.estimators.gaussian import (
    GaussianEstimator,
    GaussianStats,
    beside_zero,
    is_full,
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


def gauss_hermite(num_points: int, *, max_dim: int = 3, sequential: bool = False) -> GaussianEstimator:
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
      sequential: evaluate the nodes one at a time (``lax.map``), for log
        factors that call LAPACK (:func:`blrppl.graph.jaxpr.lapack_primitives`).

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
                "delta or monte_carlo."
            )
        total = total_log_factor(log_factor)
        loc, scale = loc_scale(mean)
        if is_full(mean):
            dim = loc.shape[-1]
            if dim > max_dim:
                raise ValueError(
                    f"gauss_hermite on a full Gaussian block of dimension {dim} needs "
                    f"{num_points}**{dim} evaluations (max_dim={max_dim}); use "
                    "monte_carlo or delta, or raise max_dim."
                )
            nodes, weights = hermite_rule(num_points, dim)
            nodes = jnp.asarray(nodes, loc.dtype)
            points = loc + jnp.einsum("...ij,kj->k...i", scale, nodes)
        else:
            nodes, weights = hermite_rule(num_points)
            nodes = jnp.asarray(nodes[:, 0], loc.dtype).reshape((-1,) + (1,) * loc.ndim)
            points = loc + scale * nodes
        values = jax.lax.map(total, points) if sequential else jax.vmap(total)(points)
        return jnp.dot(jnp.asarray(weights, loc.dtype), values)

    def estimate(
        rng_key: PRNGKey | None,
        mean: GaussianStats,
        log_factor: Callable[[Array], Array],
    ) -> tuple[Array, GaussianStats]:
        del rng_key  # Deterministic.
        return jax.value_and_grad(expected_log_factor)(mean, log_factor)

    return GaussianEstimator(estimate=estimate, method="quadrature")


def gauss_hermite_product(num_points: int, *, sequential: bool = False) -> GaussianEstimator:
    """Gauss-Hermite over two diagonal Gaussian variables at once: the n x n product of their
    rules, every element of each variable taking that variable's node index (as in
    :func:`gauss_hermite`), so log f must be separable across each variable's elements given
    the other's (a scalar global scale and a plated local one: ``Normal(0, tau * lam)``).
    ``estimate(rng_key, {name: NormalStats}, log_f)`` with ``log_f({name: value})``; the
    gradients are those of the quadrature value in each variable's mean parameters (Khan & Rue,
    Eqs. 10-11, as :func:`gauss_hermite`)."""
    _check_num_points(num_points)
    nodes, weights = hermite_rule(num_points, 2)

    def expected_log_factor(mean: dict, log_factor: Callable[[dict], Array]) -> Array:
        names = sorted(mean)
        if len(names) != 2 or not all(isinstance(mean[v], NormalStats) for v in names):
            raise TypeError("gauss_hermite_product takes two diagonal Gaussian variables (NormalStats).")
        locs_scales = [loc_scale(mean[v]) for v in names]
        dtype = locs_scales[0][0].dtype
        grid = jnp.asarray(nodes, dtype)

        def at(node):
            return jnp.sum(log_factor({v: loc + scale * node[i] for i, (v, (loc, scale)) in enumerate(zip(names, locs_scales))}))

        values = jax.lax.map(at, grid) if sequential else jax.vmap(at)(grid)
        return jnp.dot(jnp.asarray(weights, dtype), values)

    def estimate(rng_key: PRNGKey | None, mean: dict, log_factor: Callable[[dict], Array]) -> tuple[Array, dict]:
        del rng_key  # Deterministic.
        return jax.value_and_grad(expected_log_factor)(mean, log_factor)

    return GaussianEstimator(estimate=estimate, method="quadrature")


# GLM likelihoods on linear predictors (Khan & Lin 2017).


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

    A node at exactly η = 0 (the delta method's at a zero mean) is read beside it
    (:func:`~blrppl.estimators.gaussian.beside_zero`).
    """
    dtype = eta_mean.dtype
    t = jnp.asarray(nodes[:, 0], dtype).reshape((-1,) + (1,) * eta_mean.ndim)
    eta = beside_zero(eta_mean + jnp.sqrt(eta_var) * t)  # (K, ..., N)

    def total(e: Array) -> Array:
        return jnp.sum(log_likelihood(e))

    def value_and_slope(e: Array) -> tuple[Array, Array]:
        return jnp.broadcast_to(log_likelihood(e), e.shape), jax.grad(total)(e)

    (values, first), (_, second) = jax.jvp(value_and_slope, (eta,), (jnp.ones_like(eta),))
    w = jnp.asarray(weights, dtype)
    return tuple(jnp.tensordot(w, a, axes=1) for a in (values, first, second))
