"""An adaptive grid over h in Hessian-standardised coordinates, evaluated by ``vmap``.

With u* the mode of f(u) = log p(u, y) and -∇²f(u*) = V Λ Vᵀ, the
standardised coordinates z are u = u* + V Λ^(-1/2) z (Rue, Martino & Chopin
2009, Sec. 6.5). Nodes sit on the lattice z = δ n (n integer). Posteriors of
scales are skewed, so the extent is found per direction: along each axis of
z, both ways, f is evaluated until it has dropped ``drop`` below f(u*); the
lattice points inside the (skewed) ellipsoid through those extents are the
first set of nodes, all evaluated as one ``jax.vmap`` of the compiled
conditional fit. Then any node whose f is within ``drop`` of the best gets
its lattice neighbours evaluated too (usually none are missing), so the grid
covers the whole region where f is within ``drop`` of its maximum, whatever
its shape. Nodes further below are pruned from the mixture (their weights are
below e^-drop); every evaluated node counts in the evidence:

    log p(y) ≈ log Σ_n exp f(u_n) + k log δ + log |det V Λ^(-1/2)|,

the trapezoidal rule, which for smooth, fast-decaying integrands converges
faster than any power of δ.

The grid reports what would make it untrustworthy: weight on nodes at its
edge, more than one local maximum, a Hessian at the mode that is not negative
definite, a mode search that did not converge, a grid node above the mode.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr.integrate.mode import LINE_SEARCH
from blrppl.blr.watchdog import block_until_ready
from blrppl.graph.jaxpr import map_batch
from blrppl.compile_mode import size_dependent_jit

#: Standardised reach of the first evaluations along each axis, and the most.
FIRST_REACH = 8.0
MAX_REACH = 64.0
#: The fewest nodes per call of the compiled conditional fit.
MIN_CHUNK = 32
#: Normalised weight on edge nodes above which the grid is reported truncated.
EDGE_TOL = 1e-4
#: Local maxima within this many log units of the best count as modes.
MODE_DROP = 12.0


def default_step(dim: int) -> float:
    """δ by dimension: fine in one or two dimensions, coarser above (node counts grow as δ^-k)."""
    return {0: 1.0, 1: 0.5, 2: 0.6, 3: 0.8}.get(dim, 1.0)


class Standardised(NamedTuple):
    """u = mode + scale @ z.

    Attributes:
      mode: u*, shape (k,).
      scale: V Λ^(-1/2), shape (k, k).
      log_det: log |det scale|.
      definite: whether -∇²f(u*) is positive definite (else |Λ| was used).
    """

    mode: np.ndarray
    scale: np.ndarray
    log_det: float
    definite: bool


def standardise(mode: Any, hessian: Any) -> Standardised:
    """Standardised coordinates at the mode from the Hessian of f there."""
    mode = np.asarray(mode, dtype=np.float64)
    k = mode.shape[0]
    if k == 0:
        return Standardised(mode, np.zeros((0, 0)), 0.0, True)
    precision = -0.5 * (np.asarray(hessian, np.float64) + np.asarray(hessian, np.float64).T)
    eigval, eigvec = np.linalg.eigh(precision)
    definite = bool(np.all(eigval > 0) and np.all(np.isfinite(eigval)))
    floor = 1e-8 * max(1.0, float(np.max(np.abs(eigval[np.isfinite(eigval)]), initial=1.0)))
    eigval = np.where(np.isfinite(eigval), np.maximum(np.abs(eigval), floor), 1.0)
    scale = eigvec / np.sqrt(eigval)
    return Standardised(mode, scale, float(-0.5 * np.sum(np.log(eigval))), definite)


class Grid(NamedTuple):
    """The evaluated grid.

    Attributes:
      lattice: integer lattice coordinates of the kept nodes, (K, k).
      u: the kept nodes on h's unconstrained space, (K, k).
      log_joint: f at the kept nodes, (K,).
      log_weights: normalised log weights of the kept nodes, (K,).
      states: the conditional fits at the kept nodes (a state, leading axis K; no key: the
        fits are deterministic).
      log_evidence: log p(y) by the trapezoidal rule over every evaluated node.
      step: δ.
      standardised: the :class:`Standardised` coordinates.
      num_evaluated: nodes evaluated (kept and pruned).
      edge_weight: normalised weight on evaluated nodes with an unevaluated neighbour.
      num_modes: local maxima of f on the grid within ``MODE_DROP`` of the best.
      best_above_mode: how far the best node's f lies above f(u*).
      capped: the grid stopped at ``max_nodes`` or at the largest reach.
      inner_steps: the most inner steps any kept node took.
      unsettled_weight: normalised weight on evaluated nodes whose iterative inner fit ran
        out of steps (0 for a one-step exact fit).
      num_unsettled: how many evaluated nodes those are.
      num_non_finite: evaluated nodes where f was not finite (left out).
    """

    lattice: np.ndarray
    u: jax.Array
    log_joint: jax.Array
    log_weights: jax.Array
    states: Any
    log_evidence: float
    step: float
    standardised: Standardised
    num_evaluated: int
    edge_weight: float
    num_modes: int
    best_above_mode: float
    capped: bool
    inner_steps: int
    num_non_finite: int = 0
    unsettled_weight: float = 0.0
    num_unsettled: int = 0


def chunk_size(dim: int) -> int:
    """Nodes per call of the compiled conditional fit: a Newton step's points, rounded up.

    Every evaluation (the mode search's stencils and line searches, the axis
    searches, the grid) runs this one vmapped program, so a fit compiles it
    once, whatever the number of nodes. A call's cost is mostly fixed
    overhead up to a few dozen nodes, hence at least ``MIN_CHUNK``.
    """
    points = 1 + 2 * dim + 2 * dim * (dim - 1) + len(LINE_SEARCH) - 1
    return max(MIN_CHUNK, 1 << (points - 1).bit_length())


@size_dependent_jit(data_argnum=2, static_argnums=0)
def _starts(conditional, u, arrays):
    return map_batch(lambda x: conditional.start(x, arrays), u)


@size_dependent_jit(data_argnum=2, static_argnums=0)
def _steps(conditional, u, arrays, start):
    state, value, steps = map_batch(lambda x, s: conditional.fit(x, arrays, s), u, start)
    # The fits are deterministic: their key is not needed, and without it the states are plain
    # arrays that the grid's bookkeeping slices on the host (numpy), so that node counts, which
    # change with the data, never reach a compiled program (each new shape would compile one).
    return state._replace(rng_key=None), value, steps


def _fits(conditional, u, arrays):
    # Two programs, not one: XLA (CPU) runs init and step compiled together 10-30x slower
    # than the two apart on some plans (non-centred eight schools: ~10 ms against ~0.8 ms
    # per 32 nodes; the cause, somewhere in XLA's fusion, was not found).
    return _steps(conditional, u, arrays, _starts(conditional, u, arrays))


def evaluate(conditional: Any, u: np.ndarray, arrays: Any, *, states: bool = True) -> Any:
    """f (and the fits) at the rows of ``u``, by chunks (:func:`chunk_size`) of one vmapped program."""
    u = np.asarray(u, dtype=np.float64).reshape(-1, conditional.space.dim)
    chunk = chunk_size(conditional.space.dim)
    n = u.shape[0]
    dtype = jnp.result_type(float)
    parts_state, parts_value, parts_steps = [], [], []
    for start in range(0, max(n, 1), chunk):
        block = u[start : start + chunk]
        size = block.shape[0]
        if size < chunk:
            fill = block[:1] if size else np.zeros((1, u.shape[1]))
            block = np.concatenate([block, np.repeat(fill, chunk - size, axis=0)])
        state, value, steps = block_until_ready(
            _fits(conditional, jnp.asarray(block, dtype), arrays), "the grid's conditional fits"
        )
        parts_value.append(np.asarray(value)[:size])
        parts_steps.append(np.asarray(steps)[:size])
        if states:
            parts_state.append(jax.tree.map(lambda a: np.asarray(a)[:size], state))
    value = np.concatenate(parts_value)
    if not states:
        return value
    state = parts_state[0] if len(parts_state) == 1 else jax.tree.map(lambda *xs: np.concatenate(xs), *parts_state)
    return state, value, np.concatenate(parts_steps)


def _clean(values: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(values), values, -np.inf)


def axis_extents(conditional: Any, arrays: Any, coords: Standardised, top: float, step: float, drop: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """Lattice extents (n⁻, n⁺) along each axis of z where f has dropped by ``drop``.

    Returns ``(lower, upper, capped)``; ``capped`` when some direction had not
    dropped within ``MAX_REACH``.
    """
    k = coords.mode.shape[0]
    extents = np.zeros((2, k), dtype=int)
    pending = [(side, i) for side in (0, 1) for i in range(k)]
    start, reach, capped = 1, FIRST_REACH, False
    while pending:
        stop = int(math.ceil(reach / step))
        js = np.arange(start, stop + 1)
        z = []
        for side, i in pending:
            direction = np.zeros(k)
            direction[i] = 1.0 if side else -1.0
            z.append(step * js[:, None] * direction)
        z = np.concatenate(z)
        values = _clean(evaluate(conditional, coords.mode + z @ coords.scale.T, arrays, states=False))
        values = values.reshape(len(pending), len(js))
        still = []
        for row, (side, i) in zip(values, pending):
            fallen = np.nonzero(top - row > drop)[0]
            if fallen.size:
                extents[side, i] = js[fallen[0]]
            elif reach >= MAX_REACH:
                extents[side, i] = js[-1]
                capped = True
            else:
                still.append((side, i))
        pending, start, reach = still, stop + 1, 2.0 * reach
    return extents[0], extents[1], capped


def first_nodes(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Lattice points inside the skewed ellipsoid with semi-axes ``lower``/``upper`` (n⁻, n⁺)."""
    k = lower.shape[0]
    if k == 0:
        return np.zeros((1, 0), dtype=int)
    axes = [np.arange(-lo, up + 1) for lo, up in zip(lower, upper)]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, k)
    semi = np.where(mesh < 0, np.maximum(lower, 1), np.maximum(upper, 1))
    radius = np.sum((mesh / semi) ** 2, axis=1)
    return mesh[radius <= 1.0 + 1e-9]


