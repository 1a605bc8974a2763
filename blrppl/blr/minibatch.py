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
    """The minibatch of step ``step`` (from 1): epoch-wise random permutations."""
    per_epoch = max(size // batch_size, 1)
    index = step - 1
    epoch, position = index // per_epoch, index % per_epoch
    permutation = jax.random.permutation(jax.random.fold_in(batch_key, epoch), size)
    return jax.lax.dynamic_slice(permutation, (position * batch_size,), (batch_size,))


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
