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
from blrppl.symbolic.terms import Operand


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


def _tied(term: StatTerm, position: int, info: VarInfo) -> StatTerm:
    read = term.reads[position]
    nb = info.num_batch
    steps = info.shape[nb] - 1
    time = read.index[nb]
    if len(time.labels) != 1:
        raise UntiedChain(read.var, "its pairs are read along several labels at once")
    label = time.labels[0]
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
