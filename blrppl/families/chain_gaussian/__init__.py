"""The chain Gaussian family: a Gaussian over x_1..x_T with block-tridiagonal precision.

    q(x) ∝ exp(Σ_t h_tᵀ x_t - ½ Σ_t x_tᵀ J_tt x_t - Σ_t x_tᵀ J_{t,t+1} x_{t+1}),

    T(x) = (x_t,  x_t x_tᵀ,  x_t x_{t+1}ᵀ),       shapes (T, d), (T, d, d), (T-1, d, d),
    λ    = (h_t,  -J_tt / 2,  -J_{t,t+1}),
    μ    = (E x_t,  E x_t x_tᵀ,  E x_t x_{t+1}ᵀ),
    A(λ) = ½ hᵀ J⁻¹ h - ½ log|J| + (T d / 2) log 2π,   h(x) = 1,

with J_tt = -(λ₂ + λ₂ᵀ)_t, so only the symmetric part of λ₂ matters. Every routine
works on d x d blocks in O(T d³); no dense (T d) x (T d) matrix is formed.

Two equivalent algorithms compute A and μ (``method=``):

* ``"sequential"``: block Cholesky of J, run forwards as an information filter
  (Schur complements P_t, h̃_t) and backwards as an RTS-style smoother, each one
  ``lax.scan`` (depth O(T)).
* ``"parallel"``: the same quantities by two ``lax.associative_scan`` passes in
  the style of Särkkä & García-Fernández, *Temporal parallelization of Bayesian
  smoothers*, IEEE TAC 66 (2021): the forward elements are pairwise Gaussian
  potentials whose combination integrates out the shared state, the backward
  elements are the affine maps (E, g, L) of its parallel RTS smoother (depth
  O(log T)). The forward elements are in information form over pairs of states,
  so no dynamics model is needed; the filtering elements of the paper are the
  same objects in moment form.

``CHAIN_GAUSSIAN`` uses the sequential pass, ``CHAIN_GAUSSIAN_PARALLEL`` the
parallel one; the module functions take ``method=`` directly (engines select
the parallel one with ``families={site: "ChainGaussianParallel"}``). Any leading
dimensions of the statistics are batch dimensions (``vmap``-ed). Blocks of
d <= ``SMALL_BLOCK`` are factored with unrolled elementwise arithmetic instead
of per-step LAPACK calls, and scalar chains (d = 1) run on (T,) arrays: a
local level's smoother then costs about as much as a plain Kalman filter pass.

The backward pass writes q as a backward Markov chain,

    x_T ~ N(P_T⁻¹ h̃_T, P_T⁻¹),   x_t | x_{t+1} ~ N(P_t⁻¹ (h̃_t - J_{t,t+1} x_{t+1}), P_t⁻¹),

    P_1 = J_11,   P_{t+1} = J_{t+1,t+1} - J_{t,t+1}ᵀ P_t⁻¹ J_{t,t+1},
    h̃_1 = h_1,    h̃_{t+1} = h_{t+1} - J_{t,t+1}ᵀ P_t⁻¹ h̃_t,

and A(λ) = Σ_t [½ h̃_tᵀ P_t⁻¹ h̃_t - ½ log|P_t|] + (T d / 2) log 2π.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.linalg import cho_solve as _lapack_cho_solve
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import _util
from blrppl.families.base import ExpFamily

METHODS = ("sequential", "parallel")


class ChainGaussianStats(NamedTuple):
    """T(x) = (x_t, x_t x_tᵀ, x_t x_{t+1}ᵀ): shapes (..., T, d), (..., T, d, d), (..., T-1, d, d).

    As natural parameters: (h, -J_tt / 2, -J_{t,t+1}); as mean parameters the
    expectations of the statistics.
    """

    x: Array
    xx: Array
    x_next: Array


def vmap_over_batch(fn: Callable, tree, event_ndim: tuple[int, ...], batch_shape):
    """Apply ``fn`` (written for one chain) over the leading ``batch_shape`` of ``tree``.

    ``event_ndim`` gives the unbatched rank of each leaf of ``tree``; the leading
    batch dimensions are flattened, ``vmap``-ed and restored on every output leaf.
    """
    batch_shape = tuple(batch_shape)
    if not batch_shape:
        return fn(tree)
    leaves, treedef = jax.tree.flatten(tree)
    size = math.prod(batch_shape)
    flat = [
        jnp.broadcast_to(
            leaf, batch_shape + jnp.shape(leaf)[jnp.ndim(leaf) - n :]
        ).reshape((size,) + jnp.shape(leaf)[jnp.ndim(leaf) - n :])
        for leaf, n in zip(leaves, event_ndim)
    ]
    out = jax.vmap(lambda *ls: fn(jax.tree.unflatten(treedef, ls)))(*flat)
    return jax.tree.map(lambda a: a.reshape(batch_shape + a.shape[1:]), out)


def _batch_shape(natural: ChainGaussianStats) -> tuple[int, ...]:
    return tuple(jnp.shape(natural.x)[:-2])


_STATS_NDIM = (2, 3, 3)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")


def _mv(matrix: Array, vector: Array) -> Array:
    return jnp.einsum("...ij,...j->...i", matrix, vector)


def _mT(matrix: Array) -> Array:
    return jnp.swapaxes(matrix, -1, -2)


# Small-block linear algebra. The passes factor one d x d block per time step
# inside ``lax.scan``; LAPACK calls there cost microseconds each for the tiny
# blocks of state-space models (d = 1, 2, 3), far more than the arithmetic, so
# blocks up to ``SMALL_BLOCK`` use Cholesky and substitution unrolled into
# elementwise jnp operations (which XLA fuses); larger blocks use LAPACK.

SMALL_BLOCK = 4


def _cholesky(matrix: Array) -> Array:
    """Lower Cholesky factor over the last two axes (NaN where not positive definite)."""
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
            off = matrix[..., i, j] - sum((low[i][k] * low[j][k] for k in range(j)), 0.0)
            low[i][j] = off / low[j][j]
    zero = jnp.zeros_like(low[0][0])
    return jnp.stack(
        [jnp.stack([low[i][j] if j <= i else zero for j in range(d)], -1) for i in range(d)], -2
    )


def _solve_lower(chol: Array, rhs: Array, transpose: bool = False) -> Array:
    """Solve L X = B (or Lᵀ X = B) for lower-triangular L (..., d, d), B (..., d, k)."""
    d = chol.shape[-1]
    if d > SMALL_BLOCK:
        return solve_triangular(_mT(chol) if transpose else chol, rhs, lower=not transpose)
    # Row i of Lᵀ is column i of L: substitute backwards through the columns.
    factor = _mT(chol) if transpose else chol
    rows: list = [None] * d
    order = range(d - 1, -1, -1) if transpose else range(d)
    for i in order:
        done = range(i + 1, d) if transpose else range(i)
        row = rhs[..., i, :] - sum((factor[..., i, k][..., None] * rows[k] for k in done), 0.0)
        rows[i] = row / chol[..., i, i][..., None]
    return jnp.stack(rows, -2)


def _cho_solve(factor: tuple[Array, bool], rhs: Array) -> Array:
    """``jax.scipy.linalg.cho_solve`` for a lower factor, unrolled for small blocks."""
    chol, lower = factor
    if chol.shape[-1] > SMALL_BLOCK or not lower:
        return _lapack_cho_solve(factor, rhs)
    return _solve_lower(chol, _solve_lower(chol, rhs), transpose=True)


def _cholesky_inverse(chol: Array) -> Array:
    """M⁻¹ from the lower Cholesky factor of M, symmetrised."""
    eye = jnp.broadcast_to(jnp.eye(chol.shape[-1], dtype=chol.dtype), chol.shape)
    inv_chol = _solve_lower(chol, eye)
    return _mT(inv_chol) @ inv_chol


def _positive_definite(matrix: Array) -> Array:
    """Batch-shaped bool: the symmetric part of ``matrix`` is positive definite."""
    chol = _cholesky(_util.symmetrize(matrix))
    finite = jnp.all(jnp.isfinite(chol), axis=(-2, -1))
    return finite & jnp.all(jnp.diagonal(chol, axis1=-2, axis2=-1) > 0, axis=-1)


def _blocks(natural: ChainGaussianStats) -> tuple[Array, Array, Array]:
    """Return (h (T, d), J_tt (T, d, d), J_{t,t+1} (T-1, d, d)) of one chain."""
    return natural.x, -(natural.xx + _mT(natural.xx)), -natural.x_next


# Forward pass: Schur complements (P_t, h̃_t) of the block Cholesky factorisation.


def _forward_sequential(h: Array, j_diag: Array, j_off: Array) -> tuple[Array, Array]:
    def step(carry, inputs):
        p_prev, h_prev = carry
        j_next, h_next, j_cross = inputs
        chol = _cholesky(p_prev)
        gain = _cho_solve((chol, True), j_cross)  # P_t⁻¹ J_{t,t+1}
        p_new = _util.symmetrize(j_next - _mT(j_cross) @ gain)
        h_new = h_next - _mT(gain) @ h_prev
        return (p_new, h_new), (p_new, h_new)

    init = (j_diag[0], h[0])
    _, (p_rest, h_rest) = jax.lax.scan(step, init, (j_diag[1:], h[1:], j_off))
    return (
        jnp.concatenate([j_diag[:1], p_rest]),
        jnp.concatenate([h[:1], h_rest]),
    )


class _Potential(NamedTuple):
    """exp(-½ [u; v]ᵀ [[A, B], [Bᵀ, C]] [u; v] + aᵀu + cᵀv) over (x_i, x_j), batched."""

    A: Array
    B: Array
    C: Array
    a: Array
    c: Array


def _combine_potentials(first: _Potential, second: _Potential) -> _Potential:
    """Integrate out the shared state of ψ₁(x_i, x_j) ψ₂(x_j, x_k); an associative operator.

    With S = C₁ + A₂ (the conditional precision of x_j given x_i and x_k, positive
    definite whenever J is) and r = c₁ + a₂, completing the square gives
    A = A₁ - B₁S⁻¹B₁ᵀ, B = -B₁S⁻¹B₂, C = C₂ - B₂ᵀS⁻¹B₂, a = a₁ - B₁S⁻¹r,
    c = c₂ - B₂ᵀS⁻¹r (the role of the filtering-element combination of
    Särkkä & García-Fernández 2021, here in information form).
    """
    chol = _cholesky(_util.symmetrize(first.C + second.A))
    r = first.c + second.a
    rhs = jnp.concatenate([_mT(first.B), second.B, r[..., None]], axis=-1)
    sol = _cho_solve((chol, True), rhs)
    d = first.A.shape[-1]
    s_b1, s_b2, s_r = sol[..., :d], sol[..., d : 2 * d], sol[..., 2 * d]
    return _Potential(
        A=_util.symmetrize(first.A - first.B @ s_b1),
        B=-first.B @ s_b2,
        C=_util.symmetrize(second.C - _mT(second.B) @ s_b2),
        a=first.a - _mv(first.B, s_r),
        c=second.c - _mv(_mT(second.B), s_r),
    )


def _forward_parallel(h: Array, j_diag: Array, j_off: Array) -> tuple[Array, Array]:
    # Element t is the potential of (x_{t-1}, x_t) holding J_tt, h_t and the
    # coupling J_{t-1,t}; a dummy x_0 (zero blocks) starts the chain. Prefix t then
    # is the potential of x_t with x_1..x_{t-1} integrated out: C = P_t, c = h̃_t.
    zeros = jnp.zeros_like(j_diag)
    elements = _Potential(
        A=zeros,
        B=jnp.concatenate([jnp.zeros_like(j_diag[:1]), j_off]),
        C=j_diag,
        a=jnp.zeros_like(h),
        c=h,
    )
    prefixes = jax.lax.associative_scan(_combine_potentials, elements)
    return prefixes.C, prefixes.c


def _backward_chain(natural: ChainGaussianStats, method: str):
    """Return (chol P_t, gains G_t, offsets b_t): x_t | x_{t+1} ~ N(G_t x_{t+1} + b_t, P_t⁻¹).

    G_t = -P_t⁻¹ J_{t,t+1} (zero for t = T), b_t = P_t⁻¹ h̃_t, and the
    log normalizer A(λ); shapes (T, d, d), (T, d, d), (T, d), ().
    """
    h, j_diag, j_off = _blocks(natural)
    forward = _forward_parallel if method == "parallel" else _forward_sequential
    pivots, h_tilde = forward(h, j_diag, j_off)
    chol = _cholesky(pivots)
    offsets = _cho_solve((chol, True), h_tilde[..., None])[..., 0]
    gains = -_cho_solve((chol[:-1], True), j_off)
    gains = jnp.concatenate([gains, jnp.zeros_like(gains[:1])])
    num_steps, d = h.shape
    log_norm = (
        0.5 * jnp.sum(h_tilde * offsets)
        - 0.5 * jnp.sum(_util.cholesky_log_det(chol))
        + 0.5 * num_steps * d * math.log(2 * math.pi)
    )
    return chol, gains, offsets, log_norm


def _affine_compose(later, earlier):
    """(G_e, b_e, Q_e) ∘ (G_l, b_l, Q_l): m ↦ G_e (G_l m + b_l) + b_e, Σ ↦ G_e (G_l Σ G_lᵀ + Q_l) G_eᵀ + Q_e."""
    g_l, b_l, q_l = later
    g_e, b_e, q_e = earlier
    return (
        g_e @ g_l,
        _mv(g_e, b_l) + b_e,
        _util.symmetrize(g_e @ q_l @ _mT(g_e) + q_e),
    )


def _smooth(chol: Array, gains: Array, offsets: Array, method: str):
    """Return marginal means (T, d), covariances (T, d, d) and Cov(x_t, x_{t+1}) (T-1, d, d).

    m_t = G_t m_{t+1} + b_t and Σ_t = G_t Σ_{t+1} G_tᵀ + P_t⁻¹ (the RTS recursion
    in backward-chain form; the smoothing elements of Särkkä & García-Fernández 2021).
    """
    cond_cov = _cholesky_inverse(chol)
    if method == "parallel":
        _, means, covs = jax.lax.associative_scan(
            _affine_compose, (gains, offsets, cond_cov), reverse=True
        )
    else:

        def step(carry, inputs):
            mean_next, cov_next = carry
            gain, offset, q = inputs
            mean = _mv(gain, mean_next) + offset
            cov = _util.symmetrize(gain @ cov_next @ _mT(gain) + q)
            return (mean, cov), (mean, cov)

        last = (offsets[-1], cond_cov[-1])
        _, (means, covs) = jax.lax.scan(
            step, last, (gains[:-1], offsets[:-1], cond_cov[:-1]), reverse=True
        )
        means = jnp.concatenate([means, offsets[-1:]])
        covs = jnp.concatenate([covs, cond_cov[-1:]])
    cross = gains[:-1] @ covs[1:]
    return means, covs, cross


# Scalar states (d = 1): the same passes on (T,) arrays, every block a number.
# They are the hot path of local level models, and plain arithmetic keeps both
# the sequential loop and the associative-scan graph small.


def _is_scalar(natural: ChainGaussianStats) -> bool:
    return natural.x.shape[-1] == 1


def _scalar_blocks(natural: ChainGaussianStats) -> tuple[Array, Array, Array]:
    """(h_t, J_tt, J_{t,t+1}) of one chain of scalars, shapes (T,), (T,), (T-1,)."""
    return natural.x[:, 0], -2.0 * natural.xx[:, 0, 0], -natural.x_next[:, 0, 0]


def _forward_scalar(h: Array, j_diag: Array, j_off: Array, method: str) -> tuple[Array, Array]:
    """Pivots P_t and h̃_t for d = 1 (see the module docstring)."""
    if method == "parallel":
        # The pairwise potentials of ``_forward_parallel`` with 1 x 1 blocks.
        def combine(first, second):
            a1, b1, c1, u1, v1 = first
            a2, b2, c2, u2, v2 = second
            s, r = c1 + a2, v1 + u2
            return (a1 - b1 * b1 / s, -b1 * b2 / s, c2 - b2 * b2 / s, u1 - b1 * r / s, v2 - b2 * r / s)

        zeros = jnp.zeros_like(h)
        couplings = jnp.concatenate([jnp.zeros_like(h[:1]), j_off])
        prefixes = jax.lax.associative_scan(combine, (zeros, couplings, j_diag, zeros, h))
        return prefixes[2], prefixes[4]

    def step(carry, inputs):
        p_prev, h_prev = carry
        j_next, h_next, j_cross = inputs
        gain = j_cross / p_prev  # P_t⁻¹ J_{t,t+1}
        p_new, h_new = j_next - j_cross * gain, h_next - gain * h_prev
        return (p_new, h_new), (p_new, h_new)

    _, (p_rest, h_rest) = jax.lax.scan(step, (j_diag[0], h[0]), (j_diag[1:], h[1:], j_off))
    return jnp.concatenate([j_diag[:1], p_rest]), jnp.concatenate([h[:1], h_rest])


def _backward_scalar(natural: ChainGaussianStats, method: str):
    """:func:`_backward_chain` for d = 1: (pivots P_t, gains, offsets, A(λ)), shapes (T,) and ()."""
    h, j_diag, j_off = _scalar_blocks(natural)
    pivots, h_tilde = _forward_scalar(h, j_diag, j_off, method)
    offsets = h_tilde / pivots
    gains = jnp.concatenate([-j_off / pivots[:-1], jnp.zeros_like(pivots[:1])])
    log_norm = (
        0.5 * jnp.sum(h_tilde * offsets)
        - 0.5 * jnp.sum(jnp.log(pivots))
        + 0.5 * h.shape[0] * math.log(2 * math.pi)
    )
    return pivots, gains, offsets, log_norm


def _smooth_scalar(pivots: Array, gains: Array, offsets: Array, method: str):
    """:func:`_smooth` for d = 1: means, variances (T,) and Cov(x_t, x_{t+1}) (T-1,)."""
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


def _moments_one(natural: ChainGaussianStats, method: str):
    if _is_scalar(natural):
        pivots, gains, offsets, _ = _backward_scalar(natural, method)
        means, variances, cross = _smooth_scalar(pivots, gains, offsets, method)
        return means[:, None], variances[:, None, None], cross[:, None, None]
    chol, gains, offsets, _ = _backward_chain(natural, method)
    return _smooth(chol, gains, offsets, method)


def _log_normalizer_one(natural: ChainGaussianStats, method: str) -> Array:
    if _is_scalar(natural):
        return _backward_scalar(natural, method)[3]
    return _backward_chain(natural, method)[3]


def moments(natural: ChainGaussianStats, method: str = "sequential"):
    """Return (means (..., T, d), covariances (..., T, d, d), lag-one cross-covariances (..., T-1, d, d)).

    The cross-covariance is Cov(x_t, x_{t+1}) = E[(x_t - m_t)(x_{t+1} - m_{t+1})ᵀ].
    """
    _check_method(method)
    fn = partial(_moments_one, method=method)
    return vmap_over_batch(fn, natural, _STATS_NDIM, _batch_shape(natural))


def sufficient_stats(x: ArrayLike) -> ChainGaussianStats:
    """Return T(x) = (x_t, x_t x_tᵀ, x_t x_{t+1}ᵀ) for x of shape (..., T, d)."""
    (x,) = _util.as_floats(x)
    return ChainGaussianStats(
        x=x, xx=_util.outer(x), x_next=x[..., :-1, :, None] * x[..., 1:, None, :]
    )


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0, batch shaped."""
    (x,) = _util.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-2], x.dtype)


