"""Sequential chain passes: one ``lax.scan`` each, depth O(T), work O(T d³).

Forward, the block Cholesky factorisation of the block-tridiagonal precision J,
run as an information filter over the Schur complements (pivots) P_t and the
filtered linear terms h̃_t:

    P_1 = J_11,   P_{t+1} = J_{t+1,t+1} - J_{t,t+1}ᵀ P_t⁻¹ J_{t,t+1},
    h̃_1 = h_1,    h̃_{t+1} = h_{t+1} - J_{t,t+1}ᵀ P_t⁻¹ h̃_t.

Backward, q as a backward Markov chain x_t | x_{t+1} ~ N(G_t x_{t+1} + b_t, P_t⁻¹)
(G_t = -P_t⁻¹ J_{t,t+1}, b_t = P_t⁻¹ h̃_t; see
:func:`blrppl.families.chain_gaussian.inference.backward_chain`), whose marginals
follow the Rauch-Tung-Striebel recursion in backward-conditional form,

    m_T = b_T,  Σ_T = P_T⁻¹,   m_t = G_t m_{t+1} + b_t,  Σ_t = G_t Σ_{t+1} G_tᵀ + P_t⁻¹

(Rauch, Tung & Striebel, AIAA J. 3(8), 1965; Särkkä, *Bayesian Filtering and
Smoothing*, 2013, Theorem 8.2), and whose samples are drawn by the same
recursion with noise (forward filtering, backward sampling).

:mod:`~blrppl.families.chain_gaussian.parallel` computes the same quantities by
associative scans; :mod:`~blrppl.families.chain_gaussian.scalar` is the d = 1
case on (T,) arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from blrppl._types import Array
from blrppl.families import common
from blrppl.families.chain_gaussian.linalg import (
    cholesky,
    cholesky_solve,
    matrix_transpose,
    matvec,
)


def forward_pass(h: Array, j_diag: Array, j_off: Array) -> tuple[Array, Array]:
    """Return the pivots P_t (T, d, d) and filtered linear terms h̃_t (T, d).

    Args:
        h: the linear term h_t, shape (T, d).
        j_diag: the diagonal precision blocks J_tt, shape (T, d, d).
        j_off: the off-diagonal blocks J_{t,t+1}, shape (T-1, d, d).
    """

    def step(carry, inputs):
        p_prev, h_prev = carry
        j_next, h_next, j_cross = inputs
        chol = cholesky(p_prev)
        gain = cholesky_solve(chol, j_cross)  # P_t⁻¹ J_{t,t+1}
        p_new = common.symmetrize(j_next - matrix_transpose(j_cross) @ gain)
        h_new = h_next - matrix_transpose(gain) @ h_prev
        return (p_new, h_new), (p_new, h_new)

    init = (j_diag[0], h[0])
    _, (p_rest, h_rest) = jax.lax.scan(step, init, (j_diag[1:], h[1:], j_off))
    return (
        jnp.concatenate([j_diag[:1], p_rest]),
        jnp.concatenate([h[:1], h_rest]),
    )


def smooth(gains: Array, offsets: Array, cond_cov: Array) -> tuple[Array, Array]:
    """Return the marginal means m_t (T, d) and covariances Σ_t (T, d, d).

    Args:
        gains: G_t of the backward conditionals, shape (T, d, d) (G_T unused).
        offsets: b_t, shape (T, d).
        cond_cov: the conditional covariances P_t⁻¹, shape (T, d, d).
    """

    def step(carry, inputs):
        mean_next, cov_next = carry
        gain, offset, q = inputs
        mean = matvec(gain, mean_next) + offset
        cov = common.symmetrize(gain @ cov_next @ matrix_transpose(gain) + q)
        return (mean, cov), (mean, cov)

    last = (offsets[-1], cond_cov[-1])
    _, (means, covs) = jax.lax.scan(
        step, last, (gains[:-1], offsets[:-1], cond_cov[:-1]), reverse=True
    )
    means = jnp.concatenate([means, offsets[-1:]])
    covs = jnp.concatenate([covs, cond_cov[-1:]])
    return means, covs


def sample_backward(gains: Array, drift: Array) -> Array:
    """Return paths x_T = c_T, x_t = G_t x_{t+1} + c_t by a reverse ``lax.scan``.

    Args:
        gains: G_t, shape (T, d, d) (G_T unused).
        drift: c_t = b_t + L_t⁻ᵀ ε_t for ``num`` draws, shape (num, T, d).

    Returns:
        The paths, shape (num, T, d).
    """

    def step(x_next, inputs):
        gain, b = inputs
        x = matvec(gain, x_next) + b
        return x, x

    last = drift[:, -1]
    _, xs = jax.lax.scan(
        step, last, (gains[:-1], jnp.moveaxis(drift[:, :-1], 1, 0)), reverse=True
    )
    return jnp.concatenate([jnp.moveaxis(xs, 0, 1), last[:, None]], axis=1)
