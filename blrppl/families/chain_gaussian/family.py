"""The chain Gaussian as :class:`~blrppl.families.base.ExpFamily` values.

    q(x) = h(x) exp(<λ, T(x)> - A(λ)),   h(x) = 1,   μ = ∇A(λ),

with T, A, μ and the conversions of the sibling modules (see the package
docstring). Four values: :data:`CHAIN_GAUSSIAN` and
:data:`CHAIN_GAUSSIAN_PARALLEL` over states (..., T, d) with sequential or
parallel passes, and :data:`SCALAR_CHAIN_GAUSSIAN` and
:data:`SCALAR_CHAIN_GAUSSIAN_PARALLEL` over scalar states (..., T), the q of a
``GaussianRandomWalk``, whose statistics drop the trailing unit axes: x (..., T),
xx (..., T), x_next (..., T-1). The scalar views route every function through
the d = 1 form, so they share its fast path.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.layout import Layout, symmetrize
from blrppl.families.mvn import MVNStats
from blrppl.families.normal import NormalStats
from blrppl.families.chain_gaussian.distribution import (
    ScalarChainGaussianDistribution,
    to_numpyro,
)
from blrppl.families.chain_gaussian.inference import (
    checked_moments,
    is_valid,
    log_normalizer,
    mean_and_log_normalizer,
    mean_params,
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
    batch_shape,
    sufficient_stats,
)


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0, batch shaped."""
    (x,) = common.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-2], x.dtype)


def expected_log_base_measure(natural: ChainGaussianStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros(batch_shape(natural), natural.x.dtype)


def _vector_states(natural: ChainGaussianStats) -> ChainGaussianStats:
    """The (..., T, 1) form of scalar-state statistics (..., T)."""
    return ChainGaussianStats(
        natural.x[..., None],
        natural.xx[..., None, None],
        natural.x_next[..., None, None],
    )


def _scalar_states(stats: ChainGaussianStats) -> ChainGaussianStats:
    """The (..., T) form of d = 1 statistics (..., T, 1)."""
    return ChainGaussianStats(
        stats.x[..., 0], stats.xx[..., 0, 0], stats.x_next[..., 0, 0]
    )


def _scalar_family(name: str, method: str) -> ExpFamily:
    """The chain Gaussian over scalar states, every function via the d = 1 form."""

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
        mean_and_log_normalizer=lambda n: _scalar_moments(mean_and_log_normalizer(_vector_states(n), method)),
        checked_moments=lambda n: _scalar_moments(checked_moments(_vector_states(n), method)),
        **RECORD,
    )


def _scalar_moments(moments: tuple) -> tuple:
    """``(μ, ...)`` with μ in the (..., T) form of scalar states."""
    return (_scalar_states(moments[0]),) + tuple(moments[1:])


def _to_value_layout(q, mean: ChainGaussianStats) -> dict:
    return dict(mean._asdict())


def _from_value_layout(q, grads: dict) -> ChainGaussianStats:
    # The value layout is the family's: sequences (batch), time, state.
    scalar = q.family.event_ndim == 1
    xx = grads["xx"] if scalar else symmetrize(grads["xx"])
    return q.family.stats_type(x=grads["x"], xx=xx, x_next=grads["x_next"])


def _example(q) -> ChainGaussianStats:
    batch, length, state = q.batch_shape, q.shape[q.num_batch], q.shape[q.num_batch + 1 :]
    if not state:
        return q.family.stats_type(
            x=jnp.zeros(batch + (length,)),
            xx=jnp.full(batch + (length,), -0.5),
            x_next=jnp.zeros(batch + (length - 1,)),
        )
    d = state[0]
    return q.family.stats_type(
        x=jnp.zeros(batch + (length, d)),
        xx=-0.5 * jnp.broadcast_to(jnp.eye(d), batch + (length, d, d)),
        x_next=jnp.zeros(batch + (length - 1, d, d)),
    )


def _marginals(q, mean: ChainGaussianStats):
    """The chain's per-time marginals as independent Gaussian blocks."""
    if jnp.ndim(mean.xx) == jnp.ndim(mean.x):
        return NormalStats(x=mean.x, x_sq=mean.xx)
    return MVNStats(x=mean.x, xxT=mean.xx)


def _from_marginals(q, mean: ChainGaussianStats, grad) -> ChainGaussianStats:
    """Per-time site parameters back in the chain's layout (no lag-one part)."""
    xx = grad.x_sq if isinstance(grad, NormalStats) else grad.xxT
    return type(mean)(x=grad.x, xx=xx, x_next=jnp.zeros_like(mean.x_next))


LAYOUT = Layout(_to_value_layout, _from_value_layout, _example, _marginals, _from_marginals)
"""Value layout = family layout (x, xx, x_next over time); per-time Gaussian marginals."""

#: What the rest of blrppl reads off a chain Gaussian (ExpFamily's record fields).
RECORD = dict(
    kind="chain_gaussian",
    layout=LAYOUT,
    reparameterised=True,
    gaussian=True,
    random_restart=False,
    chain=True,
)


def _family(name: str, method: str, prior_types: tuple = ()) -> ExpFamily:
    """The chain Gaussian over states (..., T, d) with ``method`` passes."""
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
        batch_shape=batch_shape,
        prior_types=prior_types,
        mean_and_log_normalizer=partial(mean_and_log_normalizer, method=method),
        checked_moments=partial(checked_moments, method=method),
        **RECORD,
    )


CHAIN_GAUSSIAN = _family("ChainGaussian", "sequential", (dist.GaussianRandomWalk, dist.GaussianStateSpace))
"""Gaussian chain (..., T, d), block-tridiagonal precision; ``lax.scan`` passes."""

CHAIN_GAUSSIAN_PARALLEL = _family("ChainGaussianParallel", "parallel")
"""The same family with parallel-in-time ``lax.associative_scan`` passes."""

SCALAR_CHAIN_GAUSSIAN = _scalar_family("ScalarChainGaussian", "sequential")
"""Gaussian chain of scalars (..., T), the q of a ``GaussianRandomWalk``; statistics
x (..., T), xx (..., T), x_next (..., T-1); ``from_usual`` takes the d = 1 arrays."""

SCALAR_CHAIN_GAUSSIAN_PARALLEL = _scalar_family(
    "ScalarChainGaussianParallel", "parallel"
)
"""The scalar chain Gaussian with parallel-in-time passes."""