def _neighbours(node: tuple) -> list:
    out = []
    for i in range(len(node)):
        for d in (-1, 1):
            n = list(node)
            n[i] += d
            out.append(tuple(n))
    return out


def build_grid(conditional: Any, arrays: Any, coords: Standardised, top: float, step: float, drop: float, max_nodes: int) -> Grid:
    """Explore, evaluate and prune the grid (module docstring)."""
    k = coords.mode.shape[0]
    lower, upper, capped = axis_extents(conditional, arrays, coords, top, step, drop) if k else (np.zeros(0, int), np.zeros(0, int), False)
    limit = int(math.ceil(MAX_REACH / step))
    frontier = [tuple(int(x) for x in n) for n in first_nodes(lower, upper)]
    index: dict = {}
    values, all_states, steps = [], [], []
    while frontier:
        if len(index) + len(frontier) > max_nodes:
            frontier = frontier[: max(0, max_nodes - len(index))]
            capped = True
            if not frontier:
                break
        lattice = np.asarray(frontier, dtype=float).reshape(len(frontier), k)
        state, value, n_steps = evaluate(conditional, coords.mode + (step * lattice) @ coords.scale.T, arrays)
        for n in frontier:
            index[n] = len(index)
        values.append(_clean(value))
        all_states.append(state)
        steps.append(n_steps)
        flat = np.concatenate(values)
        best = np.max(flat)
        missing = set()
        for n, i in index.items():
            if flat[i] >= best - drop:
                for m in _neighbours(n):
                    if m not in index and max((abs(x) for x in m), default=0) <= limit:
                        missing.add(m)
        if any(max((abs(x) for x in m), default=0) > limit for n, i in index.items() if flat[i] >= best - drop for m in _neighbours(n)):
            capped = True
        frontier = sorted(missing)
    flat = np.concatenate(values)
    nodes = list(index)
    lattice = np.asarray(nodes, dtype=int).reshape(len(nodes), k)
    states = jax.tree.map(lambda *xs: np.concatenate(xs), *all_states)
    best = float(np.max(flat))
    log_norm = best + math.log(float(np.sum(np.exp(flat - best))))
    log_evidence = log_norm + k * math.log(step) + coords.log_det
    weights = np.exp(flat - log_norm)
    unsettled = (np.concatenate(steps) >= conditional.num_steps) if conditional.num_steps > 1 else np.zeros(len(flat), bool)
    edge = sum(weights[i] for n, i in index.items() if any(m not in index for m in _neighbours(n)))
    modes = _count_modes(index, flat, best)
    keep = np.nonzero(flat >= best - drop)[0]
    kept_log = flat[keep] - (best + math.log(float(np.sum(np.exp(flat[keep] - best)))))
    u = coords.mode + (step * lattice[keep]) @ coords.scale.T
    return Grid(
        lattice=lattice[keep],
        # device_put, not jnp.asarray: in this JAX, asarray of a numpy array compiles a program per shape.
        u=jax.device_put(np.asarray(u, jnp.result_type(float))),
        log_joint=jax.device_put(flat[keep]),
        log_weights=jax.device_put(kept_log),
        states=jax.device_put(jax.tree.map(lambda a: a[keep], states)),
        log_evidence=float(log_evidence),
        step=float(step),
        standardised=coords,
        num_evaluated=len(index),
        edge_weight=float(edge),
        num_modes=modes,
        best_above_mode=float(best - top),
        capped=bool(capped),
        inner_steps=int(np.max(np.concatenate(steps)[keep])) if keep.size else 0,
        num_non_finite=int(np.sum(~np.isfinite(flat))),
        unsettled_weight=float(np.sum(weights[unsettled])),
        num_unsettled=int(np.sum(unsettled)),
    )


def _count_modes(index: dict, values: np.ndarray, best: float) -> int:
    count = 0
    for n, i in index.items():
        if values[i] < best - MODE_DROP:
            continue
        around = [index.get(m) for m in _neighbours(n)]
        if all(j is not None and values[i] >= values[j] for j in around):
            count += 1
    return count
