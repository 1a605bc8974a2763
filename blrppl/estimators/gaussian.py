"""Gaussian q: natural gradients by Bonnet and Price, and a positive-definite BLR step.

A Gaussian block of q is given by its mean parameters, in one of two layouts:

- :class:`~blrppl.families.normal.NormalStats` ``(x, x_sq)``: independent scalar
  Gaussians, one per element, any shape (a diagonal / mean-field Gaussian);
  μ = (m, m² + v), λ = (m / v, -1 / (2v)).
- :class:`~blrppl.families.mvn.MVNStats` ``(x, xxT)``: independent full-covariance
  Gaussians over the last axis, batch dimensions leading, shapes (..., d) and
  (..., d, d); μ = (m, Σ + m mᵀ), λ = (Λ m, -Λ/2), Λ = Σ⁻¹.

For a log factor log f with gradient g and Hessian H, the natural gradient of
E_q[log f] (the site parameter increment, in natural-parameter coordinates) is,
by Bonnet's and Price's theorems (Khan & Rue, Eqs. 10-11, with log f = -ℓ̄)::

    ∇_{μ1} E_q[log f] = E_q[g] - E_q[H] m,     ∇_{μ2} E_q[log f] = E_q[H] / 2.

For a diagonal q, H is replaced by diag(H) in both terms (the x_sq coefficient is
E[H_ii] / 2 elementwise). Adding the site parameter to λ adds -E[H] to the
precision: a concave log f makes q more concentrated.

.. warning::
   Sign conventions: ``xxT`` / ``x_sq`` hold -Λ/2 (negative definite for a
   valid q), never the precision itself. :func:`precision` returns
   Λ = -(λ₂ + λ₂ᵀ) (MVN) or -2 λ₂ (Normal). Estimates of E[H] are Hessians of
   log f (not of a loss), so they are negative (semi-)definite when log f is
   concave.

The estimators (:mod:`~blrppl.estimators.delta`,
:mod:`~blrppl.estimators.monte_carlo`, :mod:`~blrppl.estimators.quadrature`) are
:class:`GaussianEstimator` values built by factories;
``estimate(rng_key, mean, log_factor) -> (value, nat_grad)`` where ``value``
estimates E_q[log f] and ``nat_grad`` has the layout of ``mean``. ``log_factor``
takes an array shaped like ``mean.x`` and returns log f, either as a scalar or as
an array (which is summed). The delta and Monte Carlo estimators also take a
pytree of blocks (e.g. ``{"a": NormalStats, "b": MVNStats}``, mean-field across
them); ``log_factor`` then takes values of the same structure and each block's
natural gradient uses its own Hessian blocks (cross-block terms of H drop out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from blrppl._types import Array, ArrayLike
from blrppl.families import common
from blrppl.families import mvn as _mvn
from blrppl.families import normal as _normal
from blrppl.families.gaussian_step import (
    positive_definite_step,
    precision,
    precision_is_positive_definite,
)
from blrppl.families.mvn import MVNStats
from blrppl.families.normal import NormalStats

GaussianStats = NormalStats | MVNStats


class GaussianEstimator(NamedTuple):
    """Estimates E_q[log f] and its natural gradient ĝ = ∇_μ E_q[log f] for Gaussian q.

    Attributes:
      estimate: ``(rng_key, mean, log_factor) -> (value, nat_grad)``; ``mean``
        is μ of q (``NormalStats`` or ``MVNStats``), ``nat_grad`` has the same
        layout. Deterministic estimators ignore ``rng_key`` (``None`` is fine).
      method: ``"delta"``, ``"mc"`` or ``"quadrature"`` (the option strings of
        DESIGN.md).
    """

    estimate: Callable[..., Any]
    method: str


def beside_zero(x: Array) -> Array:
    """x shifted by √(smallest normal number): where the model's code is differentiated at a
    point, an x of exactly 0 is read just beside it; any other x is left as it is to its last
    digit (|x| > 1e-138 in float64, 2e-12 in float32, where the shift is below half an ulp).

    A start from zero-mean priors puts linear predictors at exactly 0, where numpyro's logit
    likelihoods are written with |η| and ``clip(η, 0)``, whose derivatives JAX takes at 0 as 1
    and 1/2: ℓ'(0) of ``Bernoulli(logits=η)`` comes out y where it is y - 1/2, of
    ``Binomial(n, logits=η)`` y where it is y - n/2. A Newton start from there took a first
    step that lowered log p̄ at every halving of ρ, and started worse. (√ of the smallest
    normal number, not that number: XLA:CPU flushes subnormal products to zero, and 0.5 η
    would be 0 again.)
    """
    return x + jnp.sqrt(jnp.finfo(jnp.result_type(x)).tiny)


def is_full(stats: GaussianStats) -> bool:
    """Return True for ``MVNStats`` (full covariance), False for ``NormalStats``.

    Raises:
      TypeError: for any other layout.
    """
    if isinstance(stats, MVNStats):
        return True
    if isinstance(stats, NormalStats):
        return False
    raise TypeError(
        f"expected NormalStats or MVNStats mean parameters, got {type(stats).__name__}; "
        "the Gaussian estimators only handle Gaussian q."
    )


def loc_cov(mean: GaussianStats) -> tuple[Array, Array]:
    """Return (m, v) for ``NormalStats`` or (m, Σ) for ``MVNStats`` from μ.

    v = μ₂ - μ₁² elementwise; Σ = μ₂ - μ₁μ₁ᵀ, symmetrised.
    """
    if is_full(mean):
        return mean.x, common.symmetrize(mean.xxT - common.outer(mean.x))
    return mean.x, mean.x_sq - mean.x**2


def loc_scale(mean: GaussianStats) -> tuple[Array, Array]:
    """Return (m, √v) elementwise, or (m, L) with L L ᵀ = Σ (lower Cholesky)."""
    loc, cov = loc_cov(mean)
    if is_full(mean):
        return loc, jnp.linalg.cholesky(cov)
    return loc, jnp.sqrt(cov)


def scale_noise(mean: GaussianStats, scale: Array, eps: Array) -> Array:
    """Return L ε (or √v ε) for standard normal ``eps`` shaped ``sample + mean.x.shape``."""
    if is_full(mean):
        return jnp.einsum("...ij,...j->...i", scale, eps)
    return scale * eps


def natural_gradient(
    mean: GaussianStats, expected_grad: ArrayLike, expected_hessian: ArrayLike
) -> GaussianStats:
    """Assemble ∇_μ E_q[log f] from E[g] and E[H] (Khan & Rue, Eqs. 10-11).

    .. math::

        \\nabla_{\\mu_1} = E[g] - E[H] m, \\qquad \\nabla_{\\mu_2} = E[H] / 2.

    Args:
      mean: μ of q; only m = μ₁ and the layout are used.
      expected_grad: E_q[∇ log f], shaped like ``mean.x``.
      expected_hessian: for ``NormalStats``, E_q[∂² log f / ∂x_i²] shaped like
        ``mean.x`` (the diagonal, used in both terms); for ``MVNStats``, the
        per-block E_q[∇² log f], shape (..., d, d) (symmetrised here).

    Returns:
      The natural gradient in the layout of ``mean``.

    Example:
        >>> mean = NormalStats(x=1.0, x_sq=2.0)  # m = 1, v = 1
        >>> [float(v) for v in natural_gradient(mean, 0.5, -2.0)]  # E[g] = 0.5, E[H] = -2
        [2.5, -1.0]
    """
    loc = mean.x
    if is_full(mean):
        hessian = common.symmetrize(jnp.asarray(expected_hessian))
        return MVNStats(
            x=expected_grad - jnp.einsum("...ij,...j->...i", hessian, loc),  # Eq. 10
            xxT=0.5 * hessian,  # Eq. 11
        )
    return NormalStats(
        x=expected_grad - expected_hessian * loc,  # Eq. 10, diag(E[H])
        x_sq=0.5 * expected_hessian,  # Eq. 11, elementwise
    )


def curvature_term(mean: GaussianStats, nat_grad: GaussianStats) -> Array:
    """½ tr(H Σ) from a natural gradient of :func:`natural_gradient` (its second part is H / 2).

    The delta method's E_q[log f] to second order, log f(m) + ½ tr(H(m) Σ): the
    expectation of log f's quadratic expansion at m, whose gradient in μ (H held)
    is the delta method's site parameter. Without it the delta ELBO is log f(m)
    plus the entropy, which grows with Σ: an ELBO guard then rejects the
    Newton steps that shrink Σ to -H⁻¹, and Laplace's fixed point is never reached.
    """
    if is_full(mean):
        return jnp.sum(nat_grad.xxT * (mean.xxT - common.outer(mean.x)))
    return jnp.sum(nat_grad.x_sq * (mean.x_sq - mean.x * mean.x))


def has_point_mass(family: Any) -> bool:
    """Whether :func:`point_mass` takes ``family``'s mean parameters (a Normal or MVN q)."""
    return family.stats_type in (NormalStats, MVNStats)


