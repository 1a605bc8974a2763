"""Pairing the reads of one variable within a term.

Under mean-field, q factorises over variables and over the batch positions of
each variable, so the expectation of a product of reads is the product of
their expectations, except where two reads of one variable may land on the
same position. A *pairing* resolves one variable's atoms in a term into
alternatives ``(sign, extra, reads)``: the term's expectation is the sum over
alternatives of ``sign`` times the product of the reads, with ``extra`` (a
label unification, a dict, or a 0/1 mask, an :class:`Operand`) applied to the
whole term. This module holds the pairings of Gaussian, point, categorical
and other single-statistic q's, and the position tests they share; chains are
in :mod:`blrppl.symbolic.chain_reads`, and the table that picks a pairing by
kind in :mod:`blrppl.symbolic.resolve`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from blrppl.symbolic.compiled import StatRead
from blrppl.symbolic.statistics import VarInfo, point_statistic_name, statistic_name
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Operand, Substitution, VarAtom

#: One alternative of a pairing: ``(sign, extra, reads)`` (see the module docstring).
Alternative = tuple[float, Any, tuple[StatRead, ...]]


def index_array(index: Index, space: Labels) -> tuple[np.ndarray, tuple]:
    """The positions an index reads, as an array over its labels."""
    if index.direct:
        lab = index.labels[0]
        return np.arange(space.size[lab]), index.labels
    return np.asarray(index.array), index.labels


def expand_index(index: Index, labels: list, space: Labels) -> np.ndarray:
    """An index's positions broadcast over ``labels`` (its own axes in that order)."""
    array, own = index_array(index, space)
    order = [own.index(lab) for lab in labels if lab in own]
    array = np.transpose(array, order) if array.ndim else array
    shape = [space.size[lab] if lab in own else 1 for lab in labels]
    return array.reshape(shape)


def expand_operand(op: Operand, labels: list) -> np.ndarray:
    """An operand broadcast over ``labels`` (its own axes in that order)."""
    array = np.asarray(op.array)
    own = list(op.labels)
    array = np.transpose(array, [own.index(lab) for lab in labels if lab in own])
    dims = iter(array.shape)
    return array.reshape([next(dims) if lab in own else 1 for lab in labels])


def clip_index(index: Index, top: int, space: Labels) -> Index:
    """The same positions, clipped to ``top`` (masked-out reads stay in bounds)."""
    array, labels = index_array(index, space)
    return Index(tuple(labels), np.minimum(np.asarray(array), top))


def coincide(a: tuple[Index, ...], b: tuple[Index, ...], space: Labels, protected=frozenset()):
    """Where do two positions (tuples of indices) coincide?

    Returns ``("same", None)``, ``("never", None)``, ``("unify", subs)`` (the
    positions coincide exactly when these labels are equal) or
    ``("mask", operand)`` (a 0/1 constant over the labels involved). A
    ``protected`` label (the kept observation label) is never renamed away.
    """
    if all(x.same_as(y) for x, y in zip(a, b)):
        return "same", None
    if all(x.direct and y.direct for x, y in zip(a, b)):
        subs = {}
        for x, y in zip(a, b):
            if x.labels != y.labels:
                if y.labels[0] in protected:
                    subs[x.labels[0]] = Substitution(y.labels)
                else:
                    subs[y.labels[0]] = Substitution(x.labels)
        return "unify", subs
    labels: list = []
    for idx in a + b:
        for lab in idx.labels:
            if lab not in labels:
                labels.append(lab)
    shape = [space.size[lab] for lab in labels]
    equal = np.ones(shape, bool)
    for x, y in zip(a, b):
        equal = equal & (expand_index(x, labels, space) == expand_index(y, labels, space))
    if not equal.any():
        return "never", None
    return "mask", Operand(equal.astype(float), tuple(labels))


def describe_atom(atom: VarAtom) -> str:
    """``log('tau')``, ``'tau' ** 2`` or ``exp(2 * 'tau')``, for a reason."""
    if atom.kind == "x":
        return f"{atom.var!r} ** {atom.power}"
    if atom.kind == "exp" and atom.power != 1:
        return f"exp({atom.power} * {atom.var!r})"
    return f"{atom.kind}({atom.var!r})"


