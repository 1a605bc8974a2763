"""A sparse Hessian from a few Hessian-vector products.

A D x D Hessian by forward-over-reverse differentiation costs D passes of the
gradient, one per column. Where most entries are structurally zero (the log
joint of a hierarchical model: each group's effect meets only its own rows,
the hyperparameters and the residual scale), columns that share no row can
be pushed through one pass together and read apart afterwards (Curtis, Powell
& Reid 1974); with symmetry, the dense columns (hyperparameters) are pushed
alone and their rows read back from them, so the rest only has to be apart
off those rows (Coleman & Moré 1984). A radon model's 89 x 89 Hessian takes
5 passes instead of 89.

:func:`compression` chooses the groups from a pattern of nonzeros (greedily:
the densest columns alone, as many as pays, and the others grouped so that no
two in a group share a row outside those); :func:`hessian_from_products`
rebuilds the Hessian from the products ``H @ seeds``. The pattern is what the
caller has seen (a full Hessian at one point, and :func:`reach`'s entries the
code can make nonzero there): a nonzero it did not see would
be read into the wrong entry, so :func:`agrees` compares the rebuilt Hessian
with one more, direct product along :func:`probe`, a fixed random direction,
and the caller falls back to the full Hessian where they differ.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np


class Compression(NamedTuple):
    """How to push a Hessian through ``seeds.shape[1]`` products and read it back.

    Attributes:
      seeds: (D, C) 0/1 matrix; column c sums the Hessian's columns of group c.
      source_rows, source_cols: (D, D) integers: entry (i, j) is ``(H @ seeds)[source_rows[i, j],
        source_cols[i, j]]`` where ``listed[i, j]``, else 0.
      listed: (D, D) booleans, the pattern's entries.
    """

    seeds: np.ndarray
    source_rows: np.ndarray
    source_cols: np.ndarray
    listed: np.ndarray

    @property
    def num_products(self) -> int:
        return self.seeds.shape[1]


def compression(pattern: np.ndarray) -> Compression:
    """The fewest products this greedy scheme finds for a Hessian with nonzeros ``pattern``
    (D x D booleans; symmetrised, the diagonal included).

    For each number k of densest columns pushed alone, the others are coloured greedily
    (densest first) so that no two columns of a colour share a row outside the k; the k
    with the fewest products in all wins.
    """
    pattern = np.asarray(pattern, bool)
    dim = pattern.shape[0]
    pattern = pattern | pattern.T | np.eye(dim, dtype=bool)
    counts = pattern.sum(axis=0)
    order = np.argsort(-counts, kind="stable")
    best = (dim, None, None, order)  # every column alone: the full Hessian's passes
    for k in sorted({0} | {int(np.sum(counts >= c)) for c in np.unique(counts)}):
        if k >= best[0]:
            break  # k products for the dense columns alone: no better than the best
        alone = np.zeros(dim, bool)
        alone[order[:k]] = True
        colour = _colours(pattern, order[k:], ~alone, best[0] - k)
        if colour is not None:
            best = (k + (int(colour.max()) + 1 if dim > k else 0), alone, colour, order[:k])
    if best[1] is None:
        best = (dim, np.ones(dim, bool), np.full(dim, -1), order)
    _, alone, colour, dense = best
    group = np.zeros(dim, np.int64)
    group[dense] = np.arange(len(dense))
    group[~alone] = len(dense) + colour[~alone]
    seeds = np.zeros((dim, best[0]))
    seeds[np.arange(dim), group] = 1.0
    # A column pushed alone is read whole (and its row by symmetry), zeros included: a zero the
    # pattern saw there (an effect whose rows of a covariate happened to be 0) may not be one
    # at the next point, and reading it costs nothing.
    pattern[:, alone] = pattern[alone, :] = True
    rows, cols = np.indices((dim, dim))
    # Entry (i, j) is read from column j's group in row i, unless i is a dense column and j is
    # not (row i mixes j's group there): then from H[j, i], column i's own product.
    direct = alone[cols] | ~alone[rows]
    source_rows = np.where(direct, rows, cols)
    source_cols = np.where(direct, group[cols], group[rows])
    return Compression(seeds, source_rows, source_cols, pattern)


def _colours(pattern: np.ndarray, columns: np.ndarray, rows_kept: np.ndarray, limit: int) -> Optional[np.ndarray]:
    """A colour per column (-1 for those not in ``columns``): columns of one colour share no
    nonzero row among ``rows_kept`` (greedy, in the order given); None where that takes
    ``limit`` colours or more."""
    colour = np.full(pattern.shape[0], -1, np.int64)
    used = np.zeros((max(limit, 0), pattern.shape[0]), bool)  # colour -> rows its columns occupy
    count = 0
    for j in columns:
        rows = pattern[:, j] & rows_kept
        free = np.flatnonzero(~used[:count][:, rows].any(axis=1))
        if free.size:
            c = int(free[0])
        elif count + 1 >= limit:
            return None
        else:
            c, count = count, count + 1
        used[c] |= rows
        colour[j] = c
    return colour


def hessian_from_products(products: jax.Array, compression: Compression) -> jax.Array:
    """The Hessian from ``products = H @ compression.seeds`` (D x C)."""
    return jnp.where(compression.listed, products[compression.source_rows, compression.source_cols], 0.0)


def reach(gradient: Callable[[jax.Array], jax.Array], u: jax.Array) -> jax.Array:
    """Which entries of the Hessian (the Jacobian of ``gradient`` at ``u``) the code can make
    nonzero there: D x D booleans, from one pass per coordinate along a NaN tangent, which
    every operation its value reaches passes on (0 x NaN is NaN: a covariate that happens to be
    0 in the data at hand does not hide the entry it multiplies, as the Hessian's own zeros do).
    """
    nans = jnp.where(jnp.eye(u.shape[0], dtype=bool), jnp.nan, 0.0).astype(u.dtype)
    return jnp.isnan(jax.vmap(lambda t: jax.jvp(gradient, (u,), (t,))[1])(nans))


def probe(dim: int, dtype: Any) -> np.ndarray:
    """A fixed random direction (the same for every call: results are reproducible)."""
    return np.random.default_rng(0).normal(size=dim).astype(dtype)


def agrees(hessian: jax.Array, direction: jax.Array, product: jax.Array) -> jax.Array:
    """Whether ``hessian @ direction`` is ``product`` (a direct Hessian-vector product) to
    within sqrt(eps) of the terms' size: False where the pattern missed a nonzero, or where
    either is not finite."""
    tolerance = float(np.sqrt(jnp.finfo(hessian.dtype).eps))
    scale = jnp.abs(hessian) @ jnp.abs(direction) + jnp.abs(product)
    return jnp.all(jnp.abs(hessian @ direction - product) <= tolerance * scale)
