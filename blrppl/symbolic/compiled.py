"""The compiled expectation of a log factor: statistic terms, as JAX pytrees.

:func:`~blrppl.symbolic.analysis.analyse` turns ``E_q[log f]`` into an
:class:`Analysis`, a sum of :class:`StatTerm`: a coefficient, one constant
operand (the data's sufficient statistics) and reads (:class:`StatRead`) of
the variables' mean parameters.

An analysis is a pytree whose *leaves* are what the data determine (each
term's coefficient and operand array) and whose static structure is the rest
(the reads, the operands' labels, the observation label), so a jitted
function may take it as an argument: two analyses of one model on data of the
same shapes have equal tree structures, and the function is traced once for
both. Reads hold index arrays (``alpha[county]``, ``log(p)[x]`` for categorical
observations x): those made of a few evenly spaced runs (a chain's steps, read as
static slices) are part of the structure, compared by value; the others are
leaves (:func:`with_index_leaves`), so that new group indices or categories of the
same shapes are fitted by the same compiled program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Optional

import jax
import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.terms import Index, Operand

MAX_RUNS = 8
"""The most evenly spaced runs a constant index is read as (slices joined), not a gather."""

MIN_RUN_LENGTH = 4
"""The shortest mean run of an index kept static (a chain's steps, ``[1, 1, 2, ..., T - 1]``): short
runs are data (8 random group indices are at most 8 runs), whose new values must not compile."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """A leaf index array's place in a term's static structure: its shape and dtype only."""

    shape: tuple
    dtype: str


def _index_key(index: Index) -> tuple:
    if index.direct:
        return (index.labels, None)
    array = index.array
    if isinstance(array, Slot):
        return (index.labels, ("leaf", array.shape, array.dtype))
    if isinstance(array, jax.core.Tracer):  # compared by identity: no value read
        return (index.labels, ("traced", tuple(np.shape(array)), id(array)))
    if tape.is_dual(array):  # by value, guarded by equality with the other keys (tape.Recording.key)
        return (index.labels, (array.shape, str(array.dtype), array.tobytes()))
    array = np.asarray(array)
    return (index.labels, (array.shape, str(array.dtype), array.tobytes()))


def index_runs(positions: np.ndarray, limit: Optional[int] = None) -> list[tuple[int, int, int]]:
    """``positions`` split greedily into evenly spaced runs ``(start, stop, step)`` (step >= 1);
    with ``limit``, the first ``limit + 1`` runs at most (enough to say there are more).

    One iteration per run, not per position: a run ends at the first change of the step after
    its start (the change points of ``diff(positions)``, found once in numpy)."""
    positions = np.asarray(positions).reshape(-1)
    n = positions.size
    steps = np.diff(positions)
    changes = np.flatnonzero(steps[1:] != steps[:-1]) + 1  # k where steps[k] != steps[k - 1]
    runs, i = [], 0
    while i < n and (limit is None or len(runs) <= limit):
        start = int(positions[i])
        step = int(steps[i]) if i + 1 < n else 1
        if i + 1 >= n or step < 1:  # the last position, or a step back: a run of one
            runs.append((start, start + 1, 1))
            i += 1
            continue
        c = int(np.searchsorted(changes, i, side="right"))
        last = int(changes[c]) if c < changes.size else n - 1  # steps[i:last] all equal step
        runs.append((start, int(positions[last]) + 1, step))
        i = last + 1
    return runs


@dataclasses.dataclass(frozen=True, eq=False)
class StatRead:
    """A read of variable ``var``'s statistic ``stat`` at positions ``index``.

    Two reads are equal (and hash equal) when they read the same statistic
    at the same positions; index arrays are compared by value.
    """

    var: str
    stat: str
    index: tuple[Index, ...]

    def _key(self) -> tuple:
        key = self.__dict__.get("_cached_key")  # frozen, so computed once (index arrays read as bytes)
        if key is None or any(isinstance(idx.array, jax.core.Tracer) for idx in self.index):
            key = (self.var, self.stat, tuple(_index_key(idx) for idx in self.index))
            object.__setattr__(self, "_cached_key", key)
        return key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatRead) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclasses.dataclass(frozen=True)
class StatTerm:
    """``coeff * einsum(operand, reads...)`` summed over every label.

    In a per-observation analysis (a factor in a subsampled plate), the
    observation label is kept through pre-contraction so that a minibatch
    can be read; a term that does not read it is the same for every
    observation.

    A pytree: ``coeff`` and ``operand``'s array are leaves
    (:class:`~blrppl.symbolic.terms.Operand` is a pytree too) and ``reads``
    and ``obs_label`` static.
    """

    coeff: Any
    operand: Optional[Operand]
    reads: tuple[StatRead, ...]
    obs_label: Optional[int] = None  # the kept observation label, if the term reads it


@dataclasses.dataclass(frozen=True)
class Analysis:
    """The compiled expectation of one factor: the sum of its ``terms``.

    ``obs_label``/``obs_size``: for a per-observation analysis (a factor in a
    subsampled plate), the kept observation label and the plate's full size;
    otherwise None and 0. ``residual``: a part of log f that depends only on
    variables held at a point (a normaliser such as log B(a, b) of a Beta
    prior whose a and b are held) was left out of the terms; the estimator
    that held them adds it back numerically
    (:func:`blrppl.estimators.hybrid.hybrid_estimator`). A pytree: the terms'
    leaves are its leaves.
    """

    terms: tuple[StatTerm, ...]
    obs_label: Optional[int] = None
    obs_size: int = 0
    residual: bool = False


def _flatten_term(term: StatTerm) -> tuple:
    """Leaves: the coefficient, the operand and the reads' leaf index arrays; structure: the reads
    with a :class:`Slot` for each leaf array, and the observation label.

    A term is frozen, so its structure is made once and kept on it, and a term rebuilt from a
    structure (:func:`_unflatten_term`: a replanned fit's arrays, a compiled call's outputs)
    keeps that same object while its index arrays keep the slots' shapes and dtypes. ``jit``
    flattens its arguments and compares their structures with its cache's at every call: a
    small model's refit built and compared some thirty terms' reads per call."""
    known = term.__dict__.get("_structure")
    if known is not None:
        structure, slots = known
        arrays = tuple(idx.array for read in term.reads for idx in read.index if _is_leaf(idx))
        if len(arrays) == len(slots) and all(_fits(array, slot) for array, slot in zip(arrays, slots)):
            return (term.coeff, term.operand, arrays), structure
    arrays, reads, slots = [], [], []
    for read in term.reads:
        index = []
        for idx in read.index:
            if _is_leaf(idx):
                arrays.append(idx.array)
                slots.append(Slot(tuple(np.shape(idx.array)), _canonical(idx.array.dtype, jax.config.jax_enable_x64)))
                idx = Index(idx.labels, slots[-1], leaf=True)
            index.append(idx)
        reads.append(StatRead(read.var, read.stat, tuple(index)))
    structure = (tuple(reads), term.obs_label)
    object.__setattr__(term, "_structure", (structure, tuple(slots)))
    return (term.coeff, term.operand, tuple(arrays)), structure


def _is_leaf(idx: Index) -> bool:
    return idx.leaf and not idx.direct and not isinstance(idx.array, Slot)


@functools.lru_cache(maxsize=64)
def _canonical(dtype: Any, x64: bool) -> str:
    # The canonical dtype: a host plan's int64 indices are int32 on the device without x64
    # (``x64``: the setting it was read under, part of the cache's key).
    return str(jax.dtypes.canonicalize_dtype(dtype))


def _fits(array: Any, slot: Slot) -> bool:
    dtype = getattr(array, "dtype", None)
    return dtype is not None and tuple(np.shape(array)) == slot.shape and _canonical(dtype, jax.config.jax_enable_x64) == slot.dtype


def _unflatten_term(structure: tuple, leaves: tuple) -> StatTerm:
    reads, obs_label = structure
    coeff, operand, arrays = leaves
    arrays = iter(arrays)
    slots = tuple(i.array for r in reads for i in r.index if isinstance(i.array, Slot))
    reads = tuple(
        StatRead(r.var, r.stat, tuple(Index(i.labels, next(arrays), True) if isinstance(i.array, Slot) else i for i in r.index))
        for r in reads
    )
    term = StatTerm(coeff, operand, reads, obs_label)
    object.__setattr__(term, "_structure", (structure, slots))
    return term


jax.tree_util.register_pytree_node(StatTerm, _flatten_term, _unflatten_term)
jax.tree_util.register_dataclass(Analysis, data_fields=["terms"], meta_fields=["obs_label", "obs_size", "residual"])


def stats_needed(terms: Iterable[StatTerm], var: str) -> set[str]:
    """The statistic names of ``var`` that ``terms`` read."""
    return {r.stat for t in terms for r in t.reads if r.var == var}


def _few_long_runs(positions: np.ndarray) -> bool:
    runs = len(index_runs(positions, MAX_RUNS))
    return runs <= MAX_RUNS and positions.size >= MIN_RUN_LENGTH * runs


def with_index_leaves(analysis: Analysis) -> Analysis:
    """``analysis`` with its index arrays as leaves of the compiled fit where they are data: every
    array that is not a fixed position or a few long evenly spaced runs (``MAX_RUNS``,
    ``MIN_RUN_LENGTH``: a chain's steps, read as static slices). New group indices ``alpha[g]``
    or categorical observations of the same shapes then plan the same structure: no
    compilation. An index computed from the data while a plan is recorded (a
    :class:`~blrppl.graph.tape.Dual`) is decided as the host would decide its value: a leaf is
    replayed from the tape, a static one is guarded (new data must equal it)."""

    def leaf(idx: Index) -> Index:
        if idx.direct or idx.leaf:
            return idx
        array = idx.array.value if tape.is_dual(idx.array) else np.asarray(idx.array)
        if array.ndim == 0 or (array.ndim == 1 and array.min() >= 0 and _few_long_runs(array)):
            if tape.is_dual(idx.array):  # static (as the host would plan it): new data must equal it
                return Index(idx.labels, idx.array.read())  # its value, guarded (a constant of the fit)
            return idx
        # A leaf: data of the compiled fit; one computed from the data on the tape is replayed.
        return Index(idx.labels, idx.array if tape.is_dual(idx.array) else array, True)

    terms = tuple(
        dataclasses.replace(t, reads=tuple(StatRead(r.var, r.stat, tuple(leaf(i) for i in r.index)) for r in t.reads))
        for t in analysis.terms
    )
    return dataclasses.replace(analysis, terms=terms)
