"""Scalar chains (d = 1): the sequential and parallel passes on (T,) arrays.

Every block is a number, so P_t⁻¹ is a division and the recursions of
:mod:`~blrppl.families.chain_gaussian.sequential` become

    P_{t+1} = J_{t+1,t+1} - J_{t,t+1}² / P_t,
    h̃_{t+1} = h_{t+1} - J_{t,t+1} h̃_t / P_t,
    G_t = -J_{t,t+1} / P_t,   b_t = h̃_t / P_t,
    m_t = G_t m_{t+1} + b_t,   σ²_t = G_t² σ²_{t+1} + 1 / P_t,
    Cov(x_t, x_{t+1}) = G_t σ²_{t+1},

with the 1 x 1 forms of the potentials and affine maps of
:mod:`~blrppl.families.chain_gaussian.parallel` for ``method="parallel"``. These
are the hot path of local level models: plain arithmetic keeps both the
sequential loop and the associative-scan graph small, so a smoother costs about
as much as a plain Kalman filter pass.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from blrppl._types import Array
from blrppl.families.chain_gaussian.stats import ChainGaussianStats


def is_scalar(natural: ChainGaussianStats) -> bool:
    """Return whether the states of ``natural`` (..., T, d) are scalars (d = 1)."""
    return natural.x.shape[-1] == 1


def scalar_blocks(natural: ChainGaussianStats) -> tuple[Array, Array, Array]:
    """Return (h_t, J_tt, J_{t,t+1}) of one scalar chain, shapes (T,), (T,), (T-1,)."""
    return natural.x[:, 0], -2.0 * natural.xx[:, 0, 0], -natural.x_next[:, 0, 0]


def forward_pass(
    h: Array, j_diag: Array, j_off: Array, method: str
) -> tuple[Array, Array]:
    """Return the pivots P_t (T,) and h̃_t (T,) of a scalar chain (either method)."""
    if method == "parallel":
        # The pairwise potentials of ``parallel.forward_pass`` with 1 x 1 blocks.
        def combine(first, second):
            a1, b1, c1, u1, v1 = first
            a2, b2, c2, u2, v2 = second
            s, r = c1 + a2, v1 + u2
            return (
                a1 - b1 * b1 / s,
                -b1 * b2 / s,
                c2 - b2 * b2 / s,
                u1 - b1 * r / s,
                v2 - b2 * r / s,
            )

        zeros = jnp.zeros_like(h)
        couplings = jnp.concatenate([jnp.zeros_like(h[:1]), j_off])
        elements = (zeros, couplings, j_diag, zeros, h)
        prefixes = jax.lax.associative_scan(combine, elements)
        return prefixes[2], prefixes[4]

    def step(carry, inputs):
        p_prev, h_prev = carry
        j_next, h_next, j_cross = inputs
        gain = j_cross / p_prev  # P_t⁻¹ J_{t,t+1}
        p_new, h_new = j_next - j_cross * gain, h_next - gain * h_prev
        return (p_new, h_new), (p_new, h_new)

    init = (j_diag[0], h[0])
    _, (p_rest, h_rest) = jax.lax.scan(step, init, (j_diag[1:], h[1:], j_off))
    return jnp.concatenate([j_diag[:1], p_rest]), jnp.concatenate([h[:1], h_rest])


def backward_chain(
    natural: ChainGaussianStats, method: str
) -> tuple[Array, Array, Array, Array]:
    """Return (pivots P_t, gains G_t, offsets b_t, A(λ)) of one scalar chain.

    The d = 1 form of :func:`blrppl.families.chain_gaussian.inference.backward_chain`:
    shapes (T,), (T,) with G_T = 0, (T,) and ().
    """
    h, j_diag, j_off = scalar_blocks(natural)
    pivots, h_tilde = forward_pass(h, j_diag, j_off, method)
    offsets = h_tilde / pivots
    gains = jnp.concatenate([-j_off / pivots[:-1], jnp.zeros_like(pivots[:1])])
    log_norm = (
        0.5 * jnp.sum(h_tilde * offsets)
        - 0.5 * jnp.sum(jnp.log(pivots))
        + 0.5 * h.shape[0] * math.log(2 * math.pi)
    )
    return pivots, gains, offsets, log_norm


def smooth(
    pivots: Array, gains: Array, offsets: Array, method: str
) -> tuple[Array, Array, Array]:
    """Return the means (T,), variances (T,) and Cov(x_t, x_{t+1}) (T-1,) of q."""
    cond_var = 1.0 / pivots
    if method == "parallel":

        def compose(later, earlier):
            g_l, b_l, q_l = later
            g_e, b_e, q_e = earlier
            return g_e * g_l, g_e * b_l + b_e, g_e * g_e * q_l + q_e

        _, means, variances = jax.lax.associative_scan(
            compose, (gains, offsets, cond_var), reverse=True
        )
    else:

        def step(carry, inputs):
            mean_next, var_next = carry
            gain, offset, q = inputs
            mean, var = gain * mean_next + offset, gain * gain * var_next + q
            return (mean, var), (mean, var)

        last = (offsets[-1], cond_var[-1])
        _, (means, variances) = jax.lax.scan(
            step, last, (gains[:-1], offsets[:-1], cond_var[:-1]), reverse=True
        )
        means = jnp.concatenate([means, offsets[-1:]])
        variances = jnp.concatenate([variances, cond_var[-1:]])
    return means, variances, gains[:-1] * variances[1:]
