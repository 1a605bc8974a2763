"""The chain Gaussian's statistics: their type, T(x), the precision blocks, batching.

One NamedTuple holds λ, μ and T(x) (see the package docstring):

    T(x) = (x_t,  x_t x_tᵀ,  x_t x_{t+1}ᵀ),   shapes (T, d), (T, d, d), (T-1, d, d),
    λ    = (h_t,  -J_tt / 2,  -J_{t,t+1}),

so the precision blocks of one chain are read off λ as h = λ₁, J_tt = -(λ₂ + λ₂ᵀ)_t
and J_{t,t+1} = -λ₃ (:func:`precision_blocks`). Every routine is written for a
single chain and mapped over leading batch dimensions with
:func:`vmap_over_batch`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from blrppl._types import Array, ArrayLike, ArrayTree
from blrppl.families import common
from blrppl.families.chain_gaussian.linalg import matrix_transpose

METHODS = ("sequential", "parallel")
"""The algorithms for A(λ), μ and samples: ``lax.scan`` or ``lax.associative_scan``."""

STATS_NDIM = (2, 3, 3)
"""Unbatched rank of each field of :class:`ChainGaussianStats`."""


class ChainGaussianStats(NamedTuple):
    """T(x) = (x_t, x_t x_tᵀ, x_t x_{t+1}ᵀ) of a chain x_1..x_T of states in R^d.

    Shapes (..., T, d), (..., T, d, d) and (..., T-1, d, d). As natural
    parameters: (h, -J_tt / 2, -J_{t,t+1}); as mean parameters the
    expectations of the statistics.
    """

    x: Array
    xx: Array
    x_next: Array


def vmap_over_batch(
    fn: Callable[[Any], ArrayTree],
    tree: ArrayTree,
    event_ndim: tuple[int, ...],
    batch_shape: tuple[int, ...],
) -> ArrayTree:
    """Apply ``fn``, written for one chain, over the leading batch axes of ``tree``.

    The leading batch dimensions of every leaf are broadcast, flattened into one
    axis, ``vmap``-ed and restored on every output leaf.

    Args:
        fn: a function of one unbatched ``tree``.
        tree: a pytree whose leaves carry ``batch_shape`` before their event axes.
        event_ndim: the unbatched rank of each leaf of ``tree``, in leaf order.
        batch_shape: the batch shape; with ``()`` this is ``fn(tree)``.

    Returns:
        ``fn``'s output with ``batch_shape`` leading every leaf.
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


def batch_shape(natural: ChainGaussianStats) -> tuple[int, ...]:
    """Return the batch shape of ``natural``: the shape of ``natural.x`` less (T, d)."""
    return tuple(jnp.shape(natural.x)[:-2])


def check_method(method: str) -> None:
    """Raise ``ValueError`` unless ``method`` is one of :data:`METHODS`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")


def precision_blocks(natural: ChainGaussianStats) -> tuple[Array, Array, Array]:
    """Return (h (T, d), J_tt (T, d, d), J_{t,t+1} (T-1, d, d)) of one chain's λ."""
    return natural.x, -(natural.xx + matrix_transpose(natural.xx)), -natural.x_next


def sufficient_stats(x: ArrayLike) -> ChainGaussianStats:
    """Return T(x) = (x_t, x_t x_tᵀ, x_t x_{t+1}ᵀ) for x of shape (..., T, d)."""
    (x,) = common.as_floats(x)
    return ChainGaussianStats(
        x=x, xx=common.outer(x), x_next=x[..., :-1, :, None] * x[..., 1:, None, :]
    )
