"""Pairing the reads of a chain (time on axis 0) within a term.

A chain's q is not mean-field over time: it keeps the marginals at each time
step and the joint moments of neighbouring steps, per sequence (the chain's
leading batch axes are independent sequences). Two reads of one sequence in
one term are therefore resolved by their time lag: the same step (a marginal
moment), one step apart (a lag-one moment), or two or more steps apart
(refused: q keeps no statistic for them). See
:mod:`blrppl.symbolic.pairing` for what a pairing returns.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.compiled import StatRead
from blrppl.symbolic.pairing import (
    Alternative,
    clip_index,
    coincide,
    describe_atom,
    expand_index,
    expand_operand,
    linear_atoms,
)
from blrppl.symbolic.statistics import VarInfo
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Operand, VarAtom, substitute_atom


def time_lags(a: Index, b: Index, space: Labels, operands: Sequence[Operand] = ()):
    """``t_b - t_a`` over the labels of two time indices, and where the term's operands do not vanish.

    Positions where a constant operand of the term is zero (e.g. the masks of
    a concatenation) do not count.

    Returns:
      ``(diff, support, labels)``: the lags and the support as arrays over
      ``labels``.
    """
    labels: list = []
    for idx in (a, b):
        for lab in idx.labels:
            if lab not in labels:
                labels.append(lab)
    ta, tb = expand_index(a, labels, space), expand_index(b, labels, space)
    diff = np.broadcast_to(tb - ta, np.broadcast_shapes(ta.shape, tb.shape))
    support = np.ones(diff.shape, bool)
    for op in operands:
        if op.labels and set(op.labels) <= set(labels):
            support = support & (expand_operand(op, labels) != 0)
    return diff, support, labels


def _by_sequence(var, a, b, info: VarInfo, space: Labels, protected, operands, joint, apart):
    """Split a product of two reads by whether they read the same sequence.

    A chain q is independent across sequences (its batch axes, the first
    ``info.num_batch`` axes): reads of different sequences are a product of
    means (``apart``); reads of one sequence pair up within it (``joint(a,
    b, operands)``: alternatives over the time lag). Mirrors
    :func:`~blrppl.symbolic.pairing.gaussian_reads` on the batch axes.
    """
    nb = info.num_batch
    status, extra = coincide(a.index[:nb], b.index[:nb], space, protected)
    if status == "mask":
        status = _on_support(extra, operands)
    if status == "same":
        return joint(a, b, operands)
    if status == "never":
        return [(1.0, None, apart(a, b))]
    if status == "unify":
        b = substitute_atom(b, extra)
        inner = joint(a, b, operands)
    else:
        inner = joint(a, b, tuple(operands) + (extra,))
    same = [(sign, _combine(extra, more), reads) for sign, more, reads in inner]
    together = apart(a, dataclasses.replace(b, index=a.index[:nb] + b.index[nb:]))
    return [(1.0, None, apart(a, b))] + same + [(-1.0, extra, together)]


def _on_support(equal: Operand, operands) -> str:
    """``"same"``, ``"never"`` or ``"mask"``: where two positions coincide, counting only
    positions where the term's constant operands can be non-zero.

    A constant initial carry reads a made-up position at step 0 (where a
    ``where`` or a mask zeroes the term): it must not split the sequences.
    """
    labels = list(equal.labels)
    support = np.ones(np.shape(equal.array), bool)
    for op in operands:
        shared = [lab for lab in op.labels if lab in labels]
        if not shared:
            continue
        array = np.asarray(op.array) != 0
        other = tuple(i for i, lab in enumerate(op.labels) if lab not in labels)
        if other:
            array = np.any(array, axis=other)
        support = support & (expand_operand(Operand(array, tuple(shared)), labels) != 0)
    together = np.asarray(equal.array) != 0
    if np.all(together | ~support):
        return "same"
    if not np.any(together & support):
        return "never"
    return "mask"


def _combine(first, second):
    """Two extras of a pairing (a unification or a mask, or None), applied in order."""
    if first is None:
        return second
    if second is None:
        return first
    return (first, second)


def chain_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """Reads of a chain Gaussian (sequences, then time, then state): E[x_t x_s] by |t - s|.

    Statistics: ``x`` (B, T, *s), ``xx`` = E[x_t x_tᵀ] (B, T, *s, *s) and
    ``x_next`` = E[x_t x_{t+1}ᵀ] (B, T-1, *s, *s) for sequences B. Under a
    chain Gaussian, positions two or more steps apart are still correlated
    and q keeps no statistic for them, so such products are refused as
    non-conjugate; different sequences are independent.
    """
    linear = linear_atoms(var, atoms, "chain Gaussian")
    if len(linear) == 1:
        return [(1.0, None, (StatRead(var, "x", linear[0].index),))]
    nb = info.num_batch
    length = info.shape[nb]

    def apart(a, b):
        return (StatRead(var, "x", a.index), StatRead(var, "x", b.index))

    def joint(a, b, operands):
        if a.index[nb].same_as(b.index[nb]):
            return [(1.0, None, (StatRead(var, "xx", a.index + b.index[nb + 1 :]),))]
        diff, support, labels = time_lags(a.index[nb], b.index[nb], space, operands)
        if np.any((np.abs(diff) >= 2) & support):
            raise NonConjugate(
                var,
                f"a product of {var!r} at times two or more steps apart (its chain Gaussian q keeps "
                "marginal and lag-one moments only)",
            )
        out = []
        for lag, first, second in ((0, a, b), (1, a, b), (-1, b, a)):
            mask = diff == lag
            if not mask.any():
                continue
            operand = Operand(mask.astype(float), tuple(labels))
            if lag == 0:
                read = StatRead(var, "xx", first.index + second.index[nb + 1 :])
            else:
                safe = clip_index(first.index[nb], length - 2, space)
                index = first.index[:nb] + (safe,) + first.index[nb + 1 :] + second.index[nb + 1 :]
                read = StatRead(var, "x_next", index)
            out.append((1.0, operand, (read,)))
        return out

    a, b = linear
    return _by_sequence(var, a, b, info, space, protected, operands, joint, apart)


def chain_categorical_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """Reads of a chain Categorical (sequences, then time, then one category axis).

    Statistics: ``one_hot`` = q(z_t = k) (B, T, K) and ``pair`` = q(z_t = j,
    z_{t+1} = k) (B, T-1, K, K) for sequences B. A product of one-hot reads
    at one time is one read (``one_hot_j one_hot_k = delta_jk one_hot_k``);
    at neighbouring times it is a ``pair`` read (``trans[z_prev]`` in a scan
    body, the z0 -> z_1 link). Reads two or more steps apart are refused: q
    keeps no statistic for them. Different sequences are independent.
    """
    for atom in atoms:
        if atom.kind != "one_hot" or atom.power != 1:
            raise NonConjugate(
                var, f"{describe_atom(atom)} is not a sufficient statistic of its chain Categorical q"
            )
    if any(not np.all(np.isfinite(tape.asarray(op.array, float))) for op in operands):  # guards a bool, not the data
        raise NonConjugate(
            var,
            f"a zero probability (log 0 = -inf) weights the states of {var!r}, and its chain "
            "Categorical q needs finite log potentials; replace exact zeros by a tiny probability "
            "(e.g. 1e-30)",
        )
    if len(atoms) == 1:
        return [(1.0, None, (StatRead(var, "one_hot", atoms[0].index),))]
    if len(atoms) > 2:
        raise NonConjugate(
            var,
            f"a product of {len(atoms)} one-hot reads of {var!r} (its chain Categorical q keeps "
            "marginal and neighbouring-pair statistics only)",
        )
    nb = info.num_batch
    length = info.shape[nb]

    def apart(a, b):
        return (StatRead(var, "one_hot", a.index), StatRead(var, "one_hot", b.index))

    def joint(a, b, operands):
        if a.index[nb].same_as(b.index[nb]):
            status, extra = coincide(a.index[nb + 1 :], b.index[nb + 1 :], space, protected)
            read = (StatRead(var, "one_hot", a.index),)
            if status == "same":
                return [(1.0, None, read)]
            if status == "never":
                return []
            return [(1.0, extra, read)]
        diff, support, labels = time_lags(a.index[nb], b.index[nb], space, operands)
        if np.any((np.abs(diff) >= 2) & support):
            raise NonConjugate(
                var,
                f"a product of {var!r} at times two or more steps apart (its chain Categorical q keeps "
                "marginal and neighbouring-pair statistics only)",
            )
        out = []
        if np.any((diff == 0) & support):
            # Same time at some positions only (a constant initial carry): there
            # one_hot_j one_hot_k = delta_jk one_hot_k, a mask over time and categories.
            status, equal = coincide(a.index, b.index, space)
            if status not in ("never", "mask"):
                raise NonConjugate(var, f"a product of {var!r} at times that coincide at some positions only")
            if status == "mask":
                mask = expand_operand(equal, list(equal.labels)) * expand_index(
                    Index(tuple(labels), np.asarray(support, int)), list(equal.labels), space
                )
                if mask.any():
                    out.append((1.0, Operand(mask.astype(float), equal.labels), (StatRead(var, "one_hot", a.index),)))
        for lag, first, second in ((1, a, b), (-1, b, a)):
            mask = (diff == lag) & support
            if not mask.any():
                continue
            # The mask keeps every time label of both reads in the term (the pair read
            # names only the earlier time's).
            operand = Operand(mask.astype(float), tuple(labels))
            time = clip_index(first.index[nb], length - 2, space)
            index = first.index[:nb] + (time, first.index[nb + 1], second.index[nb + 1])
            out.append((1.0, operand, (StatRead(var, "pair", index),)))
        return out

    a, b = atoms
    return _by_sequence(var, a, b, info, space, protected, operands, joint, apart)
