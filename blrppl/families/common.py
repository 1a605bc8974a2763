"""Helpers shared by the family modules: dtypes, numpyro unwrapping, small linear algebra, errors."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401 - jax.scipy.linalg.solve_triangular
import numpyro.distributions as dist

from blrppl.errors import ModelError

_WRAPPERS = (dist.ExpandedDistribution, dist.Independent, dist.MaskedDistribution)


def as_floats(*values: Any) -> tuple[jax.Array, ...]:
    """Cast ``values`` to one floating dtype without promoting the caller's.

    Python scalars are weakly typed, so ``as_floats(0.0, float32_array)`` stays
    float32; integers and bare Python scalars become ``jnp.result_type(float)``.
    """
    dtype = jnp.result_type(*values)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    return tuple(jnp.asarray(v, dtype=dtype) for v in values)


def unwrap(d: dist.Distribution) -> dist.Distribution:
    """Strip ``ExpandedDistribution`` / ``Independent`` / ``MaskedDistribution``."""
    while isinstance(d, _WRAPPERS):
        d = d.base_dist
    return d


def target_batch_shape(d: dist.Distribution, event_ndim: int) -> tuple[int, ...]:
    """The family batch shape of ``d``: its full shape less the family's event."""
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    if len(shape) < event_ndim:
        raise not_in_family(d, "", f"needs at least {event_ndim} value dimension(s)")
    return shape[: len(shape) - event_ndim]


def not_in_family(d: Any, family: str, detail: str = "") -> ModelError:
    """Build the error for a distribution that is not in ``family``."""
    name = type(d).__name__
    wrapped = unwrap(d) if isinstance(d, dist.Distribution) else d
    if wrapped is not d:
        name = f"{name} of {type(wrapped).__name__}"
    detail = f" ({detail})" if detail else ""
    target = f"the {family} family" if family else "this family"
    return ModelError(
        f"a {name} distribution is not in {target}{detail}; choose a family "
        "that contains it, or give the site's q family explicitly with families=..."
    )


def symmetrize(matrix: jax.Array) -> jax.Array:
    """Return (M + M^T) / 2 over the last two axes."""
    return 0.5 * (matrix + jnp.swapaxes(matrix, -1, -2))


def outer(x: jax.Array) -> jax.Array:
    """Return x x^T over the last axis, batched."""
    return x[..., :, None] * x[..., None, :]


def cholesky_log_det(chol: jax.Array) -> jax.Array:
    """log|M| from the Cholesky factor of M."""
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


def cholesky_inverse(chol: jax.Array) -> jax.Array:
    """M^{-1} from the lower Cholesky factor of M, symmetrised."""
    d = chol.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(d, dtype=chol.dtype), chol.shape)
    inv_chol = jax.scipy.linalg.solve_triangular(chol, eye, lower=True)
    return jnp.swapaxes(inv_chol, -1, -2) @ inv_chol


def solve_draws(chol: jax.Array, draws: jax.Array) -> jax.Array:
    """L⁻ᵀ ε for each of ``draws`` (shape ``sample + batch + (d,)``), L lower (``batch + (d, d)``).

    The draws are the columns of one right-hand side per matrix (one triangular solve
    with S columns), never S solves with copies of L: a 2,500-dimensional block drawn 16
    times made a (16, 2500, 2500) copy (800 MB) and a batched LAPACK call, which jaxlib
    0.10 can deadlock on.
    """
    batch_and_event = chol.shape[:-1]
    sample_shape = draws.shape[: draws.ndim - len(batch_and_event)]
    count = math.prod(sample_shape)
    columns = jnp.moveaxis(jnp.reshape(draws, (count,) + batch_and_event), 0, -1)  # batch + (d, S)
    solved = jax.scipy.linalg.solve_triangular(jnp.swapaxes(chol, -1, -2), columns, lower=False)
    return jnp.reshape(jnp.moveaxis(solved, -1, 0), draws.shape)


def is_positive_definite(matrix: jax.Array) -> jax.Array:
    """Batch-shaped bool: the symmetric part of ``matrix`` is positive definite."""
    chol = jnp.linalg.cholesky(symmetrize(matrix))
    finite = jnp.all(jnp.isfinite(chol), axis=(-2, -1))
    positive = jnp.all(jnp.diagonal(chol, axis1=-2, axis2=-1) > 0, axis=-1)
    return finite & positive
