"""Parallel-in-time chain passes: ``lax.associative_scan``, depth O(log T).

The same quantities as :mod:`~blrppl.families.chain_gaussian.sequential`, posed
as all-prefix-sums problems in the style of Särkkä & García-Fernández,
*Temporal parallelization of Bayesian smoothers*, IEEE TAC 66(1):299-306 (2021),
arXiv:1905.13002.

* Forward: the elements are pairwise Gaussian potentials ψ_t(x_{t-1}, x_t) in
  information form (:class:`Potential`); combining two integrates out their
  shared state (:func:`combine_potentials`), and prefix t is the potential of
  x_t with x_1..x_{t-1} integrated out, whose precision and linear term are
  the pivot P_t and h̃_t of the sequential pass. These play the role of the
  paper's filtering elements, here over pairs of states in information form,
  so no dynamics model is needed.
* Backward: the elements are the affine maps (G_t, b_t, P_t⁻¹) of the backward
  conditionals x_t | x_{t+1} (the paper's smoothing elements (E, g, L)); their
  reverse prefix compositions (:func:`compose_affine`) give the marginal means
  and covariances, and, without covariances, the sampled paths.
"""

from __future__ import annotations

from typing import NamedTuple

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


class Potential(NamedTuple):
    """A Gaussian potential over a pair of states (u, v) = (x_i, x_j), information form.

        ψ(u, v) = exp(-½ [u; v]ᵀ [[A, B], [Bᵀ, C]] [u; v] + aᵀu + cᵀv).

    Fields are batched over leading axes: A, B, C (..., d, d); a, c (..., d).
    """

    A: Array
    B: Array
    C: Array
    a: Array
    c: Array


def combine_potentials(first: Potential, second: Potential) -> Potential:
    """Integrate out the shared x_j of ψ₁(x_i, x_j) ψ₂(x_j, x_k) (associative).

    With S = C₁ + A₂ (the conditional precision of x_j given x_i and x_k, positive
    definite whenever J is) and r = c₁ + a₂, completing the square gives

        A = A₁ - B₁S⁻¹B₁ᵀ,  B = -B₁S⁻¹B₂,  C = C₂ - B₂ᵀS⁻¹B₂,
        a = a₁ - B₁S⁻¹r,    c = c₂ - B₂ᵀS⁻¹r

    (the role of the filtering-element combination of Särkkä & García-Fernández
    2021, here in information form).
    """
    chol = cholesky(common.symmetrize(first.C + second.A))
    r = first.c + second.a
    rhs = jnp.concatenate([matrix_transpose(first.B), second.B, r[..., None]], axis=-1)
    sol = cholesky_solve(chol, rhs)
    d = first.A.shape[-1]
    s_b1, s_b2, s_r = sol[..., :d], sol[..., d : 2 * d], sol[..., 2 * d]
    return Potential(
        A=common.symmetrize(first.A - first.B @ s_b1),
        B=-first.B @ s_b2,
        C=common.symmetrize(second.C - matrix_transpose(second.B) @ s_b2),
        a=first.a - matvec(first.B, s_r),
        c=second.c - matvec(matrix_transpose(second.B), s_r),
    )


def forward_pass(h: Array, j_diag: Array, j_off: Array) -> tuple[Array, Array]:
    """Return the pivots P_t (T, d, d) and h̃_t (T, d) by ``lax.associative_scan``.

    Args:
        h: the linear term h_t, shape (T, d).
        j_diag: the diagonal precision blocks J_tt, shape (T, d, d).
        j_off: the off-diagonal blocks J_{t,t+1}, shape (T-1, d, d).
    """
    # Element t is the potential of (x_{t-1}, x_t) holding J_tt, h_t and the
    # coupling J_{t-1,t}; a dummy x_0 (zero blocks) starts the chain. Prefix t then
    # is the potential of x_t with x_1..x_{t-1} integrated out: C = P_t, c = h̃_t.
    zeros = jnp.zeros_like(j_diag)
    elements = Potential(
        A=zeros,
        B=jnp.concatenate([jnp.zeros_like(j_diag[:1]), j_off]),
        C=j_diag,
        a=jnp.zeros_like(h),
        c=h,
    )
    prefixes = jax.lax.associative_scan(combine_potentials, elements)
    return prefixes.C, prefixes.c


def compose_affine(
    later: tuple[Array, Array, Array], earlier: tuple[Array, Array, Array]
) -> tuple[Array, Array, Array]:
    """Compose Gaussian affine maps, the later step's first; an associative operator.

    (G_e, b_e, Q_e) ∘ (G_l, b_l, Q_l) maps the mean m ↦ G_e (G_l m + b_l) + b_e
    and the covariance Σ ↦ G_e (G_l Σ G_lᵀ + Q_l) G_eᵀ + Q_e.
    """
    g_l, b_l, q_l = later
    g_e, b_e, q_e = earlier
    return (
        g_e @ g_l,
        matvec(g_e, b_l) + b_e,
        common.symmetrize(g_e @ q_l @ matrix_transpose(g_e) + q_e),
    )


def smooth(gains: Array, offsets: Array, cond_cov: Array) -> tuple[Array, Array]:
    """Return the marginal means m_t (T, d) and covariances Σ_t (T, d, d).

    A reverse associative scan of the affine maps (G_t, b_t, P_t⁻¹).


    Args:
        gains: G_t of the backward conditionals, shape (T, d, d), with G_T = 0.
        offsets: b_t, shape (T, d).
        cond_cov: the conditional covariances P_t⁻¹, shape (T, d, d).
    """
    _, means, covs = jax.lax.associative_scan(
        compose_affine, (gains, offsets, cond_cov), reverse=True
    )
    return means, covs


def sample_backward(gains: Array, drift: Array) -> Array:
    """Return paths x_T = c_T, x_t = G_t x_{t+1} + c_t by a reverse associative scan.

    Args:
        gains: G_t, shape (T, d, d), with G_T = 0.
        drift: c_t = b_t + L_t⁻ᵀ ε_t for ``num`` draws, shape (num, T, d).

    Returns:
        The paths, shape (num, T, d).
    """

    def compose(later, earlier):
        return earlier[0] @ later[0], matvec(earlier[0], later[1]) + earlier[1]

    num = drift.shape[0]
    g = jnp.broadcast_to(gains, (num,) + gains.shape)
    _, xs = jax.lax.associative_scan(compose, (g, drift), reverse=True, axis=1)
    return xs
