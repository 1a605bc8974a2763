"""Minibatches of one subsampled plate (stochastic VI, Khan & Rue, Sec. 5.3).

Each step reads a minibatch of M of the plate's N observations (blrppl's
own epoch-wise permutation: every observation once per epoch when M divides
N). Variables local to the plate get ρ = 1 on their minibatch rows; global
variables take a step of size ρ_t towards the rescaled minibatch target
(Hoffman et al. 2013):

    λ ← (1 - ρ_t) λ + ρ_t [Σ_{f outside} λ̃_f + (N / M) Σ_{f in plate} λ̃_f(batch)]   (Eq. 58)

In local mode (Eq. 60; incremental, Neal & Hinton) each observation keeps
its latest contribution to the global site parameters: refreshing a
minibatch swaps its old contributions for new ones, so after one pass at
ρ = 1 a conjugate model with one global latent is exact. Contributions are
stored compactly (see :mod:`blrppl.blr.incremental`). The step itself is
the one BLR step of :mod:`blrppl.blr.build`; this module draws the batches and
reads and writes the rows of plate-local variables.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp



#: The fold of a run's random stream that draws its minibatch permutations
#: (steps use folds 0, 1, 2, ...).
BATCH_STREAM = 2**31 - 1


def batch_key(run_key: jax.Array) -> jax.Array:
    """The key of a run's epoch permutations, from the run's stream (``state.rng_key``)."""
    return jax.random.fold_in(run_key, BATCH_STREAM)


def minibatch(batch_key: jax.Array, step: jax.Array, size: int, batch_size: int) -> jax.Array:
    """The minibatch of step ``step`` (from 1): epoch-wise random permutations, in O(M).

    Epoch e's permutation of the N rows is a keyed bijection (a Feistel
    network over the next even power of two, cycle-walked into [0, N)), so
    a step computes its M rows only, never all N (a full permutation costs a
    sort of N keys per step: 1 s at N = 10^6 on one CPU core). Every row is
    read once per epoch when M divides N.
    """
    per_epoch = max(size // batch_size, 1)
    index = jnp.asarray(step) - 1
    epoch, position = index // per_epoch, index % per_epoch
    positions = (position * batch_size + jnp.arange(batch_size)).astype(jnp.uint32)
    return permuted(jax.random.fold_in(batch_key, epoch), positions, size).astype(int)  # the default int dtype


FEISTEL_ROUNDS = 4


def _mix(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijective avalanche of a uint32."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def permuted(key: jax.Array, positions: jax.Array, size: int) -> jax.Array:
    """π(positions) for a random bijection π of [0, size) drawn by ``key`` (uint32 in, uint32 out)."""
    if size > 2**32:
        raise ValueError(f"a plate of {size} rows is more than minibatches index (2^32).")
    half = max(1, (max(size - 1, 1).bit_length() + 1) // 2)
    mask = jnp.uint32((1 << half) - 1)
    round_keys = jax.random.bits(key, (FEISTEL_ROUNDS,), jnp.uint32)

    def feistel(x):
        left, right = x >> half, x & mask
        for k in range(FEISTEL_ROUNDS):
            left, right = right, left ^ (_mix(right ^ round_keys[k]) & mask)
        return (left << half) | right

    # Cycle walking: a bijection of [0, 4^half) restricted to [0, size) by re-applying it.
    return jax.lax.while_loop(
        lambda y: jnp.any(y >= size), lambda y: jnp.where(y >= size, feistel(y), y), feistel(positions)
    )


def take_rows(tree: Any, rows: jax.Array, axis: int) -> Any:
    """The rows ``rows`` of every leaf along ``axis``."""
    return jax.tree.map(lambda a: jnp.take(a, rows, axis=axis), tree)


def put_rows(tree: Any, rows: jax.Array, values: Any, axis: int) -> Any:
    """Every leaf with its rows ``rows`` along ``axis`` replaced by ``values``' rows."""
    def put(a, v):
        moved = jnp.moveaxis(a, axis, 0)
        moved = moved.at[rows].set(jnp.moveaxis(v, axis, 0))
        return jnp.moveaxis(moved, 0, axis)

    return jax.tree.map(put, tree, values)