def point_mass(mean: GaussianStats) -> GaussianStats:
    """The mean parameters of the Gaussian with ``mean``'s mean and no spread (Σ → 0).

    Delta-method values there are log f(m) alone (:func:`curvature_term` vanishes):
    the log joint at the mean, the objective a Newton step climbs.
    """
    if is_full(mean):
        return MVNStats(x=mean.x, xxT=common.outer(mean.x))
    return NormalStats(x=mean.x, x_sq=mean.x * mean.x)


def total_log_factor(
    log_factor: Callable[[Array], ArrayLike],
) -> Callable[[Array], Array]:
    """Wrap ``log_factor`` so that it returns a scalar (the sum of its output)."""

    def total(x: Array) -> Array:
        return jnp.sum(log_factor(x))

    return total


def flatten_blocks(mean: Any) -> tuple[list[GaussianStats], Any]:
    """Split a pytree of Gaussian mean parameters into its independent blocks.

    ``mean`` is one ``NormalStats`` / ``MVNStats`` or any pytree (dict, tuple)
    of them: a factor touching several Gaussian variables, mean-field across
    them. Returns the blocks and the treedef that rebuilds the structure.

    Raises:
      TypeError: if a block is not Gaussian, or there is none.
    """
    blocks, treedef = jax.tree.flatten(
        mean, is_leaf=lambda node: isinstance(node, (NormalStats, MVNStats))
    )
    if not blocks:
        raise TypeError("expected Gaussian mean parameters, got an empty structure.")
    for block in blocks:
        is_full(block)
    return blocks, treedef


