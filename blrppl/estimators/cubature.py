"""Deterministic cubature for factors of a few scalar Gaussian latents.

A factor such as a Gaussian process marginal likelihood
``y ~ MultivariateNormal(0, K(var, noise, length))`` touches a handful of
scalar hyperparameters u (Gaussian q on their unconstrained space). Monte
Carlo estimates of its natural gradient are noisy and need many evaluations of
an expensive log f; a fully symmetric *degree-5 cubature rule* for N(0, I_d)
(Stroud 1971; McNamee & Stenger 1967) with 2d² + 1 nodes (9 for d = 2, 19 for
d = 3, 33 for d = 4; positive weights for d <= 4) is exact for polynomials of
total degree 5, deterministic, and cheap. At each node u_k = m + L z_k
(L Lᵀ = Σ, block diagonal across mean-field blocks) it evaluates log f, its
gradient and Hessian, and Bonnet and Price assemble the natural gradient of
every block (Khan & Rue, Eqs. 10-11):

    ∇_μ1 = E[g] - E[H] m,    ∇_μ2 = E[H] / 2,    E[·] = Σ_k w_k (·)(u_k).

Being deterministic, it gets the ELBO guard (a step that lowers the ELBO is
retried with a smaller ρ). ``value_grad_hessian`` may replace autodiff of
log f: the Gaussian process likelihood uses one Cholesky per node and
forward-mode derivatives of the kernel (:func:`mvn_value_grad_hessian`),
never autodiff through LAPACK.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from blrppl._types import Array, PRNGKey
from blrppl.estimators.gaussian import (
    GaussianEstimator, beside_zero, curvature_term, flatten_blocks, is_full, loc_scale, natural_gradient,
)

MAX_CUBATURE_DIM = 4
"""The largest total dimension of a factor's Gaussian neighbours cubature takes (positive weights)."""


def degree5_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (n, d) and weights (n,) of the fully symmetric degree-5 rule for N(0, I_d).

    Nodes: the origin, ±√3 eᵢ and (±√3 eᵢ ± √3 eⱼ) for i < j; weights
    1 + (d² - 7d)/18, (4 - d)/18 and 1/36 (they sum to one). For d = 1 it is
    3-point Gauss-Hermite, for d = 2 the 3 x 3 tensor rule. Exact for every
    polynomial of total degree <= 5.

    Raises:
      ValueError: for d outside 1..4 (negative weights beyond).
    """
    if not 1 <= dim <= MAX_CUBATURE_DIM:
        raise ValueError(f"the degree-5 rule is used for 1 <= d <= {MAX_CUBATURE_DIM}, got d = {dim}.")
    r = math.sqrt(3.0)
    weights = [1.0 + (dim * dim - 7 * dim) / 18.0]
    nodes = [np.zeros(dim)]
    for i in range(dim):
        for sign in (1.0, -1.0):
            node = np.zeros(dim)
            node[i] = sign * r
            nodes.append(node)
            weights.append((4.0 - dim) / 18.0)
    for i, j in itertools.combinations(range(dim), 2):
        for si, sj in itertools.product((1.0, -1.0), repeat=2):
            node = np.zeros(dim)
            node[i], node[j] = si * r, sj * r
            nodes.append(node)
            weights.append(1.0 / 36.0)
    nodes, weights = np.array(nodes), np.array(weights)
    keep = weights != 0.0
    return nodes[keep], weights[keep]


def spherical_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (2d, d) and weights of the degree-3 spherical rule for N(0, I_d): ±√d eᵢ, 1 / (2d).

    Exact for every polynomial of total degree <= 3, positive weights in any
    dimension (the cubature Kalman filter's rule; Arasaratnam & Haykin 2009).
    Used past :data:`MAX_CUBATURE_DIM`, where the degree-5 rule's weights turn
    negative. With Bonnet and Price, E[g] is then exact for log f of degree
    4 and E[H] for degree 5.
    """
    eye = np.eye(dim) * math.sqrt(dim)
    return np.concatenate([eye, -eye]), np.full(2 * dim, 1.0 / (2 * dim))


