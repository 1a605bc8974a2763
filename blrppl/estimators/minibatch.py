"""Estimated site parameters on minibatches of a subsampled plate (stochastic VI).

An estimated factor inside ``numpyro.plate(..., subsample_size=M)`` reads a
minibatch by re-running the model on those M rows only (the plate's indices
substituted), so a step costs O(M), never O(N). Its ``estimate(...,
batch=idx)`` returns the *unscaled* minibatch sum of E_q[log f_n] and its
natural gradient; the BLR step rescales it by N / M for global variables
(Khan & Rue, Sec. 5.3; Hoffman et al. 2013). ``batch=None`` means every row,
summed here in chunks of M (a ``lax.scan``: memory O(M), whatever N), with
the same random draws in every chunk so that the sum is one consistent
estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.errors import ModelError

START_SEED = 0
"""Seed of the fixed subsample a minibatch fit's Newton start reads."""


def chunk_rows(size: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (C, M) covering 0..size-1 in chunks of M, and weights (1; 0 on padding)."""
    num_chunks = -(-size // batch_size)
    flat = np.arange(num_chunks * batch_size)
    weights = (flat < size).astype(float)
    flat = np.where(flat < size, flat, 0)
    return flat.reshape(num_chunks, batch_size), weights.reshape(num_chunks, batch_size)


def all_rows(estimate_rows: Callable, size: int, batch_size: int) -> Callable:
    """``estimate(rng_key, mean, params, arrays)`` summing ``estimate_rows`` over every row.

    ``estimate_rows(rng_key, mean, params, arrays, idx, weights)`` returns the
    weighted sum over the rows ``idx`` (value and site parameters); the
    chunks share ``rng_key``.
    """
    indices, weights = chunk_rows(size, batch_size)

    def estimate(rng_key, mean, params, arrays):
        dtype = jnp.result_type(float)
        idx = jnp.asarray(indices)
        w = jnp.asarray(weights, dtype)
        if idx.shape[0] == 1:
            return estimate_rows(rng_key, mean, params, arrays, idx[0], w[0])
        shapes = jax.eval_shape(lambda: estimate_rows(rng_key, mean, params, arrays, idx[0], w[0]))
        zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(total, chunk):
            part = estimate_rows(rng_key, mean, params, arrays, chunk[0], chunk[1])
            return jax.tree.map(jnp.add, total, part), None

        total, _ = jax.lax.scan(body, zero, (idx, w))
        return total

    return estimate


def fixed_subsample(size: int, batch_size: int) -> np.ndarray:
    """M rows drawn once without replacement (fixed seed), sorted: a start's subsample."""
    rng = np.random.default_rng(START_SEED)
    if batch_size >= size:
        return np.arange(size)
    return np.sort(rng.choice(size, batch_size, replace=False))


def on_rows(estimate: Callable, rows: np.ndarray, scale: float) -> Callable:
    """``estimate`` whose full-data calls read ``rows`` only, rescaled by ``scale`` (N / M).

    A minibatch fit's Newton start (:mod:`blrppl.blr.starts`) moves q to the
    mode of the posterior of a fixed subsample with its likelihood rescaled
    to N rows: a start O(M) per step, never a pass over N rows.
    """

    def scaled(rng_key, mean, params, arrays, batch=None):
        if batch is not None:
            return estimate(rng_key, mean, params, arrays, batch=batch)
        value, grads = estimate(rng_key, mean, params, arrays, batch=jnp.asarray(rows))
        return jax.tree.map(lambda g: scale * g, (value, grads))

    return scaled


def rows_or_all(estimate_rows: Callable, plate: Any) -> Callable:
    """The ``estimate(rng_key, mean, params, arrays, batch=None)`` of a minibatch factor."""
    everything = all_rows(estimate_rows, plate.size, plate.subsample_size)

    def estimate(rng_key, mean, params, arrays, batch=None):
        if batch is None:
            return everything(rng_key, mean, params, arrays)
        ones = jnp.ones(jnp.shape(batch), jnp.result_type(float))
        return estimate_rows(rng_key, mean, params, arrays, batch, ones)

    return estimate


def refuse_minibatch(factor: str, batch: Any) -> None:
    """A factor planned without minibatches (full data) is never given a ``batch``."""
    if batch is not None:
        raise ModelError(
            f"site {factor!r}: this estimator was planned for full data and cannot read a minibatch; "
            "plan the fit with SVI (the factor must sit in the subsampled plate)."
        )
