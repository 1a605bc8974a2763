"""Reads of a tied chain Categorical: neighbouring pairs summed over time.

A chain Categorical's pair reads (:func:`~blrppl.symbolic.chain_reads.chain_categorical_reads`)
pick ``pair[t, i, j] = q(z_t = i, z_{t+1} = j)`` at each step ``t`` a term sums over. Where a
term weighs every step alike (its operand, summed per step of the chain, is the same for
every step: ``trans[z_prev]`` in a scan body, a Dirichlet row's ``E[log trans]``), it reads
only ``Σ_t pair[t]``, the tied family's ``transitions`` statistic
(:mod:`blrppl.families.tied_chain_categorical`). Anything else (a transition matrix per
step, a per-step mask or weight, a pair read at some steps only) raises :class:`UntiedChain`,
and the plan gives the variable the untied family.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.compiled import StatRead, StatTerm
from blrppl.symbolic.statistics import TIED_CHAIN_CATEGORICAL, VarInfo
from blrppl.symbolic.terms import Index, Operand


class UntiedChain(Exception):
    """A term reads a tied chain's pairs with weights that differ between steps."""

    def __init__(self, var: str, reason: str):
        super().__init__(f"{var!r}: {reason}")
        self.var = var


def tie_transitions(term: StatTerm, infos: Mapping[str, VarInfo]) -> StatTerm:
    """``term`` with each pair read of a tied chain replaced by its ``transitions`` read.

    Raises:
      UntiedChain: where the term's weight of the pairs differs between steps.
    """
    for position, read in enumerate(term.reads):
        info = infos.get(read.var)
        if info is None or info.kind != TIED_CHAIN_CATEGORICAL or read.stat != "pair":
            continue
        term = _tied(term, position, info)
    return term


def _without(index: Index, label) -> Index:
    """``index`` without ``label`` where its array is the same all along that label's axis."""
    if index.direct or label not in index.labels or len(index.labels) < 2:
        return index
    array = np.asarray(tape.concrete(index.array))
    axis = index.labels.index(label)
    first = np.take(array, [0], axis=axis)
    if not np.array_equal(array, np.broadcast_to(first, array.shape)):
        return index
    return Index(index.labels[:axis] + index.labels[axis + 1 :], np.take(array, 0, axis=axis))


def _drop_unweighted_steps(term: StatTerm, label, time: Index) -> tuple[StatTerm, Index]:
    """``term`` read only at the positions of ``label`` its operand weighs (a constant mask, not
    data: a scan's first step, whose "pair" with a constant initial carry the chain's reads
    mask out), so that what it reads there does not count against the tie."""
    operand = term.operand
    if operand is None or label not in operand.labels or tape.is_dual(operand.array):
        return term, time
    if any(idx.direct and label in idx.labels for r in term.reads for idx in r.index):
        return term, time  # an axis read in step with the steps: not sliced here
    axis = operand.labels.index(label)
    array = np.asarray(operand.array)
    kept = np.flatnonzero(np.any(np.moveaxis(array, axis, 0).reshape(array.shape[axis], -1) != 0, axis=1))
    if kept.size in (0, array.shape[axis]):
        return term, time

    def keep(index: Index) -> Index:
        if index.direct or label not in index.labels:
            return index
        return Index(index.labels, np.take(np.asarray(tape.concrete(index.array)), kept, axis=index.labels.index(label)))

    reads = tuple(StatRead(r.var, r.stat, tuple(keep(idx) for idx in r.index)) for r in term.reads)
    new = StatTerm(term.coeff, Operand(np.take(array, kept, axis=axis), operand.labels), reads, term.obs_label)
    return new, keep(time)


def _tied(term: StatTerm, position: int, info: VarInfo) -> StatTerm:
    read = term.reads[position]
    nb = info.num_batch
    steps = info.shape[nb] - 1
    time = read.index[nb]
    if len(time.labels) != 1:
        raise UntiedChain(read.var, "its pairs are read along several labels at once")
    label = time.labels[0]
    term, time = _drop_unweighted_steps(term, label, time)
    read = term.reads[position]
    # Other reads may carry the step label in a gather that does not depend on it (a constant
    # initial carry's row ``trans[0]`` joined with the pairs' rows): it is dropped there.
    reads = tuple(
        r if i == position else StatRead(r.var, r.stat, tuple(_without(idx, label) for idx in r.index))
        for i, r in enumerate(term.reads)
    )
    term = StatTerm(term.coeff, term.operand, reads, term.obs_label)
    others = [idx for i, idx in enumerate(read.index) if i != nb]
    others += [idx for r in term.reads[:position] + term.reads[position + 1 :] for idx in r.index]
    if any(label in idx.labels for idx in others):
        raise UntiedChain(read.var, "its step label is read by another statistic of the term")
    # The weight of each step τ: the operand at the term's position t that reads τ.
    operand = term.operand
    if operand is not None and label in operand.labels:
        axis = operand.labels.index(label)
        weights = tape.asarray(operand.array, float)
        labels = operand.labels[:axis] + operand.labels[axis + 1 :]
    else:
        axis, weights, labels = None, None, operand.labels if operand is not None else ()
    if time.direct:
        positions = np.arange(steps)
    else:
        positions = np.asarray(tape.concrete(time.array)).astype(np.int64)
        positions = np.where(positions < 0, positions + steps, positions)
    if positions.ndim != 1 or positions.size == 0 or positions.min() < 0 or positions.max() >= steps:
        raise UntiedChain(read.var, "its pairs are read at positions outside the chain")
    counts = np.bincount(positions, minlength=steps)
    if weights is None:
        if not np.all(counts == counts[0]):
            raise UntiedChain(read.var, "some steps' pairs are read more often than others")
        scale, array = float(counts[0]), None
    else:
        if not np.all(counts == 1):
            raise UntiedChain(read.var, "its weighted pairs are not read once per step")
        per_step = np.moveaxis(np.take(weights, np.argsort(positions), axis=axis), axis, -1)  # labels..., steps
        if not bool(np.all(per_step == per_step[..., :1])):  # a guard where the weights come from the data
            raise UntiedChain(read.var, "its pairs are weighted differently at different steps")
        scale, array = 1.0, per_step[..., 0]
    if array is None and operand is not None:
        array = operand.array
    new_operand = Operand(array, tuple(labels)) if array is not None else None
    tied = StatRead(read.var, "transitions", tuple(others[: len(read.index) - 1]))
    reads = term.reads[:position] + (tied,) + term.reads[position + 1 :]
    return StatTerm(term.coeff * scale, new_operand, reads, term.obs_label)
