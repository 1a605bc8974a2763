"""Dense linear algebra on stacks of small d x d blocks, unrolled for d <= 4.

The chain passes factor one d x d block per time step inside ``lax.scan`` or
``lax.associative_scan``. For the tiny blocks of state-space models (d = 1, 2,
3) a LAPACK call there costs microseconds, far more than its arithmetic, so
blocks up to :data:`SMALL_BLOCK` are factored by Cholesky and triangular
substitution unrolled into elementwise ``jnp`` operations (which XLA fuses);
larger blocks call LAPACK. Every function works on the last two axes and
broadcasts over any leading ones.

The unrolled Cholesky is the column-by-column (Cholesky-Crout) recurrence

    L_jj = sqrt(M_jj - Σ_{k<j} L_jk²),
    L_ij = (M_ij - Σ_{k<j} L_ik L_jk) / L_jj   (i > j),

and the solves are row-oriented forward and back substitution (Golub & Van
Loan, *Matrix Computations*, 4th ed. (2013), Sec. 3.1 and Sec. 4.2). A block
that is not positive definite gives NaN entries in its factor (the square root
of a negative pivot), which :func:`is_positive_definite` reads.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

from blrppl._types import Array
from blrppl.families import common

SMALL_BLOCK = 4
"""Largest block size d factored by unrolled arithmetic rather than LAPACK."""


def matvec(matrix: Array, vector: Array) -> Array:
    """Return M v, batched: ``matrix`` (..., m, n) times ``vector`` (..., n)."""
    return jnp.einsum("...ij,...j->...i", matrix, vector)


def matrix_transpose(matrix: Array) -> Array:
    """Return Mᵀ, swapping the last two axes of ``matrix`` (..., m, n)."""
    return jnp.swapaxes(matrix, -1, -2)


def cholesky(matrix: Array) -> Array:
    """Return the lower Cholesky factor L (L Lᵀ = M) of ``matrix`` (..., d, d).

    Blocks with d <= :data:`SMALL_BLOCK` use the unrolled recurrence of the
    module docstring (d = 1 is a square root); larger ones
    ``jnp.linalg.cholesky``. Entries are NaN where M is not positive definite.
    """
    d = matrix.shape[-1]
    if d > SMALL_BLOCK:
        return jnp.linalg.cholesky(matrix)
    if d == 1:
        return jnp.sqrt(matrix)
    low = [[None] * d for _ in range(d)]
    for j in range(d):
        diag = matrix[..., j, j] - sum((low[j][k] ** 2 for k in range(j)), 0.0)
        low[j][j] = jnp.sqrt(diag)
        for i in range(j + 1, d):
            products = (low[i][k] * low[j][k] for k in range(j))
            off = matrix[..., i, j] - sum(products, 0.0)
            low[i][j] = off / low[j][j]
    zero = jnp.zeros_like(low[0][0])
    rows = [
        jnp.stack([low[i][j] if j <= i else zero for j in range(d)], -1)
        for i in range(d)
    ]
    return jnp.stack(rows, -2)


def solve_lower_triangular(chol: Array, rhs: Array, transpose: bool = False) -> Array:
    """Solve L X = B, or Lᵀ X = B if ``transpose``, for lower-triangular L.

    Args:
        chol: L, shape (..., d, d).
        rhs: B, shape (..., d, k).
        transpose: solve with Lᵀ (back substitution) instead of L (forward).

    Returns:
        X, shape (..., d, k).
    """
    d = chol.shape[-1]
    if d > SMALL_BLOCK:
        return solve_triangular(
            matrix_transpose(chol) if transpose else chol, rhs, lower=not transpose
        )
    # Row i of Lᵀ is column i of L: substitute backwards through the columns.
    factor = matrix_transpose(chol) if transpose else chol
    rows: list = [None] * d
    order = range(d - 1, -1, -1) if transpose else range(d)
    for i in order:
        done = range(i + 1, d) if transpose else range(i)
        products = (factor[..., i, k][..., None] * rows[k] for k in done)
        row = rhs[..., i, :] - sum(products, 0.0)
        rows[i] = row / chol[..., i, i][..., None]
    return jnp.stack(rows, -2)


def cholesky_solve(chol: Array, rhs: Array) -> Array:
    """Solve M X = B from the lower Cholesky factor L of M: X = L⁻ᵀ (L⁻¹ B).

    ``jax.scipy.linalg.cho_solve`` with a lower factor, unrolled for blocks of
    d <= :data:`SMALL_BLOCK`. Shapes: ``chol`` (..., d, d), ``rhs`` (..., d, k).
    """
    if chol.shape[-1] > SMALL_BLOCK:
        return cho_solve((chol, True), rhs)
    half = solve_lower_triangular(chol, rhs)
    return solve_lower_triangular(chol, half, transpose=True)


def inverse_from_cholesky(chol: Array) -> Array:
    """Return M⁻¹ = L⁻ᵀ L⁻¹ from the lower Cholesky factor L of M, shape (..., d, d)."""
    eye = jnp.broadcast_to(jnp.eye(chol.shape[-1], dtype=chol.dtype), chol.shape)
    inv_chol = solve_lower_triangular(chol, eye)
    return matrix_transpose(inv_chol) @ inv_chol


def is_positive_definite(matrix: Array) -> Array:
    """Return whether the symmetric part of ``matrix`` (..., d, d) is positive definite.

    Batch shaped: true where the Cholesky factor of (M + Mᵀ) / 2 is finite with
    a positive diagonal.
    """
    chol = cholesky(common.symmetrize(matrix))
    finite = jnp.all(jnp.isfinite(chol), axis=(-2, -1))
    return finite & jnp.all(jnp.diagonal(chol, axis1=-2, axis2=-1) > 0, axis=-1)