def expected_log_base_measure(natural: ChainGaussianStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros(_batch_shape(natural), natural.x.dtype)


def log_normalizer(natural: ChainGaussianStats, method: str = "sequential") -> Array:
    """Return A(λ) = Σ_t [½ h̃_tᵀ P_t⁻¹ h̃_t - ½ log|P_t|] + (T d / 2) log 2π, batch shaped.

    ``method`` is ``"sequential"`` (``lax.scan``) or ``"parallel"``
    (``lax.associative_scan``); both are O(T d³) work and differentiable.

    Example:
        >>> nat = from_usual(precision_diag=2.0 * jnp.ones((3, 1, 1)),
        ...                  precision_offdiag=-jnp.ones((2, 1, 1)), linear=jnp.zeros((3, 1)))
        >>> round(float(log_normalizer(nat)), 6)  # ½ (3 log 2π - log|J|), |J| = 4
        2.063668
    """
    _check_method(method)
    fn = partial(_log_normalizer_one, method=method)
    return vmap_over_batch(fn, natural, _STATS_NDIM, _batch_shape(natural))


def mean_params(
    natural: ChainGaussianStats, method: str = "sequential"
) -> ChainGaussianStats:
    """Return μ = ∇A(λ) = (m_t, Σ_t + m_t m_tᵀ, C_t + m_t m_{t+1}ᵀ) with C_t = Cov(x_t, x_{t+1})."""
    means, covs, cross = moments(natural, method)
    return ChainGaussianStats(
        x=means,
        xx=covs + _util.outer(means),
        x_next=cross + means[..., :-1, :, None] * means[..., 1:, None, :],
    )


def _markov_from_moments(means: Array, covs: Array, cross: Array) -> dict[str, Array]:
    """Forward Markov form of a Gaussian chain from its marginal and lag-one moments.

    x_{t+1} | x_t ~ N(F_t x_t + u_t, Q_t),  F_t = C_tᵀ Σ_t⁻¹,  u_t = m_{t+1} - F_t m_t,
    Q_t = Σ_{t+1} - F_t C_t.
    """
    chol = _cholesky(covs[..., :-1, :, :])
    trans = _mT(_cho_solve((chol, True), cross))
    return {
        "initial_mean": means[..., 0, :],
        "initial_covariance": covs[..., 0, :, :],
        "transition_matrices": trans,
        "transition_offsets": means[..., 1:, :] - _mv(trans, means[..., :-1, :]),
        "transition_covariances": _util.symmetrize(covs[..., 1:, :, :] - trans @ cross),
    }


def _from_markov(
    initial_mean: Array,
    initial_covariance: Array,
    transition_matrices: Array,
    transition_offsets: Array,
    transition_covariances: Array,
) -> ChainGaussianStats:
    """λ of x_1 ~ N(m, Σ), x_{t+1} = F_t x_t + u_t + N(0, Q_t); shapes broadcast over (..., T-1)."""
    prior_prec = _cholesky_inverse(_cholesky(initial_covariance))
    noise_prec = _cholesky_inverse(_cholesky(transition_covariances))
    f_t_q = _mT(transition_matrices) @ noise_prec  # F_tᵀ Q_t⁻¹
    first_diag = prior_prec[..., None, :, :]
    first_lin = _mv(prior_prec, initial_mean)[..., None, :]
    zeros_diag = jnp.zeros_like(noise_prec[..., :1, :, :])
    zeros_lin = jnp.zeros_like(transition_offsets[..., :1, :])
    # J_tt gets Fᵀ Q⁻¹ F from the transition out of t and Q⁻¹ from the one into t.
    j_diag = jnp.concatenate([first_diag, noise_prec], axis=-3)
    j_diag = j_diag + jnp.concatenate(
        [f_t_q @ transition_matrices, zeros_diag], axis=-3
    )
    lin_in = _mv(noise_prec, transition_offsets)
    h = jnp.concatenate([first_lin, lin_in], axis=-2)
    h = h - jnp.concatenate([_mv(_mT(transition_matrices), lin_in), zeros_lin], axis=-2)
    return ChainGaussianStats(x=h, xx=-0.5 * _util.symmetrize(j_diag), x_next=f_t_q)


def natural_params(mean: ChainGaussianStats) -> ChainGaussianStats:
    """Return λ from μ via the chain's forward Markov form (O(T d³), no dense inverse).

    Σ_t = μ₂ₜ - m_t m_tᵀ and C_t = μ₃ₜ - m_t m_{t+1}ᵀ give F_t = C_tᵀ Σ_t⁻¹ and
    Q_t = Σ_{t+1} - F_t C_t; then J_11 = Σ_1⁻¹ + F_1ᵀQ_1⁻¹F_1,
    J_tt = Q_{t-1}⁻¹ + F_tᵀQ_t⁻¹F_t, J_{t,t+1} = -F_tᵀQ_t⁻¹,
    h_t = Q_{t-1}⁻¹u_{t-1} - F_tᵀQ_t⁻¹u_t (+ Σ_1⁻¹m_1 at t = 1).
    """
    means = mean.x
    covs = _util.symmetrize(mean.xx - _util.outer(means))
    cross = mean.x_next - means[..., :-1, :, None] * means[..., 1:, None, :]
    return _from_markov(**_markov_from_moments(means, covs, cross))


def from_usual(
    *,
    precision_diag: ArrayLike | None = None,
    precision_offdiag: ArrayLike | None = None,
    linear: ArrayLike | None = None,
    initial_mean: ArrayLike | None = None,
    initial_covariance: ArrayLike | None = None,
    transition_matrices: ArrayLike | None = None,
    transition_offsets: ArrayLike | None = None,
    transition_covariances: ArrayLike | None = None,
) -> ChainGaussianStats:
    """Return λ from either the precision blocks or a linear-Gaussian state-space model.

    Precision form: ``precision_diag`` J_tt (..., T, d, d), ``precision_offdiag``
    J_{t,t+1} (..., T-1, d, d) and ``linear`` h (..., T, d), for
    q(x) ∝ exp(hᵀx - ½ xᵀJx).

    State-space form (what :func:`to_usual` returns): x_1 ~ N(``initial_mean``,
    ``initial_covariance``), x_{t+1} = F_t x_t + u_t + ε_t, ε_t ~ N(0, Q_t) with
    ``transition_matrices`` F_t (..., T-1, d, d), ``transition_offsets`` u_t
    (..., T-1, d; default 0) and ``transition_covariances`` Q_t (..., T-1, d, d).

    Raises:
        ValueError: if the arguments mix or leave incomplete both forms.

    Example:
        >>> nat = from_usual(initial_mean=jnp.zeros(1), initial_covariance=jnp.eye(1),
        ...                  transition_matrices=jnp.ones((2, 1, 1)),
        ...                  transition_covariances=jnp.ones((2, 1, 1)))
        >>> nat.xx[..., 0, 0]
        Array([-1. , -1. , -0.5], dtype=float64)
    """
    precision = (precision_diag, precision_offdiag, linear)
    markov = (
        initial_mean,
        initial_covariance,
        transition_matrices,
        transition_covariances,
    )
    if all(a is not None for a in precision) and all(a is None for a in markov):
        if transition_offsets is not None:
            raise ValueError("transition_offsets belongs to the state-space form.")
        j_diag, j_off, h = _util.as_floats(*precision)
        batch = jnp.broadcast_shapes(h.shape[:-2], j_diag.shape[:-3], j_off.shape[:-3])
        t, d = h.shape[-2:]
        return ChainGaussianStats(
            x=jnp.broadcast_to(h, batch + (t, d)),
            xx=jnp.broadcast_to(-0.5 * _util.symmetrize(j_diag), batch + (t, d, d)),
            x_next=jnp.broadcast_to(-j_off, batch + (t - 1, d, d)),
        )
    if all(a is not None for a in markov) and all(a is None for a in precision):
        if transition_offsets is None:
            transition_offsets = jnp.zeros(jnp.shape(transition_matrices)[:-1])
        m0, p0, trans, offs, noise = _util.as_floats(
            *markov[:3], transition_offsets, markov[3]
        )
        batch = jnp.broadcast_shapes(
            m0.shape[:-1],
            p0.shape[:-2],
            trans.shape[:-3],
            offs.shape[:-2],
            noise.shape[:-3],
        )
        t1, d = trans.shape[-3], trans.shape[-1]
        return _from_markov(
            jnp.broadcast_to(m0, batch + (d,)),
            jnp.broadcast_to(p0, batch + (d, d)),
            jnp.broadcast_to(trans, batch + (t1, d, d)),
            jnp.broadcast_to(offs, batch + (t1, d)),
            jnp.broadcast_to(noise, batch + (t1, d, d)),
        )
    raise ValueError(
        "give either precision_diag, precision_offdiag and linear, or initial_mean, "
        "initial_covariance, transition_matrices and transition_covariances "
        "(and optionally transition_offsets)."
    )


def to_usual(
    natural: ChainGaussianStats, method: str = "sequential"
) -> dict[str, Array]:
    """Return the state-space form: initial_mean, initial_covariance, transition_matrices,
    transition_offsets and transition_covariances (see :func:`from_usual`)."""
    return _markov_from_moments(*moments(natural, method))


def _grw_natural(scale: Array, num_steps: int) -> ChainGaussianStats:
    prec = scale**-2
    j_diag = jnp.concatenate(
        [
            jnp.broadcast_to(2.0 * prec[..., None], prec.shape + (num_steps - 1,)),
            prec[..., None],
        ],
        axis=-1,
    )
    j_off = jnp.broadcast_to(-prec[..., None], prec.shape + (num_steps - 1,))
    return ChainGaussianStats(
        x=jnp.zeros(prec.shape + (num_steps, 1), prec.dtype),
        xx=-0.5 * j_diag[..., None, None],
        x_next=-j_off[..., None, None],
    )


def from_numpyro(d: dist.Distribution, state_dim: int = 1) -> ChainGaussianStats:
    """Return λ of a numpyro chain distribution, with states of shape (d,).

    Accepted: ``GaussianRandomWalk(scale, num_steps)`` (d = 1; its values (..., T)
    are read as (..., T, 1)), ``GaussianStateSpace`` (values (..., T, d)),
    :class:`ChainGaussianDistribution`, and a dense ``MultivariateNormal`` over
    (..., T·d) whose precision is block tridiagonal with ``state_dim`` = d blocks
    (the structure is checked when the precision is concrete; entries outside the
    band are dropped otherwise).

    Raises:
        ModelError: for other distributions, or a visibly non-banded precision.
    """
    base = _util.unwrap(d)
    if isinstance(base, ChainGaussianDistribution):
        nat = base.natural
    elif isinstance(base, dist.GaussianRandomWalk):
        (scale,) = _util.as_floats(base.scale)
        nat = _grw_natural(jnp.broadcast_to(scale, base.batch_shape), base.num_steps)
    elif isinstance(base, dist.GaussianStateSpace):
        trans, chol, z0 = _util.as_floats(
            base.transition_matrix, base.scale_tril, base.initial_value
        )
        noise = chol @ _mT(chol)
        steps = base.num_steps
        t1 = (steps - 1,) + trans.shape[-2:]
        nat = from_usual(
            initial_mean=_mv(trans, z0),
            initial_covariance=noise,
            transition_matrices=jnp.broadcast_to(
                trans[..., None, :, :], trans.shape[:-2] + t1
            ),
            transition_covariances=jnp.broadcast_to(
                noise[..., None, :, :], noise.shape[:-2] + t1
            ),
        )
    elif isinstance(base, dist.MultivariateNormal):
        nat = _from_dense_mvn(base, state_dim)
    else:
        raise _util.not_in_family(d, "ChainGaussian")
    # The family's batch is the value's shape less (T, d); GRW and MVN values are flat.
    flat = isinstance(base, (dist.GaussianRandomWalk, dist.MultivariateNormal))
    full = tuple(d.batch_shape) + tuple(d.event_shape)
    batch = full[: len(full) - (1 if flat else 2)]
    return ChainGaussianStats(
        *(
            jnp.broadcast_to(a, batch + a.shape[a.ndim - n :])
            for a, n in zip(nat, _STATS_NDIM)
        )
    )


def _from_dense_mvn(
    base: dist.MultivariateNormal, state_dim: int
) -> ChainGaussianStats:
    loc, prec = _util.as_floats(base.loc, base.precision_matrix)
    n = prec.shape[-1]
    if n % state_dim:
        raise _util.not_in_family(
            base, "ChainGaussian", f"size {n} is not T x {state_dim}"
        )
    steps, d = n // state_dim, state_dim
    loc = jnp.broadcast_to(loc, prec.shape[:-1])
    blocks = prec.reshape(prec.shape[:-2] + (steps, d, steps, d))
    blocks = jnp.moveaxis(blocks, -3, -2)  # (..., T, T, d, d)
    idx = jnp.arange(steps)
    if not isinstance(prec, jax.core.Tracer):
        mask = np.abs(np.arange(steps)[:, None] - np.arange(steps)[None, :]) > 1
        if np.any(np.asarray(blocks)[..., mask, :, :] != 0):
            scale = float(np.max(np.abs(np.asarray(prec))))
            if np.max(np.abs(np.asarray(blocks)[..., mask, :, :])) > 1e-10 * scale:
                raise _util.not_in_family(
                    base, "ChainGaussian", "precision not block tridiagonal"
                )
    j_diag = blocks[..., idx, idx, :, :]
    j_off = blocks[..., idx[:-1], idx[1:], :, :]
    h = _mv(prec, loc).reshape(loc.shape[:-1] + (steps, d))
    return from_usual(precision_diag=j_diag, precision_offdiag=j_off, linear=h)


def _sample_one(
    rng_key: PRNGKey, natural: ChainGaussianStats, num: int, method: str
) -> Array:
    """Backward sampling: x_T ~ N(b_T, P_T⁻¹), x_t = G_t x_{t+1} + b_t + L_t⁻ᵀ ε_t."""
    if _is_scalar(natural):
        pivots, gains, offsets, _ = _backward_scalar(natural, method)
        eps = jax.random.normal(rng_key, (num,) + offsets.shape + (1,), offsets.dtype)
        drift = (offsets + eps[..., 0] / jnp.sqrt(pivots))[..., None]  # (num, T, 1)
        gains = gains[:, None, None]
    else:
        chol, gains, offsets, _ = _backward_chain(natural, method)
        eps = jax.random.normal(rng_key, (num,) + offsets.shape, offsets.dtype)
        noise = _solve_lower(chol, eps[..., None], transpose=True)[..., 0]
        drift = offsets + noise  # (num, T, d)
    if method == "parallel":

        def compose(later, earlier):
            return earlier[0] @ later[0], _mv(earlier[0], later[1]) + earlier[1]

        g = jnp.broadcast_to(gains, (num,) + gains.shape)
        _, xs = jax.lax.associative_scan(compose, (g, drift), reverse=True, axis=1)
        return xs

    def step(x_next, inputs):
        gain, b = inputs
        x = _mv(gain, x_next) + b
        return x, x

    last = drift[:, -1]
    _, xs = jax.lax.scan(
        step, last, (gains[:-1], jnp.moveaxis(drift[:, :-1], 1, 0)), reverse=True
    )
    return jnp.concatenate([jnp.moveaxis(xs, 0, 1), last[:, None]], axis=1)


def sample(
    rng_key: PRNGKey,
    natural: ChainGaussianStats,
    sample_shape: tuple = (),
    method: str = "sequential",
) -> Array:
    """Draw x of shape ``sample_shape + batch + (T, d)`` by forward filtering, backward sampling."""
    _check_method(method)
    sample_shape = tuple(sample_shape)
    batch = _batch_shape(natural)
    num = math.prod(sample_shape)
    size = math.prod(batch)
    keys = jax.random.split(rng_key, size).reshape(
        batch + jax.random.split(rng_key, 1).shape[1:]
    )
    fn = lambda args: _sample_one(args[0], args[1], num, method)
    xs = vmap_over_batch(
        fn, (keys, natural), (keys.ndim - len(batch),) + _STATS_NDIM, batch
    )
    xs = jnp.moveaxis(xs, len(batch), 0)  # (num, *batch, T, d)
    return xs.reshape(sample_shape + xs.shape[1:])


def is_valid(natural: ChainGaussianStats) -> Array:
    """Return J positive definite (every block-Cholesky pivot P_t is) and λ finite, batch shaped."""

    def one(nat):
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(leaf)) for leaf in nat]))
        if _is_scalar(nat):
            pivots, _ = _forward_scalar(*_scalar_blocks(nat), "sequential")
            return finite & jnp.all(pivots > 0)
        h, j_diag, j_off = _blocks(nat)
        pivots, _ = _forward_sequential(h, j_diag, j_off)
        return finite & jnp.all(_positive_definite(pivots))

    return vmap_over_batch(one, natural, _STATS_NDIM, _batch_shape(natural))


