"""The mixture q = Σ_k w_k q(c | h_k): moments, and the exact density of h.

Moments of a mixture are weighted sums of the components' (the mean
parameters of exponential-family components mix linearly); variances are
written as within- plus between-node parts, which avoids cancellation:

    E[x] = Σ w_k m_k,    Var[x] = Σ w_k v_k + Σ w_k (m_k - E[x])²,

and the same with outer products for covariance matrices.

The density of h itself needs no mixture: p(h | y) = exp f(u(h)) /
(|det ∂h/∂u| p(y)) is exact wherever the conditional fit is evaluated, and
the marginal of one site of h integrates the others on a lattice in their
conditional standardised coordinates (the Gaussian at the mode gives the
centre and scale of u_rest given u_site), by the same trapezoidal rule as
the grid.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr.integrate.grid import evaluate


def mix_moments(log_weights: jax.Array, mean: jax.Array, variance: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mixture mean and variance from per-node ones (leading axis K)."""
    w = jnp.exp(log_weights).reshape((-1,) + (1,) * (jnp.ndim(mean) - 1))
    m = jnp.sum(w * mean, axis=0)
    v = jnp.sum(w * variance, axis=0) + jnp.sum(w * (mean - m) ** 2, axis=0)
    return m, v


def mix_covariance(log_weights: jax.Array, mean: jax.Array, covariance: jax.Array) -> jax.Array:
    """Mixture covariance from per-node means (K, ..., d) and covariances (K, ..., d, d)."""
    w = jnp.exp(log_weights).reshape((-1,) + (1,) * (jnp.ndim(covariance) - 1))
    m = jnp.sum(w[..., 0] * mean, axis=0)
    centred = mean - m
    outer = centred[..., :, None] * centred[..., None, :]
    return jnp.sum(w * (covariance + outer), axis=0)


def _lattice_ball(dim: int, step: float, radius: float) -> np.ndarray:
    """Lattice points δ n inside the ball of ``radius`` (z units), shape (n, dim)."""
    if dim == 0:
        return np.zeros((1, 0))
    reach = int(math.ceil(radius / step))
    axes = [np.arange(-reach, reach + 1)] * dim
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, dim) * step
    return mesh[np.sum(mesh**2, axis=1) <= radius**2]


def site_log_density(conditional: Any, arrays: Any, fit: Any, site: str, values: Any) -> np.ndarray:
    """log p(h_site | y) at ``values`` (constrained, leading batch axes), exact up to quadrature.

    With h a single site this is exp f(u(h)) / (|det ∂h/∂u| p(y)), f
    evaluated by the conditional fit at each value; otherwise the other
    coordinates of u are integrated on a lattice ball of radius
    sqrt(2 drop) + 1 in their conditional standardised coordinates (module
    docstring). Every f comes from the grid's compiled program
    (:func:`~.grid.evaluate`), so nothing new is compiled.

    Args:
      conditional: the :class:`~.conditional.Conditional`.
      arrays: the plan's arrays.
      fit: the :class:`~blrppl.blr.integrate.IntegratedFit` (mode, Hessian, grid).
      site: a hyperparameter site.
      values: site values, shape ``batch + site shape``.
    """
    space = conditional.space
    index = space.sites.index(site)
    own = np.arange(space.site_slices()[site].start, space.site_slices()[site].stop)
    transform, shape = space.transforms[index], space.shapes[index]
    values = np.asarray(values, np.float64)
    batch = values.shape[: values.ndim - len(shape)]
    flat = jnp.reshape(jnp.asarray(values), (-1,) + tuple(shape))
    u_site = jnp.reshape(transform.inv(flat), (flat.shape[0], -1))
    log_det_site = jnp.sum(jnp.reshape(transform.log_abs_det_jacobian(transform.inv(flat), flat), (flat.shape[0], -1)), -1)
    u_site, log_det_site = np.asarray(u_site), np.asarray(log_det_site)
    k = space.dim
    rest = np.array([i for i in range(k) if i not in own], dtype=int)
    mode = np.asarray(fit.grid.standardised.mode)
    scale = np.asarray(fit.grid.standardised.scale)
    covariance = scale @ scale.T
    if rest.size:
        c_ss = covariance[np.ix_(own, own)]
        c_rs = covariance[np.ix_(rest, own)]
        gain = c_rs @ np.linalg.inv(c_ss)
        c_cond = covariance[np.ix_(rest, rest)] - gain @ c_rs.T
        eigval, eigvec = np.linalg.eigh(0.5 * (c_cond + c_cond.T))
        root = eigvec * np.sqrt(np.maximum(eigval, 1e-300))
        log_cell = rest.size * math.log(fit.grid.step) + 0.5 * float(np.sum(np.log(np.maximum(eigval, 1e-300))))
        z = _lattice_ball(rest.size, fit.grid.step, math.sqrt(2.0 * fit.drop) + 1.0)
        centre = mode[rest] + (u_site - mode[own]) @ gain.T  # (n, r)
    else:
        root, log_cell, z, centre = np.zeros((0, 0)), 0.0, np.zeros((1, 0)), np.zeros((u_site.shape[0], 0))
    u = np.zeros((u_site.shape[0], z.shape[0], k))
    u[:, :, own] = u_site[:, None, :]
    u[:, :, rest] = centre[:, None, :] + z @ root.T
    f = evaluate(conditional, u.reshape(-1, k), arrays, states=False).reshape(u_site.shape[0], z.shape[0])
    f = np.where(np.isfinite(f), f, -np.inf)
    top = np.max(f, axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    log_p = top + np.log(np.sum(np.exp(f - top[:, None]), axis=1)) + log_cell - fit.grid.log_evidence - log_det_site
    return log_p.reshape(batch)
