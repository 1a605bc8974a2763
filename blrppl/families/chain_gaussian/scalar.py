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
as much as a plain Kalman filter pass. The sequential passes read λ and form
J's blocks inside their loops, one step at a time, and :func:`moments` writes
the mean parameters from its backward loop: on a CPU a long chain's passes
cost about as much as the arrays of length T they write, so they write few.
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


def _coupling(natural: ChainGaussianStats, t: Array) -> Array:
    """J_{t,t+1} = -λ_{x_next, t} read inside a loop; 0 outside 0 <= t < T - 1 (the chain's ends)."""
    x_next = natural.x_next[:, 0, 0]
    size = x_next.shape[0]
    if size == 0:
        return jnp.zeros((), x_next.dtype)
    inside = (t >= 0) & (t < size)
    return jnp.where(inside, -x_next[jnp.clip(t, 0, size - 1)], 0.0)


def forward_pass(natural: ChainGaussianStats, method: str) -> tuple[Array, Array]:
    """Return the pivots P_t (T,) and h̃_t (T,) of one scalar chain (either method)."""
    if method == "parallel":
        h, j_diag, j_off = scalar_blocks(natural)

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
        t, p_prev, h_prev = carry
        xx_t, h_next = inputs
        j_cross = _coupling(natural, t - 1)  # J_{t-1,t}; 0 at t = 0
        gain = j_cross / p_prev  # P_{t-1}⁻¹ J_{t-1,t}
        p_new, h_new = -2.0 * xx_t - j_cross * gain, h_next - gain * h_prev
        return (t + 1, p_new, h_new), (p_new, h_new)

    h = natural.x[:, 0]
    init = (jnp.zeros((), jnp.int32), jnp.ones_like(h[0]), jnp.zeros_like(h[0]))
    _, (pivots, h_tilde) = jax.lax.scan(step, init, (natural.xx[:, 0, 0], h))
    return pivots, h_tilde


def is_positive_definite(natural: ChainGaussianStats) -> Array:
    """Return whether J > 0 (every pivot P_t > 0): a forward pass carrying the verdict."""

    def step(carry, xx_t):
        t, p_prev, ok = carry
        j_cross = _coupling(natural, t - 1)
        p_new = -2.0 * xx_t - j_cross * (j_cross / p_prev)
        return (t + 1, p_new, ok & (p_new > 0)), None

    xx = natural.xx[:, 0, 0]
    init = (jnp.zeros((), jnp.int32), jnp.ones_like(xx[0]), jnp.ones((), bool))
    (_, _, ok), _ = jax.lax.scan(step, init, xx)
    return ok


def log_normalizer(pivots: Array, h_tilde: Array) -> Array:
    """A(λ) = Σ_t [½ h̃_t² / P_t - ½ log P_t] + (T / 2) log 2π."""
    return (
        0.5 * jnp.sum(h_tilde * (h_tilde / pivots))
        - 0.5 * jnp.sum(jnp.log(pivots))
        + 0.5 * pivots.shape[0] * math.log(2 * math.pi)
    )


def backward_chain(
    natural: ChainGaussianStats, method: str
) -> tuple[Array, Array, Array, Array]:
    """Return (pivots P_t, gains G_t, offsets b_t, A(λ)) of one scalar chain.

    The d = 1 form of :func:`blrppl.families.chain_gaussian.inference.backward_chain`:
    shapes (T,), (T,) with G_T = 0, (T,) and ().
    """
    j_off = scalar_blocks(natural)[2]
    pivots, h_tilde = forward_pass(natural, method)
    offsets = h_tilde / pivots
    gains = jnp.concatenate([-j_off / pivots[:-1], jnp.zeros_like(pivots[:1])])
    return pivots, gains, offsets, log_normalizer(pivots, h_tilde)


def moments(natural: ChainGaussianStats, method: str) -> tuple[Array, Array, Array, Array, Array]:
    """Return μ = (E x_t (T,), E x_t² (T,), E x_t x_{t+1} (T-1,)), A(λ) and whether J > 0.

    One forward and one backward pass, with the arithmetic of
    :func:`backward_chain` and :func:`smooth` (the same numbers); the
    sequential backward loop writes μ itself, so the pair writes five arrays
    of length T.
    """
    pivots, h_tilde = forward_pass(natural, method)
    log_norm = log_normalizer(pivots, h_tilde)
    positive = jnp.all(pivots > 0)
    if method == "parallel":
        _, gains, offsets, _ = backward_chain(natural, method)
        means, variances, cross = smooth(pivots, gains, offsets, method)
        return means, variances + means * means, cross + means[:-1] * means[1:], log_norm, positive

    def step(carry, inputs):
        t, mean_next, var_next = carry
        pivot, h_t = inputs
        gain = -_coupling(natural, t) / pivot  # G_t; 0 at t = T - 1
        mean = gain * mean_next + h_t / pivot
        var = gain * gain * var_next + 1.0 / pivot
        stats = (mean, var + mean * mean, gain * var_next + mean * mean_next)
        return (t - 1, mean, var), stats

    last = jnp.asarray(pivots.shape[0] - 1, jnp.int32)
    zero = jnp.zeros_like(pivots[0])
    _, (x, xx, x_next) = jax.lax.scan(step, (last, zero, zero), (pivots, h_tilde), reverse=True)
    return x, xx, x_next[:-1], log_norm, positive


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