# The distribution's moments are read eagerly (``result.posterior[...].mean``):
# one compiled pass per chain shape instead of op-by-op dispatch of the scans.
_compiled_moments = jax.jit(moments, static_argnames="method")


class ChainGaussianDistribution(dist.Distribution):
    """A numpyro distribution over chains (..., T, d) from chain-Gaussian natural parameters.

    ``log_prob``, ``sample``, ``mean`` (..., T, d) and ``variance`` (..., T, d)
    (marginal variances) are O(T d³); ``marginal_covariance`` gives the (T, d, d)
    marginal blocks and ``lag_one_covariance`` the (T-1, d, d) Cov(x_t, x_{t+1}).
    """

    support = constraints.independent(constraints.real, 2)
    pytree_data_fields = ("natural",)
    pytree_aux_fields = ("method",)

    def __init__(
        self,
        natural: ChainGaussianStats,
        method: str = "sequential",
        *,
        validate_args=None,
    ):
        _check_method(method)
        self.natural = ChainGaussianStats(*natural)
        self.method = method
        shape = jnp.shape(self.natural.x)
        super().__init__(
            batch_shape=shape[:-2], event_shape=shape[-2:], validate_args=validate_args
        )

    def sample(self, key, sample_shape=()):
        return sample(key, self.natural, sample_shape, self.method)

    def log_prob(self, value):
        stats = sufficient_stats(value)
        inner = sum(
            jnp.sum(lam * t, axis=tuple(range(t.ndim - n, t.ndim)))
            for lam, t, n in zip(self.natural, stats, _STATS_NDIM)
        )
        return inner - log_normalizer(self.natural, self.method)

    @property
    def mean(self):
        return _compiled_moments(self.natural, self.method)[0]

    @property
    def marginal_covariance(self):
        return _compiled_moments(self.natural, self.method)[1]

    @property
    def lag_one_covariance(self):
        return _compiled_moments(self.natural, self.method)[2]

    @property
    def variance(self):
        return jnp.diagonal(self.marginal_covariance, axis1=-2, axis2=-1)


