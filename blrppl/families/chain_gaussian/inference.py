"""A(λ), μ = ∇A(λ), marginal moments, samples and validity of a chain Gaussian.

Each routine factors one chain's precision J into a backward Markov chain,

    x_T ~ N(b_T, P_T⁻¹),   x_t | x_{t+1} ~ N(G_t x_{t+1} + b_t, P_t⁻¹),
    G_t = -P_t⁻¹ J_{t,t+1},   b_t = P_t⁻¹ h̃_t,

    A(λ) = Σ_t [½ h̃_tᵀ P_t⁻¹ h̃_t - ½ log|P_t|] + (T d / 2) log 2π,

from the pivots P_t and filtered linear terms h̃_t of a forward pass, then reads
the marginals off a backward pass (:func:`backward_chain`). ``method`` picks
the passes: ``"sequential"`` (:mod:`~blrppl.families.chain_gaussian.sequential`,
``lax.scan``) or ``"parallel"`` (:mod:`~blrppl.families.chain_gaussian.parallel`,
``lax.associative_scan``); chains of scalars (d = 1) take the fast path of
:mod:`~blrppl.families.chain_gaussian.scalar` with either method. All are
O(T d³) work, differentiable, and mapped over leading batch dimensions.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from blrppl._types import Array, PRNGKey
from blrppl.families import common
from blrppl.families.chain_gaussian import parallel, scalar, sequential
from blrppl.families.chain_gaussian.linalg import (
    cholesky,
    cholesky_solve,
    inverse_from_cholesky,
    is_positive_definite,
    solve_lower_triangular,
)
from blrppl.families.chain_gaussian.stats import (
    STATS_NDIM,
    ChainGaussianStats,
    batch_shape,
    check_method,
    precision_blocks,
    vmap_over_batch,
)


def backward_chain(
    natural: ChainGaussianStats, method: str
) -> tuple[Array, Array, Array, Array]:
    """Return (chol P_t, gains G_t, offsets b_t, A(λ)) of one chain's backward chain.

    Shapes (T, d, d), (T, d, d) with G_T = 0, (T, d) and (); chol P_t is the
    lower Cholesky factor of the pivot, so x_t | x_{t+1} has covariance P_t⁻¹
    (see the module docstring).
    """
    h, j_diag, j_off = precision_blocks(natural)
    forward = parallel.forward_pass if method == "parallel" else sequential.forward_pass
    pivots, h_tilde = forward(h, j_diag, j_off)
    chol = cholesky(pivots)
    offsets = cholesky_solve(chol, h_tilde[..., None])[..., 0]
    gains = -cholesky_solve(chol[:-1], j_off)
    gains = jnp.concatenate([gains, jnp.zeros_like(gains[:1])])
    num_steps, d = h.shape
    log_norm = (
        0.5 * jnp.sum(h_tilde * offsets)
        - 0.5 * jnp.sum(common.cholesky_log_det(chol))
        + 0.5 * num_steps * d * math.log(2 * math.pi)
    )
    return chol, gains, offsets, log_norm


def _moments_one(natural: ChainGaussianStats, method: str):
    if scalar.is_scalar(natural):
        pivots, gains, offsets, _ = scalar.backward_chain(natural, method)
        means, variances, cross = scalar.smooth(pivots, gains, offsets, method)
        return means[:, None], variances[:, None, None], cross[:, None, None]
    chol, gains, offsets, _ = backward_chain(natural, method)
    cond_cov = inverse_from_cholesky(chol)
    smooth = parallel.smooth if method == "parallel" else sequential.smooth
    means, covs = smooth(gains, offsets, cond_cov)
    cross = gains[:-1] @ covs[1:]  # Cov(x_t, x_{t+1}) = G_t Σ_{t+1}
    return means, covs, cross


def _log_normalizer_one(natural: ChainGaussianStats, method: str) -> Array:
    if scalar.is_scalar(natural):
        return scalar.log_normalizer(*scalar.forward_pass(natural, method))
    return backward_chain(natural, method)[3]


def moments(
    natural: ChainGaussianStats, method: str = "sequential"
) -> tuple[Array, Array, Array]:
    """Return the marginal means, covariances and lag-one cross-covariances of q.

    Shapes (..., T, d), (..., T, d, d) and (..., T-1, d, d); the cross-covariance
    is Cov(x_t, x_{t+1}) = E[(x_t - m_t)(x_{t+1} - m_{t+1})ᵀ] = G_t Σ_{t+1}.

    Raises:
        ValueError: if ``method`` is not ``"sequential"`` or ``"parallel"``.
    """
    check_method(method)
    fn = partial(_moments_one, method=method)
    return vmap_over_batch(fn, natural, STATS_NDIM, batch_shape(natural))


def log_normalizer(natural: ChainGaussianStats, method: str = "sequential") -> Array:
    """Return the log normaliser A(λ), batch shaped.

        A(λ) = Σ_t [½ h̃_tᵀ P_t⁻¹ h̃_t - ½ log|P_t|] + (T d / 2) log 2π.

    ``method`` is ``"sequential"`` (``lax.scan``) or ``"parallel"``
    (``lax.associative_scan``); both are O(T d³) work and differentiable.

    Raises:
        ValueError: if ``method`` is not ``"sequential"`` or ``"parallel"``.

    Example:
        >>> from blrppl.families.chain_gaussian import from_usual
        >>> nat = from_usual(precision_diag=2.0 * jnp.ones((3, 1, 1)),
        ...                  precision_offdiag=-jnp.ones((2, 1, 1)),
        ...                  linear=jnp.zeros((3, 1)))
        >>> round(float(log_normalizer(nat)), 6)  # ½ (3 log 2π - log|J|), |J| = 4
        2.063668
    """
    check_method(method)
    fn = partial(_log_normalizer_one, method=method)
    return vmap_over_batch(fn, natural, STATS_NDIM, batch_shape(natural))


def mean_params(
    natural: ChainGaussianStats, method: str = "sequential"
) -> ChainGaussianStats:
    """Return the mean parameters μ = ∇A(λ).

        μ = (m_t,  Σ_t + m_t m_tᵀ,  C_t + m_t m_{t+1}ᵀ),   C_t = Cov(x_t, x_{t+1}).

    Raises:
        ValueError: if ``method`` is not ``"sequential"`` or ``"parallel"``.
    """
    return checked_moments(natural, method)[0]


def _mean_from_moments(means: Array, covs: Array, cross: Array) -> ChainGaussianStats:
    return ChainGaussianStats(
        x=means,
        xx=covs + common.outer(means),
        x_next=cross + means[..., :-1, :, None] * means[..., 1:, None, :],
    )


def _checked_moments_one(natural: ChainGaussianStats, method: str):
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(leaf)) for leaf in natural]))
    if scalar.is_scalar(natural):
        x, xx, x_next, log_norm, positive = scalar.moments(natural, method)
        mean = ChainGaussianStats(x[:, None], xx[:, None, None], x_next[:, None, None])
        return mean, log_norm, finite & positive
    chol, gains, offsets, log_norm = backward_chain(natural, method)
    positive = jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol, axis1=-2, axis2=-1) > 0)
    cond_cov = inverse_from_cholesky(chol)
    smooth = parallel.smooth if method == "parallel" else sequential.smooth
    means, covs = smooth(gains, offsets, cond_cov)
    mean = _mean_from_moments(means, covs, gains[:-1] @ covs[1:])
    return mean, log_norm, finite & positive


def checked_moments(
    natural: ChainGaussianStats, method: str = "sequential"
) -> tuple[ChainGaussianStats, Array, Array]:
    """Return μ = ∇A(λ), A(λ) and whether λ is valid (:func:`is_valid`), batch shaped.

    One forward pass gives the pivots P_t, A(λ) and the verdict (J is
    positive definite exactly when every pivot is), one backward pass μ: what
    a step of the rule needs (its validity check and its ELBO) from one
    smoother, not three passes. The verdict reads the pivots of ``method``'s
    own forward pass, those μ and A are computed from.

    Raises:
        ValueError: if ``method`` is not ``"sequential"`` or ``"parallel"``.
    """
    check_method(method)
    fn = partial(_checked_moments_one, method=method)
    return vmap_over_batch(fn, natural, STATS_NDIM, batch_shape(natural))


def mean_and_log_normalizer(
    natural: ChainGaussianStats, method: str = "sequential"
) -> tuple[ChainGaussianStats, Array]:
    """Return μ = ∇A(λ) and A(λ) from one forward-backward pass (:func:`checked_moments`)."""
    mean, log_norm, _ = checked_moments(natural, method)
    return mean, log_norm


def _sample_one(
    rng_key: PRNGKey, natural: ChainGaussianStats, num: int, method: str
) -> Array:
    """Backward sampling: x_T ~ N(b_T, P_T⁻¹), x_t = G_t x_{t+1} + b_t + L_t⁻ᵀ ε_t."""
    if scalar.is_scalar(natural):
        pivots, gains, offsets, _ = scalar.backward_chain(natural, method)
        eps = jax.random.normal(rng_key, (num,) + offsets.shape + (1,), offsets.dtype)
        drift = (offsets + eps[..., 0] / jnp.sqrt(pivots))[..., None]  # (num, T, 1)
        gains = gains[:, None, None]
    else:
        chol, gains, offsets, _ = backward_chain(natural, method)
        eps = jax.random.normal(rng_key, (num,) + offsets.shape, offsets.dtype)
        noise = solve_lower_triangular(chol, eps[..., None], transpose=True)[..., 0]
        drift = offsets + noise  # (num, T, d)
    if method == "parallel":
        return parallel.sample_backward(gains, drift)
    return sequential.sample_backward(gains, drift)


def sample(
    rng_key: PRNGKey,
    natural: ChainGaussianStats,
    sample_shape: tuple[int, ...] = (),
    method: str = "sequential",
) -> Array:
    """Draw x, shape ``sample_shape + batch + (T, d)``: filter forward, sample backward.

    Raises:
        ValueError: if ``method`` is not ``"sequential"`` or ``"parallel"``.
    """
    check_method(method)
    sample_shape = tuple(sample_shape)
    batch = batch_shape(natural)
    num = math.prod(sample_shape)
    size = math.prod(batch)
    keys = jax.random.split(rng_key, size).reshape(
        batch + jax.random.split(rng_key, 1).shape[1:]
    )
    fn = lambda args: _sample_one(args[0], args[1], num, method)
    xs = vmap_over_batch(
        fn, (keys, natural), (keys.ndim - len(batch),) + STATS_NDIM, batch
    )
    xs = jnp.moveaxis(xs, len(batch), 0)  # (num, *batch, T, d)
    return xs.reshape(sample_shape + xs.shape[1:])


def is_valid(natural: ChainGaussianStats) -> Array:
    """Return whether J is positive definite and λ finite, batch shaped.

    J is positive definite exactly when every block-Cholesky pivot P_t is.
    """

    def one(nat):
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(leaf)) for leaf in nat]))
        if scalar.is_scalar(nat):
            return finite & scalar.is_positive_definite(nat)
        pivots, _ = sequential.forward_pass(*precision_blocks(nat))
        return finite & jnp.all(is_positive_definite(pivots))

    return vmap_over_batch(one, natural, STATS_NDIM, batch_shape(natural))