def joint_log_factor(
    log_factor: Callable[[Any], ArrayLike], treedef: Any
) -> Callable[[list[Array]], Array]:
    """Return ``xs -> sum(log_factor(structure rebuilt from the list xs))``."""

    def total(xs: list[Array]) -> Array:
        return jnp.sum(log_factor(jax.tree.unflatten(treedef, list(xs))))

    return total


def conditional(
    total: Callable[[list[Array]], Array], xs: list[Array], index: int
) -> Callable[[Array], Array]:
    """Return log f as a function of block ``index`` alone, the others fixed at ``xs``."""

    def partial(x: Array) -> Array:
        return total(list(xs[:index]) + [x] + list(xs[index + 1 :]))

    return partial


def block_hessian(
    log_factor: Callable[[Array], Array], x: Array, full: bool, separable: bool
) -> Array:
    """Return the blocks of ∇² log f at ``x`` that q's layout needs.

    For a diagonal q (``full=False``) the diagonal, shaped like ``x``; for a
    full-covariance q (``full=True``, ``x`` shaped (..., d)) the d x d blocks on
    the diagonal, shaped (..., d, d).

    Args:
      log_factor: scalar-valued log f.
      x: the point.
      full: the layout (see above).
      separable: promise that log f is a sum of terms each touching one element
        (diagonal) or one block (full), so that the wanted blocks are H·1 (one
        Hessian-vector product) or H·(e_j in every block) (d products). Without
        it the whole (n x n) Hessian is formed, n = x.size: exact for any log f
        but quadratic in n.
    """
    grad = jax.grad(log_factor)

    def hvp(direction: Array) -> Array:
        return jax.jvp(grad, (x,), (direction,))[1]

    if separable:
        if not full:
            return hvp(jnp.ones_like(x))
        d = x.shape[-1]
        eye = jnp.eye(d, dtype=x.dtype).reshape((d,) + (1,) * (x.ndim - 1) + (d,))
        basis = jnp.broadcast_to(eye, (d,) + x.shape)  # basis[j] = e_j in every block
        columns = jax.vmap(hvp)(basis)  # (d, ..., d): column j of every block
        return common.symmetrize(jnp.moveaxis(columns, 0, -1))
    n = x.size
    flat_hessian = jax.hessian(lambda flat: log_factor(flat.reshape(x.shape)))(
        x.reshape(n)
    )
    return layout_hessian(flat_hessian, x, full)


def layout_hessian(flat_hessian: Array, x: Array, full: bool) -> Array:
    """The blocks of the (n x n) Hessian of a block ``x`` (n = x.size) that q's layout needs:
    its diagonal shaped like ``x`` (``full=False``), or its d x d diagonal blocks (``full=True``)."""
    if not full:
        return jnp.diagonal(flat_hessian).reshape(x.shape)
    d = x.shape[-1]
    blocks = x.size // d
    per_block = flat_hessian.reshape(blocks, d, blocks, d)
    index = np.arange(blocks)
    return per_block[index, :, index, :].reshape(x.shape + (d,))


def value_grad_hessians(total: Callable[[list[Array]], Array], xs: list[Array], fulls: list[bool]) -> tuple:
    """``(total(xs), [∇_i total], [layout blocks of ∇²_ii total])`` from one trace of ``total``.

    The joint Hessian of the flattened blocks is one forward-over-reverse pass (its
    primal gives the value and the gradient), where one pass per block traced the
    factor's log density once per block (the Hessian's cost is n², n the blocks'
    total size: see ``JOINT_HESSIAN_MAX_SIZE``).
    """
    flat, unravel = jax.flatten_util.ravel_pytree(list(xs))

    def value_and_grad(v: Array) -> tuple:
        value, grad = jax.value_and_grad(lambda u: total(unravel(u)))(v)
        return grad, (value, grad)

    hessian, (value, grad) = jax.jacfwd(value_and_grad, has_aux=True)(flat)
    grads, hessians, offset = [], [], 0
    for x, full in zip(xs, fulls):
        block = slice(offset, offset + x.size)
        grads.append(grad[block].reshape(x.shape))
        hessians.append(layout_hessian(hessian[block, block], x, full))
        offset += x.size
    return value, grads, hessians


JOINT_HESSIAN_MAX_SIZE = 1024
"""Blocks of at most this many elements in all get their Hessians from one joint pass
(:func:`value_grad_hessians`: n² entries, 8 MiB in float64); larger ones one block at a time."""