class ScalarChainGaussianDistribution(ChainGaussianDistribution):
    """:class:`ChainGaussianDistribution` with d = 1 and values (..., T), like
    ``GaussianRandomWalk``; ``natural`` holds the (T, 1) form."""

    support = constraints.real_vector

    def __init__(
        self,
        natural: ChainGaussianStats,
        method: str = "sequential",
        *,
        validate_args=None,
    ):
        super().__init__(natural, method, validate_args=validate_args)
        self._event_shape = self._event_shape[:-1]

    def sample(self, key, sample_shape=()):
        return super().sample(key, sample_shape)[..., 0]

    def log_prob(self, value):
        return super().log_prob(jnp.asarray(value)[..., None])

    @property
    def mean(self):
        return super().mean[..., 0]

    @property
    def variance(self):
        return super().variance[..., 0]


def to_numpyro(
    natural: ChainGaussianStats, method: str = "sequential"
) -> ChainGaussianDistribution:
    """Return :class:`ChainGaussianDistribution` with event shape (T, d)."""
    return ChainGaussianDistribution(natural, method)


# Scalar states (d = 1) with values (..., T): the same statistics without the
# trailing unit axes, x (..., T), xx (..., T), x_next (..., T-1).


def _vector_states(natural: ChainGaussianStats) -> ChainGaussianStats:
    return ChainGaussianStats(
        natural.x[..., None],
        natural.xx[..., None, None],
        natural.x_next[..., None, None],
    )


