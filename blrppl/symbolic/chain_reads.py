"""Pairing the reads of a chain (time on axis 0) within a term.

A chain's q is not mean-field over time: it keeps the marginals at each time
step and the joint moments of neighbouring steps. Two reads of a chain in one
term are therefore resolved by their time lag: the same step (a marginal
moment), one step apart (a lag-one moment), or two or more steps apart
(refused: q keeps no statistic for them). See
:mod:`blrppl.symbolic.pairing` for what a pairing returns.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

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
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Operand, VarAtom


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


def chain_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """Reads of a chain Gaussian (time on axis 0): E[x_t x_s] by |t - s|.

    Statistics: ``x`` (T, *s), ``xx`` = E[x_t x_tᵀ] (T, *s, *s) and ``x_next``
    = E[x_t x_{t+1}ᵀ] (T-1, *s, *s). Under a chain Gaussian, positions two or
    more steps apart are still correlated and q keeps no statistic for them,
    so such products are refused as non-conjugate.
    """
    linear = linear_atoms(var, atoms, "chain Gaussian")
    if len(linear) == 1:
        return [(1.0, None, (StatRead(var, "x", linear[0].index),))]
    a, b = linear
    if a.index[0].same_as(b.index[0]):
        return [(1.0, None, (StatRead(var, "xx", a.index + b.index[1:]),))]
    diff, support, labels = time_lags(a.index[0], b.index[0], space, operands)
    length = info.shape[0]
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
            read = StatRead(var, "xx", first.index + second.index[1:])
        else:
            safe = clip_index(first.index[0], length - 2, space)
            read = StatRead(var, "x_next", (safe,) + first.index[1:] + second.index[1:])
        out.append((1.0, operand, (read,)))
    return out


def chain_categorical_reads(
    var: str, atoms: Sequence[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """Reads of a chain Categorical (time on axis 0, one category axis after it).

    Statistics: ``one_hot`` = q(z_t = k) (T, K) and ``pair`` = q(z_t = j,
    z_{t+1} = k) (T-1, K, K). A product of one-hot reads at one time is one
    read (``one_hot_j one_hot_k = delta_jk one_hot_k``); at neighbouring times
    it is a ``pair`` read (``trans[z_prev]`` in a scan body, the z0 -> z_1
    link). Reads two or more steps apart are refused: q keeps no statistic
    for them.
    """
    for atom in atoms:
        if atom.kind != "one_hot" or atom.power != 1:
            raise NonConjugate(
                var, f"{describe_atom(atom)} is not a sufficient statistic of its chain Categorical q"
            )
    if any(not np.all(np.isfinite(np.asarray(op.array, float))) for op in operands):
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
    a, b = atoms
    if a.index[0].same_as(b.index[0]):
        status, extra = coincide(a.index[1:], b.index[1:], space, protected)
        read = (StatRead(var, "one_hot", a.index),)
        if status == "same":
            return [(1.0, None, read)]
        if status == "never":
            return []
        return [(1.0, extra, read)]
    diff, support, labels = time_lags(a.index[0], b.index[0], space, operands)
    if np.any((np.abs(diff) >= 2) & support):
        raise NonConjugate(
            var,
            f"a product of {var!r} at times two or more steps apart (its chain Categorical q keeps "
            "marginal and neighbouring-pair statistics only)",
        )
    length = info.shape[0]
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
        time = clip_index(first.index[0], length - 2, space)
        read = StatRead(var, "pair", (time, first.index[1], second.index[1]))
        out.append((1.0, operand, (read,)))
    return out