def linear_atoms(var: str, atoms: Sequence[VarAtom], family: str) -> list[VarAtom]:
    """A Gaussian variable's atoms as one or two degree-one factors (else NonConjugate)."""
    linear = []
    for atom in atoms:
        if atom.kind != "x" or atom.power not in (1, 2):
            raise NonConjugate(var, f"{describe_atom(atom)} is not a sufficient statistic of its {family} q")
        linear += [atom] * int(atom.power)
    if len(linear) > 2:
        raise NonConjugate(var, f"a polynomial of degree {len(linear)} in {var!r} (Gaussian q: at most 2)")
    return linear


def gaussian_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """A Gaussian: ``x`` alone, or a product of two reads (``E[x_i x_j]`` within a block)."""
    nb = info.num_batch
    linear = linear_atoms(var, atoms, "Gaussian")
    if len(linear) == 1:
        return [(1.0, None, (StatRead(var, "x", linear[0].index),))]
    a, b = linear
    status, extra = coincide(a.index[:nb], b.index[:nb], space, protected)
    pair = StatRead(var, "xx", a.index + b.index[nb:])
    if status == "same":
        return [(1.0, None, (pair,))]
    apart = (StatRead(var, "x", a.index), StatRead(var, "x", b.index))
    if status == "never":
        return [(1.0, None, apart)]
    # Where the batch positions coincide, E[x x^T] replaces the product of means.
    together = (StatRead(var, "x", a.index), StatRead(var, "x", a.index[:nb] + b.index[nb:]))
    return [(1.0, None, apart), (1.0, extra, (pair,)), (-1.0, extra, together)]


def point_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """A point mass: E[f(x)] = f(x) for every f, so reads never interact."""
    return [(1.0, None, tuple(StatRead(var, point_statistic_name(a), a.index) for a in atoms))]


def _statistic_reads(var: str, atoms: Sequence[VarAtom], info: VarInfo) -> list[StatRead]:
    reads = []
    for atom in atoms:
        stat = statistic_name(info.kind, atom.kind, atom.power)
        if stat is None:
            raise NonConjugate(var, f"{describe_atom(atom)} is not a sufficient statistic of its {info.kind} q")
        reads.append(StatRead(var, stat, atom.index))
    return reads


def _apart(var: str, reads: list[StatRead], info: VarInfo, space: Labels) -> list[Alternative]:
    """Several reads that must never meet at one position of ``var``."""
    nb = info.num_batch
    for i, a in enumerate(reads):
        for b in reads[i + 1 :]:
            status, _ = coincide(a.index[:nb], b.index[:nb], space)
            if status != "never":
                raise NonConjugate(
                    var,
                    f"a product of two statistics of {var!r} at one position is not a sufficient "
                    f"statistic of its {info.kind} q",
                )
    return [(1.0, None, tuple(reads))]


def independent_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """A q with one statistic per function (Gamma, Beta, ...): reads at distinct positions."""
    reads = _statistic_reads(var, atoms, info)
    if len(reads) == 1:
        return [(1.0, None, tuple(reads))]
    return _apart(var, reads, info, space)


def categorical_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """A Categorical: at one position ``one_hot_j one_hot_k = delta_jk one_hot_k``."""
    reads = _statistic_reads(var, atoms, info)
    if len(reads) == 1:
        return [(1.0, None, tuple(reads))]
    if len(reads) == 2:
        a, b = reads
        value_axes = len(info.shape)
        status, _ = coincide(a.index[:value_axes], b.index[:value_axes], space, protected)
        if status == "same":
            cat_status, cat_extra = coincide(a.index[value_axes:], b.index[value_axes:], space, protected)
            if cat_status == "same":
                return [(1.0, None, (a,))]
            if cat_status == "never":
                return []
            return [(1.0, cat_extra, (a,))]
        if status == "never":
            return [(1.0, None, (a, b))]
    return _apart(var, reads, info, space)