def _scalar_states(stats: ChainGaussianStats) -> ChainGaussianStats:
    return ChainGaussianStats(
        stats.x[..., 0], stats.xx[..., 0, 0], stats.x_next[..., 0, 0]
    )


def _scalar_family(name: str, method: str) -> ExpFamily:
    """The chain Gaussian over scalar states: every function goes through the d = 1 form."""

    def from_usual_scalar(**usual):
        return _scalar_states(from_usual(**usual))

    return ExpFamily(
        name=name,
        stats_type=ChainGaussianStats,
        event_ndim=1,
        support=constraints.real_vector,
        sufficient_stats=lambda x: _scalar_states(
            sufficient_stats(jnp.asarray(x)[..., None])
        ),
        log_base_measure=lambda x: log_base_measure(jnp.asarray(x)[..., None]),
        expected_log_base_measure=lambda n: expected_log_base_measure(
            _vector_states(n)
        ),
        log_normalizer=lambda n: log_normalizer(_vector_states(n), method),
        mean_params=lambda n: _scalar_states(mean_params(_vector_states(n), method)),
        natural_params=lambda m: _scalar_states(natural_params(_vector_states(m))),
        from_usual=from_usual_scalar,
        to_usual=lambda n: to_usual(_vector_states(n), method),
        from_numpyro=lambda d: _scalar_states(from_numpyro(d, state_dim=1)),
        to_numpyro=lambda n: ScalarChainGaussianDistribution(_vector_states(n), method),
        sample=lambda key, n, shape=(): sample(key, _vector_states(n), shape, method)[
            ..., 0
        ],
        is_valid=lambda n: is_valid(_vector_states(n)),
        batch_shape=lambda n: tuple(jnp.shape(n.x)[:-1]),
    )


