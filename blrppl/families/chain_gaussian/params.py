"""Parametrisations of a chain Gaussian: μ -> λ, usual <-> λ, numpyro priors -> λ.

Besides the precision blocks (h_t, J_tt, J_{t,t+1}) of λ, a chain Gaussian is a
linear-Gaussian state-space model in forward Markov form,

    x_1 ~ N(m, Σ),   x_{t+1} | x_t ~ N(F_t x_t + u_t, Q_t),

whose precision is block tridiagonal with

    J_11 = Σ⁻¹ + F_1ᵀQ_1⁻¹F_1,   J_tt = Q_{t-1}⁻¹ + F_tᵀQ_t⁻¹F_t,   J_TT = Q_{T-1}⁻¹,
    J_{t,t+1} = -F_tᵀQ_t⁻¹,
    h_t = Q_{t-1}⁻¹u_{t-1} - F_tᵀQ_t⁻¹u_t   (+ Σ⁻¹m at t = 1).

Conversely the marginal and lag-one moments give F_t = C_tᵀ Σ_t⁻¹,
u_t = m_{t+1} - F_t m_t and Q_t = Σ_{t+1} - F_t C_t (C_t = Cov(x_t, x_{t+1})),
so μ -> λ costs O(T d³) and never inverts the dense (T d) x (T d) covariance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from blrppl._types import Array, ArrayLike
from blrppl.families import common
from blrppl.families.chain_gaussian.distribution import ChainGaussianDistribution
from blrppl.families.chain_gaussian.inference import moments
from blrppl.families.chain_gaussian.linalg import (
    cholesky,
    cholesky_solve,
    inverse_from_cholesky,
    matrix_transpose,
    matvec,
)
from blrppl.families.chain_gaussian.stats import STATS_NDIM, ChainGaussianStats


def _markov_from_moments(means: Array, covs: Array, cross: Array) -> dict[str, Array]:
    """Forward Markov form of a Gaussian chain from its marginal and lag-one moments.

    x_{t+1} | x_t ~ N(F_t x_t + u_t, Q_t),  F_t = C_tᵀ Σ_t⁻¹,  u_t = m_{t+1} - F_t m_t,
    Q_t = Σ_{t+1} - F_t C_t.
    """
    chol = cholesky(covs[..., :-1, :, :])
    trans = matrix_transpose(cholesky_solve(chol, cross))
    return {
        "initial_mean": means[..., 0, :],
        "initial_covariance": covs[..., 0, :, :],
        "transition_matrices": trans,
        "transition_offsets": means[..., 1:, :] - matvec(trans, means[..., :-1, :]),
        "transition_covariances": common.symmetrize(covs[..., 1:, :, :] - trans @ cross),
    }


def _from_markov(
    initial_mean: Array,
    initial_covariance: Array,
    transition_matrices: Array,
    transition_offsets: Array,
    transition_covariances: Array,
) -> ChainGaussianStats:
    """λ of x_1 ~ N(m, Σ), x_{t+1} = F_t x_t + u_t + N(0, Q_t), batched over (...)."""
    prior_prec = inverse_from_cholesky(cholesky(initial_covariance))
    noise_prec = inverse_from_cholesky(cholesky(transition_covariances))
    f_t_q = matrix_transpose(transition_matrices) @ noise_prec  # F_tᵀ Q_t⁻¹
    first_diag = prior_prec[..., None, :, :]
    first_lin = matvec(prior_prec, initial_mean)[..., None, :]
    zeros_diag = jnp.zeros_like(noise_prec[..., :1, :, :])
    zeros_lin = jnp.zeros_like(transition_offsets[..., :1, :])
    # J_tt gets Fᵀ Q⁻¹ F from the transition out of t and Q⁻¹ from the one into t.
    j_diag = jnp.concatenate([first_diag, noise_prec], axis=-3)
    j_diag = j_diag + jnp.concatenate(
        [f_t_q @ transition_matrices, zeros_diag], axis=-3
    )
    lin_in = matvec(noise_prec, transition_offsets)
    h = jnp.concatenate([first_lin, lin_in], axis=-2)
    h = h - jnp.concatenate(
        [matvec(matrix_transpose(transition_matrices), lin_in), zeros_lin], axis=-2
    )
    return ChainGaussianStats(x=h, xx=-0.5 * common.symmetrize(j_diag), x_next=f_t_q)


def natural_params(mean: ChainGaussianStats) -> ChainGaussianStats:
    """Return λ from μ via the chain's forward Markov form (O(T d³), no dense inverse).

    Σ_t = μ₂ₜ - m_t m_tᵀ and C_t = μ₃ₜ - m_t m_{t+1}ᵀ give F_t = C_tᵀ Σ_t⁻¹ and
    Q_t = Σ_{t+1} - F_t C_t; then J_11 = Σ_1⁻¹ + F_1ᵀQ_1⁻¹F_1,
    J_tt = Q_{t-1}⁻¹ + F_tᵀQ_t⁻¹F_t, J_{t,t+1} = -F_tᵀQ_t⁻¹,
    h_t = Q_{t-1}⁻¹u_{t-1} - F_tᵀQ_t⁻¹u_t (+ Σ_1⁻¹m_1 at t = 1).
    """
    means = mean.x
    covs = common.symmetrize(mean.xx - common.outer(means))
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
        j_diag, j_off, h = common.as_floats(*precision)
        batch = jnp.broadcast_shapes(h.shape[:-2], j_diag.shape[:-3], j_off.shape[:-3])
        t, d = h.shape[-2:]
        return ChainGaussianStats(
            x=jnp.broadcast_to(h, batch + (t, d)),
            xx=jnp.broadcast_to(-0.5 * common.symmetrize(j_diag), batch + (t, d, d)),
            x_next=jnp.broadcast_to(-j_off, batch + (t - 1, d, d)),
        )
    if all(a is not None for a in markov) and all(a is None for a in precision):
        if transition_offsets is None:
            transition_offsets = jnp.zeros(jnp.shape(transition_matrices)[:-1])
        m0, p0, trans, offs, noise = common.as_floats(
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
    """Return the state-space form of q (the keyword arguments of :func:`from_usual`).

    Returns:
        ``initial_mean`` (..., d), ``initial_covariance`` (..., d, d),
        ``transition_matrices`` (..., T-1, d, d), ``transition_offsets``
        (..., T-1, d) and ``transition_covariances`` (..., T-1, d, d).
    """
    return _markov_from_moments(*moments(natural, method))


def _grw_natural(scale: Array, num_steps: int) -> ChainGaussianStats:
    """λ of ``GaussianRandomWalk(s)``: J_tt = 2/s² (1/s² at T), J_{t,t+1} = -1/s²."""
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
    base = common.unwrap(d)
    if isinstance(base, ChainGaussianDistribution):
        nat = base.natural
    elif isinstance(base, dist.GaussianRandomWalk):
        (scale,) = common.as_floats(base.scale)
        nat = _grw_natural(jnp.broadcast_to(scale, base.batch_shape), base.num_steps)
    elif isinstance(base, dist.GaussianStateSpace):
        trans, chol, z0 = common.as_floats(
            base.transition_matrix, base.scale_tril, base.initial_value
        )
        noise = chol @ matrix_transpose(chol)
        steps = base.num_steps
        t1 = (steps - 1,) + trans.shape[-2:]
        nat = from_usual(
            initial_mean=matvec(trans, z0),
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
        raise common.not_in_family(d, "ChainGaussian")
    # The family's batch is the value's shape less (T, d); GRW and MVN values are flat.
    flat = isinstance(base, (dist.GaussianRandomWalk, dist.MultivariateNormal))
    full = tuple(d.batch_shape) + tuple(d.event_shape)
    batch = full[: len(full) - (1 if flat else 2)]
    return ChainGaussianStats(
        *(
            jnp.broadcast_to(a, batch + a.shape[a.ndim - n :])
            for a, n in zip(nat, STATS_NDIM)
        )
    )


def _from_dense_mvn(
    base: dist.MultivariateNormal, state_dim: int
) -> ChainGaussianStats:
    """λ from the bands of a dense precision; ModelError if it is visibly not banded."""
    loc, prec = common.as_floats(base.loc, base.precision_matrix)
    n = prec.shape[-1]
    if n % state_dim:
        raise common.not_in_family(
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
                raise common.not_in_family(
                    base, "ChainGaussian", "precision not block tridiagonal"
                )
    j_diag = blocks[..., idx, idx, :, :]
    j_off = blocks[..., idx[:-1], idx[1:], :, :]
    h = matvec(prec, loc).reshape(loc.shape[:-1] + (steps, d))
    return from_usual(precision_diag=j_diag, precision_offdiag=j_off, linear=h)
