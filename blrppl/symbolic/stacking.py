"""Stacking alike statistic terms into one term over a new label.

A factor that joins the steps of a Python-loop chain (one site per time step)
is analysed site by site, so its analysis holds one copy of each term per
step: the same reads and operand shapes, differing only in the constant
positions they read (``pair`` at time 0, at time 1, ...) and in their
operand values. Evaluated as they are, T copies make T einsums in the
compiled step. :func:`stack_terms` joins every such group into one term with
a new label over the group: the constant positions become an index array
over that label (read as slices by the expectation) and the coefficients and
operands one operand stacked along it, so the loop costs what a ``scan``
costs.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from blrppl.symbolic.compiled import Analysis, StatRead, StatTerm
from blrppl.symbolic.terms import Index, Labels, Operand

_OBS = "obs"


def _appearance(term: StatTerm) -> list:
    """The term's labels in order of first appearance (operand, then reads)."""
    order: list = []
    groups = [term.operand.labels] if term.operand is not None else []
    groups += [idx.labels for read in term.reads for idx in read.index]
    for labels in groups:
        for lab in labels:
            if lab not in order:
                order.append(lab)
    return order


def _signature(term: StatTerm, obs: Any) -> Optional[tuple]:
    """What two terms must share to be stacked (labels renamed by order of appearance)."""
    canon = {lab: (_OBS if lab == obs and obs is not None else i) for i, lab in enumerate(_appearance(term))}
    operand = None
    if term.operand is not None:
        operand = (tuple(canon[lab] for lab in term.operand.labels), tuple(np.shape(term.operand.array)))
    reads = []
    for read in term.reads:
        index = []
        for idx in read.index:
            labels = tuple(canon[lab] for lab in idx.labels)
            if idx.direct:
                index.append(("direct", labels))
            else:  # shape and dtype only: index data on the tape are not read (blrppl.graph.tape)
                index.append(("array", labels, tuple(np.shape(idx.array)), str(idx.array.dtype)))
        reads.append((read.var, read.stat, tuple(index)))
    return (term.obs_label is None, operand, tuple(reads))


def _stack(group: list[StatTerm], space: Labels) -> StatTerm:
    """One term equal to the sum of ``group`` (alike terms with the same labels), over a new label."""
    first = group[0]
    new = space.new(len(group))
    weights = []
    for term in group:
        if term.operand is None:
            weights.append(np.multiply(term.coeff, 1.0))
        else:
            weights.append(np.multiply(term.coeff, term.operand.array))
    operand_labels = (new,) + (tuple(first.operand.labels) if first.operand is not None else ())
    operand = Operand(np.stack(weights), operand_labels)
    reads = []
    for r, read in enumerate(first.reads):
        index = []
        for i, idx in enumerate(read.index):
            if idx.direct:
                index.append(idx)
                continue
            arrays = [term.reads[r].index[i].array for term in group]  # index data stay on the tape
            index.append(Index((new,) + tuple(idx.labels), np.stack(arrays)))
        reads.append(StatRead(read.var, read.stat, tuple(index)))
    return StatTerm(1.0, operand, tuple(reads), first.obs_label)


def stack_terms(analysis: Analysis, space: Labels) -> Analysis:
    """``analysis`` with each group of alike terms (see the module docstring) stacked into one."""
    obs = analysis.obs_label
    groups: dict[tuple, list[StatTerm]] = {}
    for term in analysis.terms:
        groups.setdefault(_signature(term, obs), []).append(term)
    if all(len(group) == 1 for group in groups.values()):
        return analysis
    terms = []
    for group in groups.values():
        if len(group) == 1:
            terms.append(group[0])
            continue
        # Direct labels are renamed onto the first term's, so its labels name them all.
        terms.append(_stack([_renamed(t, group[0]) for t in group], space))
    return Analysis(tuple(terms), analysis.obs_label, analysis.obs_size)


def _renamed(term: StatTerm, like: StatTerm) -> StatTerm:
    """``term`` with its labels renamed onto those of the alike term ``like``."""
    rename = dict(zip(_appearance(term), _appearance(like)))
    operand = None
    if term.operand is not None:
        operand = Operand(term.operand.array, tuple(rename[lab] for lab in term.operand.labels))
    reads = tuple(
        StatRead(
            read.var,
            read.stat,
            tuple(Index(tuple(rename[lab] for lab in idx.labels), idx.array) for idx in read.index),
        )
        for read in term.reads
    )
    return StatTerm(term.coeff, operand, reads, term.obs_label)