def _family(name: str, method: str) -> ExpFamily:
    return ExpFamily(
        name=name,
        stats_type=ChainGaussianStats,
        event_ndim=2,
        support=constraints.independent(constraints.real, 2),
        sufficient_stats=sufficient_stats,
        log_base_measure=log_base_measure,
        expected_log_base_measure=expected_log_base_measure,
        log_normalizer=partial(log_normalizer, method=method),
        mean_params=partial(mean_params, method=method),
        natural_params=natural_params,
        from_usual=from_usual,
        to_usual=partial(to_usual, method=method),
        from_numpyro=from_numpyro,
        to_numpyro=partial(to_numpyro, method=method),
        sample=partial(sample, method=method),
        is_valid=is_valid,
        batch_shape=_batch_shape,
    )


CHAIN_GAUSSIAN = _family("ChainGaussian", "sequential")
"""Gaussian chain (..., T, d) with block-tridiagonal precision; sequential ``lax.scan`` passes."""

CHAIN_GAUSSIAN_PARALLEL = _family("ChainGaussianParallel", "parallel")
"""The same family with parallel-in-time (``lax.associative_scan``) passes, for accelerators."""

SCALAR_CHAIN_GAUSSIAN = _scalar_family("ScalarChainGaussian", "sequential")
"""Gaussian chain of scalars (..., T), the q of a ``GaussianRandomWalk``; statistics
x (..., T), xx (..., T), x_next (..., T-1); ``from_usual`` takes the d = 1 arrays."""

SCALAR_CHAIN_GAUSSIAN_PARALLEL = _scalar_family(
    "ScalarChainGaussianParallel", "parallel"
)
"""The scalar chain Gaussian with parallel-in-time passes."""
