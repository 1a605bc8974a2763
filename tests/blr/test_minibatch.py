"""Minibatches: every row once per epoch, different epochs, O(M) rows per step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.blr.minibatch import minibatch, permuted


@pytest.mark.parametrize("size, batch", [(10, 5), (1000, 100), (1003, 100), (65_537, 4096)])
def test_each_epoch_reads_every_row_once(size, batch):
    key = jax.random.key(3)
    per_epoch = size // batch
    draw = jax.jit(lambda t: minibatch(key, t, size, batch))
    epochs = [np.concatenate([np.asarray(draw(e * per_epoch + p + 1)) for p in range(per_epoch)]) for e in range(2)]
    for rows in epochs:
        assert rows.shape == (per_epoch * batch,) and len(np.unique(rows)) == rows.size
        assert rows.min() >= 0 and rows.max() < size
    assert not np.array_equal(epochs[0], epochs[1])


def test_the_permutation_is_a_bijection_and_looks_random():
    size = 100_003
    values = np.asarray(permuted(jax.random.key(0), jnp.arange(size, dtype=jnp.uint32), size))
    assert np.array_equal(np.sort(values), np.arange(size))
    # Neighbouring positions land far apart (no arithmetic progression); rank correlation ~ 0.
    assert abs(np.corrcoef(np.arange(size), values)[0, 1]) < 0.02
    assert np.median(np.abs(np.diff(values.astype(np.int64)))) > size / 10


def test_large_plates_draw_only_their_batch():
    rows = jax.jit(lambda t: minibatch(jax.random.key(0), t, 10**9, 8))(jnp.asarray(5))
    assert rows.shape == (8,) and int(rows.min()) >= 0 and int(rows.max()) < 10**9
