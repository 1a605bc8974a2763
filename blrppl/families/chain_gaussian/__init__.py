"""The chain Gaussian family: a Gaussian over x_1..x_T with block-tridiagonal precision.

    q(x) ∝ exp(Σ_t h_tᵀ x_t - ½ Σ_t x_tᵀ J_tt x_t - Σ_t x_tᵀ J_{t,t+1} x_{t+1}),

    T(x) = (x_t,  x_t x_tᵀ,  x_t x_{t+1}ᵀ),       shapes (T, d), (T, d, d), (T-1, d, d),
    λ    = (h_t,  -J_tt / 2,  -J_{t,t+1}),
    μ    = (E x_t,  E x_t x_tᵀ,  E x_t x_{t+1}ᵀ),
    A(λ) = ½ hᵀ J⁻¹ h - ½ log|J| + (T d / 2) log 2π,   h(x) = 1,

with J_tt = -(λ₂ + λ₂ᵀ)_t, so only the symmetric part of λ₂ matters. Every routine
works on d x d blocks in O(T d³); no dense (T d) x (T d) matrix is formed. Any
leading dimensions of the statistics are batch dimensions (``vmap``-ed).

A and μ come from writing q as a backward Markov chain,

    x_T ~ N(P_T⁻¹ h̃_T, P_T⁻¹),
    x_t | x_{t+1} ~ N(P_t⁻¹ (h̃_t - J_{t,t+1} x_{t+1}), P_t⁻¹),

    P_1 = J_11,   P_{t+1} = J_{t+1,t+1} - J_{t,t+1}ᵀ P_t⁻¹ J_{t,t+1},
    h̃_1 = h_1,    h̃_{t+1} = h_{t+1} - J_{t,t+1}ᵀ P_t⁻¹ h̃_t,

    A(λ) = Σ_t [½ h̃_tᵀ P_t⁻¹ h̃_t - ½ log|P_t|] + (T d / 2) log 2π,

by one of two equivalent algorithms (``method=``): ``"sequential"``, a block
Cholesky factorisation of J run forwards as an information filter and
backwards as an RTS-style smoother, one ``lax.scan`` each (depth O(T)); or
``"parallel"``, the same quantities by ``lax.associative_scan`` passes in the
style of Särkkä & García-Fernández, *Temporal parallelization of Bayesian
smoothers*, IEEE TAC 66 (2021) (depth O(log T)). ``CHAIN_GAUSSIAN`` uses the
sequential passes, ``CHAIN_GAUSSIAN_PARALLEL`` the parallel ones (engines select
them with ``families={site: "ChainGaussianParallel"}``).

Modules, one idea each:

* :mod:`.linalg`: Cholesky, triangular solves and inverses of small d x d
  blocks, unrolled for d <= 4 instead of per-step LAPACK calls.
* :mod:`.stats`: the :class:`ChainGaussianStats` type, T(x), the precision
  blocks of λ, and :func:`vmap_over_batch`.
* :mod:`.sequential`: the ``lax.scan`` forward pass (pivots P_t, h̃_t), smoother
  and backward sampler.
* :mod:`.parallel`: the same passes as associative scans (pairwise potentials
  forwards, affine maps backwards).
* :mod:`.scalar`: both passes for d = 1 on (T,) arrays, the hot path of local
  level models (a smoother costs about one Kalman filter pass).
* :mod:`.inference`: A(λ), μ = ∇A(λ), marginal moments, samples and validity
  (μ, A and validity together from one pass for a step of the rule),
  choosing among the passes above.
* :mod:`.params`: μ -> λ, the state-space (usual) form <-> λ, and numpyro
  priors (``GaussianRandomWalk``, ``GaussianStateSpace``, banded
  ``MultivariateNormal``) -> λ.
* :mod:`.distribution`: the numpyro distributions ``ChainGaussianDistribution``
  (values (..., T, d)) and ``ScalarChainGaussianDistribution`` (values (..., T)).
* :mod:`.family`: the four :class:`~blrppl.families.base.ExpFamily` values.

This package re-exports the names other modules use; everything else is
imported from its module.
"""

from blrppl.families.chain_gaussian.distribution import to_numpyro
from blrppl.families.chain_gaussian.family import (
    CHAIN_GAUSSIAN,
    CHAIN_GAUSSIAN_PARALLEL,
    SCALAR_CHAIN_GAUSSIAN,
    SCALAR_CHAIN_GAUSSIAN_PARALLEL,
)
from blrppl.families.chain_gaussian.inference import (
    checked_moments,
    is_valid,
    log_normalizer,
    mean_and_log_normalizer,
    mean_params,
    moments,
    sample,
)
from blrppl.families.chain_gaussian.params import (
    from_numpyro,
    from_usual,
    natural_params,
    to_usual,
)
from blrppl.families.chain_gaussian.stats import (
    ChainGaussianStats,
    sufficient_stats,
    vmap_over_batch,
)

__all__ = [
    "CHAIN_GAUSSIAN",
    "CHAIN_GAUSSIAN_PARALLEL",
    "SCALAR_CHAIN_GAUSSIAN",
    "SCALAR_CHAIN_GAUSSIAN_PARALLEL",
    "ChainGaussianStats",
    "checked_moments",
    "from_numpyro",
    "from_usual",
    "is_valid",
    "log_normalizer",
    "mean_and_log_normalizer",
    "mean_params",
    "moments",
    "natural_params",
    "sample",
    "sufficient_stats",
    "to_numpyro",
    "to_usual",
    "vmap_over_batch",
]
