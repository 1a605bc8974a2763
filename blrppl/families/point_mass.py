"""Point estimates for EM: the delta method as a degenerate q (Khan & Rue, Sec. 5.2).

EM is the BLR with q(θ) = N(θ | θ_t, I) for the parameter blocks and the delta
method E_q[f(θ)] ≈ f(θ_t) for their expectations. The fixed covariance means the
entropy of q is a constant that the EM lower bound leaves out, and the update
moves only θ_t. So a point-estimated site carries just its current value: it
is not an :class:`~blrppl.families.base.ExpFamily` and has no entropy or KL.
Anything that needs a numpyro distribution (a guide, a result's ``posterior``)
sees the value as a ``Delta``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpyro.distributions as dist

from blrppl._types import Array, ArrayLike, PRNGKey


class PointMass(NamedTuple):
    """A point estimate θ_t of one site, in the site's own (constrained) space."""

    value: Array


def to_numpyro(value: ArrayLike, event_dim: int = 0) -> dist.Delta:
    """Return ``dist.Delta(value, event_dim=event_dim)``.

    Args:
        value: the point estimate θ_t, shape ``batch_shape + event_shape``.
        event_dim: how many trailing dimensions of ``value`` are the event.

    Example:
        >>> to_numpyro(jnp.zeros(3), event_dim=1).event_shape
        (3,)
    """
    return dist.Delta(jnp.asarray(value), event_dim=event_dim)


def sample(rng_key: PRNGKey, point: PointMass, sample_shape: tuple = ()) -> Array:
    """Return the value repeated: shape ``sample_shape + value.shape``.

    ``rng_key`` is unused (a point mass is deterministic); it is accepted so
    that point estimates and families are sampled the same way.
    """
    del rng_key  # Deterministic.
    value = jnp.asarray(point.value)
    return jnp.broadcast_to(value, tuple(sample_shape) + value.shape)


def from_value(value: ArrayLike) -> PointMass:
    """Wrap a value, cast to a float dtype without promoting float32."""
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.floating):
        value = value.astype(jnp.result_type(float))
    return PointMass(value=value)


__all__ = ["PointMass", "from_value", "sample", "to_numpyro"]