def cubature_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The degree-5 rule up to :data:`MAX_CUBATURE_DIM`, the degree-3 spherical rule beyond."""
    return degree5_rule(dim) if dim <= MAX_CUBATURE_DIM else spherical_rule(dim)


def cubature(
    *,
    sequential: bool = False,
    value_grad_hessian: Optional[Callable[[Array], tuple[Array, Array, Array]]] = None,
    at_mean: bool = False,
    second_order: bool = True,
) -> GaussianEstimator:
    """Build the degree-5 cubature estimator (module docstring).

    Args:
      at_mean: one node at the mean with weight one instead: the delta
        method (Newton steps) through the same ``value_grad_hessian``; its value with
        ½ tr(H Σ) where ``second_order`` (see :func:`blrppl.estimators.delta.delta`).
      sequential: evaluate the nodes one at a time (``lax.map``) instead of
        batched (``vmap``): every LAPACK call in log f then stays unbatched
        (see :func:`blrppl.graph.jaxpr.lapack_primitives`).
      value_grad_hessian: ``u -> (log f, ∇ log f, ∇² log f)`` on the flat
        vector u of every block (in the order of ``mean``'s leaves), to
        replace autodiff of ``log_factor``.

    Returns:
      A :class:`GaussianEstimator` with ``method="cubature"`` (``"delta"``
      with ``at_mean``); ``estimate``
      ignores ``rng_key``. ``mean`` is a Gaussian block or a pytree of blocks
      (mean-field across them) of total dimension at most
      :data:`MAX_CUBATURE_DIM`.
    """

    def estimate(rng_key: PRNGKey | None, mean: Any, log_factor: Callable[[Any], Array]) -> tuple[Array, Any]:
        del rng_key  # Deterministic.
        blocks, treedef = flatten_blocks(mean)
        shapes = [jnp.shape(b.x) for b in blocks]
        sizes = [math.prod(s) for s in shapes]
        dim = sum(sizes)
        if at_mean:  # the mean alone: no factor of Σ (a degenerate Σ, log p̄ at the mean, stays finite)
            weights = np.ones(1)
            loc = jnp.concatenate([jnp.ravel(block.x) for block in blocks])
            points = loc[None]
        else:
            nodes, weights = cubature_rule(dim)
            locs, scales = [], []
            for block in blocks:
                loc, scale = loc_scale(block)
                locs.append(jnp.ravel(loc))
                scales.append(scale if is_full(block) else jnp.diag(jnp.ravel(scale)))
            loc = jnp.concatenate(locs)
            scale = jax.scipy.linalg.block_diag(*scales)
            points = loc + jnp.asarray(nodes, loc.dtype) @ scale.T
        points = beside_zero(points)  # the centre node at a zero mean (a zero-mean start's kinks)
        dtype = loc.dtype

        def unflatten(u: Array) -> Any:
            parts, start = [], 0
            for shape, size in zip(shapes, sizes):
                parts.append(jnp.reshape(u[start : start + size], shape))
                start += size
            return jax.tree.unflatten(treedef, parts)

        def total(u: Array) -> Array:
            return jnp.sum(log_factor(unflatten(u)))

        def at_node(u: Array) -> tuple[Array, Array, Array]:
            if value_grad_hessian is not None:
                return value_grad_hessian(u)
            value, grad = jax.value_and_grad(total)(u)
            return value, grad, jax.hessian(total)(u)

        if at_mean:
            values, grads, hessians = jax.tree.map(lambda x: x[None], at_node(points[0]))
        elif sequential:
            values, grads, hessians = jax.lax.map(at_node, points)
        else:
            values, grads, hessians = jax.vmap(at_node)(points)
        w = jnp.asarray(weights, dtype)
        expected = w @ values
        expected_grad = w @ grads
        expected_hessian = jnp.tensordot(w, hessians, axes=1)
        nat_grads, start = [], 0
        for block, shape, size in zip(blocks, shapes, sizes):
            g = expected_grad[start : start + size]
            h = expected_hessian[start : start + size, start : start + size]
            if is_full(block):
                nat_grads.append(natural_gradient(block, jnp.reshape(g, shape), h))
            else:
                nat_grads.append(natural_gradient(block, jnp.reshape(g, shape), jnp.reshape(jnp.diagonal(h), shape)))
            start += size
        if at_mean and second_order:  # the delta method's second-order E_q[log f] (:func:`curvature_term`)
            expected = expected + sum(curvature_term(b, n) for b, n in zip(blocks, nat_grads))
        return expected, jax.tree.unflatten(treedef, nat_grads)

    return GaussianEstimator(estimate=estimate, method="delta" if at_mean else "cubature")


def mvn_value_grad_hessian(
    moments: Callable[[Array], tuple[Array, Array]], y: Array
) -> Callable[[Array], tuple[Array, Array, Array]]:
    """Value, gradient and Hessian in u of log N(y | m(u), K(u)) from one Cholesky.

    ``moments(u) -> (K, m)`` is the model's own code (the replayed model, or
    a kernel function); K_i = ∂K/∂u_i, K_ij, m_i, m_ij come from one pass of
    second-order forward-mode autodiff through it. Then, with
    a = K⁻¹ (y - m)::

        g_i  = ½ aᵀK_i a - ½ tr(K⁻¹K_i) + m_iᵀa
        H_ij = -aᵀK_i K⁻¹ K_j a + ½ aᵀK_ij a + ½ tr(K⁻¹K_i K⁻¹K_j) - ½ tr(K⁻¹K_ij)
               - m_iᵀK⁻¹m_j + m_ijᵀa - m_iᵀK⁻¹K_j a - m_jᵀK⁻¹K_i a

    No autodiff through the Cholesky factorisation (expensive, and LAPACK).
    """

    def with_value(f):
        return lambda u: (lambda out: (out, out))(f(u))

    first = jax.jacfwd(with_value(moments), has_aux=True)  # u -> ((K_i, m_i), (K, m))
    second = jax.jacfwd(lambda u: (lambda jv: (jv[0], jv))(first(u)), has_aux=True)

    def vgh(u: Array) -> tuple[Array, Array, Array]:
        # Forward mode puts the d tangent axes last: K_i is cov_d[..., i], K_ij cov_dd[..., i, j].
        (cov_dd, loc_dd), ((cov_d, loc_d), (cov, loc)) = second(u)
        n, d = cov.shape[-1], cov_d.shape[-1]
        chol = jnp.linalg.cholesky(cov)
        chol_inv = solve_triangular(chol, jnp.eye(n, dtype=cov.dtype), lower=True)
        precision = chol_inv.T @ chol_inv
        resid = y - loc
        a = precision @ resid
        value = -0.5 * resid @ a - jnp.sum(jnp.log(jnp.diagonal(chol))) - 0.5 * n * math.log(2 * math.pi)
        # Every contraction below is a matrix product over contiguous axes: on the CPU's cheap
        # compile settings (blrppl.compile_mode) an einsum over a middle axis runs as a slow loop
        # (a Gaussian process step 2x slower). K is a covariance, so K_i and K_ij are symmetric.
        flat_d = jnp.reshape(cov_d, (n, n * d))  # [k, (m, i)] = K_i[k, m]
        whitened = jnp.reshape(precision @ flat_d, (n, n, d))  # K⁻¹K_i
        cov_a = jnp.reshape(a @ flat_d, (n, d)).T  # K_i a = (aᵀK_i)ᵀ, (d, n)
        traces = jnp.reshape(precision, (n * n,)) @ jnp.reshape(cov_d, (n * n, d))  # tr(K⁻¹K_i)
        grad = 0.5 * cov_a @ a - 0.5 * traces
        # ½ aᵀK_ij a - ½ tr(K⁻¹K_ij) in one pass over K_ij.
        outer = jnp.reshape(jnp.outer(a, a) - precision, (n * n,))
        second_order = 0.5 * jnp.reshape(outer @ jnp.reshape(cov_dd, (n * n, d * d)), (d, d))
        # tr(K⁻¹K_i K⁻¹K_j) = Σ_kl (K⁻¹K_i)_kl (K⁻¹K_j)_lk.
        pairs = jnp.reshape(whitened, (n * n, d)).T @ jnp.reshape(jnp.swapaxes(whitened, 0, 1), (n * n, d))
        hessian = -cov_a @ precision @ cov_a.T + second_order + 0.5 * pairs
        pulled = loc_d.T @ precision  # m_iᵀ K⁻¹, (d, n)
        grad = grad + pulled @ resid
        cross = pulled @ cov_a.T
        loc_second = jnp.reshape(a @ jnp.reshape(loc_dd, (n, d * d)), (d, d))  # Σ_n m_ij[n] a_n
        hessian = hessian - pulled @ loc_d + loc_second - cross - cross.T
        return value, grad, 0.5 * (hessian + hessian.T)

    return vgh
