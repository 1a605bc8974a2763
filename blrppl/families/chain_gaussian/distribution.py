"""numpyro distributions over chains, from chain-Gaussian natural parameters.

    log q(x) = <λ, T(x)> - A(λ),   T(x) = (x_t, x_t x_tᵀ, x_t x_{t+1}ᵀ),  h(x) = 1,

with A(λ), the marginal moments and the samples of
:mod:`~blrppl.families.chain_gaussian.inference`, so every method is O(T d³)
and no dense (T d) x (T d) matrix is formed. :class:`ChainGaussianDistribution`
has values (..., T, d); :class:`ScalarChainGaussianDistribution` has values
(..., T), like ``GaussianRandomWalk``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families.chain_gaussian.inference import log_normalizer, moments, sample
from blrppl.families.chain_gaussian.stats import (
    STATS_NDIM,
    ChainGaussianStats,
    check_method,
    sufficient_stats,
)

# The distribution's moments are read eagerly (``result.posterior[...].mean``):
# one compiled pass per chain shape instead of op-by-op dispatch of the scans.
_compiled_moments = jax.jit(moments, static_argnames="method")


class ChainGaussianDistribution(dist.Distribution):
    """A numpyro distribution over chains (..., T, d), from natural parameters λ.

    ``log_prob``, ``sample``, ``mean`` (..., T, d) and ``variance`` (..., T, d)
    (marginal variances) are O(T d³); ``marginal_covariance`` gives the (T, d, d)
    marginal blocks and ``lag_one_covariance`` the (T-1, d, d) Cov(x_t, x_{t+1}).

    Args:
        natural: λ, a :class:`ChainGaussianStats` of shapes (..., T, d),
            (..., T, d, d) and (..., T-1, d, d).
        method: ``"sequential"`` or ``"parallel"`` passes.
        validate_args: as for every numpyro distribution.
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
        check_method(method)
        self.natural = ChainGaussianStats(*natural)
        self.method = method
        shape = jnp.shape(self.natural.x)
        super().__init__(
            batch_shape=shape[:-2], event_shape=shape[-2:], validate_args=validate_args
        )

    def sample(self, key: PRNGKey, sample_shape: tuple[int, ...] = ()) -> Array:
        return sample(key, self.natural, sample_shape, self.method)

    def log_prob(self, value: ArrayLike) -> Array:
        stats = sufficient_stats(value)
        inner = sum(
            jnp.sum(lam * t, axis=tuple(range(t.ndim - n, t.ndim)))
            for lam, t, n in zip(self.natural, stats, STATS_NDIM)
        )
        return inner - log_normalizer(self.natural, self.method)

    @property
    def mean(self) -> Array:
        return _compiled_moments(self.natural, self.method)[0]

    @property
    def marginal_covariance(self) -> Array:
        """The marginal covariance blocks Σ_t, shape (..., T, d, d)."""
        return _compiled_moments(self.natural, self.method)[1]

    @property
    def lag_one_covariance(self) -> Array:
        """The lag-one cross-covariances Cov(x_t, x_{t+1}), shape (..., T-1, d, d)."""
        return _compiled_moments(self.natural, self.method)[2]

    @property
    def variance(self) -> Array:
        return jnp.diagonal(self.marginal_covariance, axis1=-2, axis2=-1)


class ScalarChainGaussianDistribution(ChainGaussianDistribution):
    """:class:`ChainGaussianDistribution` with d = 1 and values (..., T).

    Values are shaped like those of ``GaussianRandomWalk``; ``natural`` holds
    the (T, 1) form of λ.
    """

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

    def sample(self, key: PRNGKey, sample_shape: tuple[int, ...] = ()) -> Array:
        return super().sample(key, sample_shape)[..., 0]

    def log_prob(self, value: ArrayLike) -> Array:
        return super().log_prob(jnp.asarray(value)[..., None])

    @property
    def mean(self) -> Array:
        return super().mean[..., 0]

    @property
    def variance(self) -> Array:
        return super().variance[..., 0]


def to_numpyro(
    natural: ChainGaussianStats, method: str = "sequential"
) -> ChainGaussianDistribution:
    """Return :class:`ChainGaussianDistribution` with event shape (T, d)."""
    return ChainGaussianDistribution(natural, method)
