"""Polynomials in the values of latent variables, as sums of einsum terms.

A symbolic array ``P`` of shape ``S`` stands for a function of the latent
values. Each axis of ``P`` carries a *label*; each term of ``P`` is an einsum
over its operands, summing every label that is not an output label:

    P[l_1, ..., l_r] = sum_terms coeff * sum_{internal labels} prod(operands)

Operands are constant arrays (data, already folded) or :class:`VarAtom`
references to one latent variable: an elementwise function of the variable's
value (``x ** p``, ``log x``, ``log(1 - x)``, ``log det x``, ``one_hot(z)``)
read at positions given by one :class:`Index` per value axis. An index either
*is* a label (the axis is read in step with that label) or a constant integer
array over some labels (a gather, ``alpha[county_idx]``).

A categorical latent used as an index (``mu[z]``) is enumerated, as NumPyro's
enumeration does: the result gets a new label ``k`` over the categories and a
*selector* ``one_hot(z)[..., k]`` that is common to all its terms, so that an
elementwise function of the selected value acts per category (``log(sigma[z])
= sum_k one_hot(z)_k log(sigma_k)``).

Labels are plain integers from one :class:`Labels` space per analysis, which
also records each label's size.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from fractions import Fraction
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.graph import tape

Label = int


class NonConjugate(Exception):
    """The expression is not affine in a variable's sufficient statistics."""

    def __init__(self, var: Optional[str], reason: str):
        super().__init__(reason)
        self.var = var
        self.reason = reason


class Labels:
    """A supply of fresh labels with their sizes."""

    def __init__(self) -> None:
        self._count = itertools.count()
        self.size: dict[Label, int] = {}

    def new(self, size: int) -> Label:
        label = next(self._count)
        self.size[label] = int(size)
        return label

    def fresh_like(self, label: Label) -> Label:
        return self.new(self.size[label])


@dataclasses.dataclass(frozen=True)
class Index:
    """How one axis of a variable's value is read.

    ``array is None``: the axis is read in step with the single label
    ``labels[0]``. Otherwise ``array`` is a constant integer array with one
    dimension per label in ``labels`` (possibly none: a fixed position).
    ``leaf``: in a finished analysis, the array is data of the compiled fit (a
    leaf of its pytree, :mod:`blrppl.symbolic.compiled`), not part of its structure.
    """

    labels: tuple[Label, ...]
    array: Optional[np.ndarray] = None
    leaf: bool = False

    @property
    def direct(self) -> bool:
        return self.array is None

    def same_as(self, other: "Index") -> bool:
        if self.labels != other.labels or self.direct != other.direct:
            return False
        return self.direct or np.array_equal(self.array, other.array)


@dataclasses.dataclass(frozen=True)
class VarAtom:
    """An elementwise statistic of one latent variable, read at an index.

    ``kind`` is ``"x"`` (the value raised to ``power``), ``"log"``,
    ``"log1m"`` (log(1 - x)), ``"logdet"`` (log |x| of a matrix variable; its
    index covers the batch axes only), ``"exp"`` (exp(power x): a statistic of
    no family, until a log turns it back into x) or ``"one_hot"`` (one extra
    index, over the categories, follows the value axes). ``sizes`` are the sizes of the
    axes the indices address (an index array equal to ``arange(size)`` is the
    same as a direct index; a shorter one is a slice and stays a gather).
    """

    var: str
    kind: str
    index: tuple[Index, ...]
    power: Fraction = Fraction(1)
    sizes: tuple[int, ...] = ()  # the sizes of the axes the indices address

    @property
    def labels(self) -> set[Label]:
        return {lab for idx in self.index for lab in idx.labels}

    def same_position(self, other: "VarAtom") -> bool:
        return (
            self.var == other.var
            and len(self.index) == len(other.index)
            and all(a.same_as(b) for a, b in zip(self.index, other.index))
        )


@dataclasses.dataclass(frozen=True)
class Operand:
    """A constant array with one label per axis.

    A pytree: ``array`` is its leaf, ``labels`` static (so that an analysis
    holding operands can be an argument of a jitted function).
    """

    array: np.ndarray
    labels: tuple[Label, ...]


jax.tree_util.register_dataclass(Operand, data_fields=["array"], meta_fields=["labels"])


@dataclasses.dataclass(frozen=True)
class Term:
    """``coeff * einsum(operands, atoms)``; labels not in the output are summed."""

    coeff: float
    operands: tuple[Operand, ...] = ()
    atoms: tuple[VarAtom, ...] = ()

    @property
    def labels(self) -> set[Label]:
        out = {lab for op in self.operands for lab in op.labels}
        for atom in self.atoms:
            out |= atom.labels
        return out


@dataclasses.dataclass(frozen=True)
class Poly:
    """A symbolic array: ``sum(terms)`` times the product of ``selectors``.

    ``labels`` are the output labels, one per axis of ``shape``. Selectors are
    ``one_hot`` atoms of enumerated categorical variables whose category label
    is free in every term (see the module docstring).
    """

    shape: tuple[int, ...]
    labels: tuple[Label, ...]
    terms: tuple[Term, ...]
    selectors: tuple[VarAtom, ...] = ()

    @property
    def variables(self) -> set[str]:
        out = {a.var for t in self.terms for a in t.atoms}
        return out | {s.var for s in self.selectors}

    @property
    def is_constant(self) -> bool:
        return not self.variables


# ---------------------------------------------------------------------------
# Label substitution.


@dataclasses.dataclass(frozen=True)
class Substitution:
    """Replace a label by a gather: position = ``array`` over ``labels``.

    ``array`` None means a plain rename to the single label ``labels[0]``.
    """

    labels: tuple[Label, ...]
    array: Optional[np.ndarray] = None


def _dedupe_axes(array: np.ndarray, labels: list[Label]) -> tuple[np.ndarray, list[Label]]:
    """Take diagonals over repeated labels so each label appears once."""
    while len(set(labels)) < len(labels):
        seen: dict[Label, int] = {}
        for pos, lab in enumerate(labels):
            if lab in seen:
                first = seen[lab]
                array = np.diagonal(array, axis1=first, axis2=pos)
                labels = [x for i, x in enumerate(labels) if i not in (first, pos)]
                labels.append(lab)
                break
            seen[lab] = pos
    return array, labels


def _gather_axis(
    array: np.ndarray, labels: list[Label], label: Label, sub: Substitution
) -> tuple[np.ndarray, list[Label]]:
    axis = labels.index(label)
    if sub.array is None:
        new_labels = list(labels)
        new_labels[axis] = sub.labels[0]
        return array, new_labels
    # Axes that already carry one of the index's labels are read along the index's own
    # coordinates (their diagonal), not crossed with it: a masked step of an HMM over
    # (T, N) gathered a (T, N, T, N, D) operand into a (T, N, D, T, N, T, N) array (2 GB at
    # T = 24, N = 16) before the diagonal was taken.
    shared = [i for i, lab in enumerate(labels) if i != axis and lab in sub.labels]
    grid = sub.array.shape
    index = [sub.array]
    for i in shared:
        position = sub.labels.index(labels[i])
        size = array.shape[i]
        if size not in (1, grid[position]):
            shared = []  # sizes that do not match (a broadcast index): cross, then take the diagonal
            index = [sub.array]
            break
        coords = np.arange(grid[position]) if size > 1 else np.zeros(grid[position], int)
        index.append(coords.reshape([-1 if d == position else 1 for d in range(len(grid))]))
    moved = np.moveaxis(array, [axis] + shared, list(range(1 + len(shared))))
    # shape sub.array.shape + rest; index data (a Dual) on the tape, replayed as a jax gather
    taken = tape.lift(operator.getitem, lambda a, i: jnp.asarray(a)[i], (moved, tuple(index)))
    rest = [lab for i, lab in enumerate(labels) if i != axis and i not in shared]
    return taken, list(sub.labels) + rest


def substitute_array(
    array: np.ndarray, labels: Sequence[Label], subs: dict[Label, Substitution]
) -> tuple[np.ndarray, tuple[Label, ...]]:
    """Apply label substitutions to a labelled constant array, simultaneously.

    Renames and gathers are applied as one substitution (``{a: b, b: a}``
    swaps two labels); a label that then appears twice reads the diagonal.
    """
    array = tape.asarray(array)
    # Stand-in labels keep the original axes apart while gathers reshape them.
    stand_in = [("axis", i) for i in range(len(labels))]
    current = list(stand_in)
    final: dict = {}
    for i, label in enumerate(labels):
        sub = subs.get(label)
        if sub is None:
            final[stand_in[i]] = label
        elif sub.array is None:
            final[stand_in[i]] = sub.labels[0]
        else:
            array, current = _gather_axis(array, current, stand_in[i], sub)
    new_labels = [final.get(lab, lab) for lab in current]
    array, new_labels = _dedupe_axes(array, new_labels)
    return array, tuple(new_labels)


def _substitute_index(index: Index, subs: dict[Label, Substitution], size: Optional[int]) -> Index:
    if not any(lab in subs for lab in index.labels):
        return index
    if index.direct:
        sub = subs[index.labels[0]]
        if sub.array is None:
            return Index(sub.labels, None)
        return simplify_index(Index(sub.labels, sub.array), size)
    array, labels = substitute_array(index.array, index.labels, subs)
    return simplify_index(Index(labels, array), size)


def simplify_index(index: Index, size: Optional[int] = None) -> Index:
    """Drop labels an index array is constant along; turn aranges into renames.

    ``size`` is the size of the axis the index reads; an ``arange`` of that
    size over one label is a direct index. Without ``size`` (unknown) the
    array is kept.
    """
    if index.direct:
        return index
    keep, array, arange = _simplified(index.array, size)
    labels = [index.labels[a] for a in keep]
    if arange:
        return Index((labels[0],), None)
    return Index(tuple(labels), tape.asarray(array))


def _simplified(array: np.ndarray, size: Optional[int]) -> tuple:
    """``(axes the array varies along, the array along them only, whether that is arange(size))``:
    decided once per recorded value (index data on the tape are simplified many times)."""

    def decide() -> tuple:
        keep = tuple(
            axis
            for axis in range(array.ndim)
            if array.shape[axis] > 1 and not np.all(array == np.take(array, [0], axis=axis))
        )
        reduced = array[tuple(slice(None) if a in keep else 0 for a in range(array.ndim))]
        arange = (
            size is not None and len(keep) == 1 and reduced.shape[0] == size and bool(np.array_equal(reduced, np.arange(size)))
        )
        return keep, reduced, arange

    return tape.memo(array, ("simplified", size), decide) if tape.is_dual(array) else decide()


def substitute_atom(atom: VarAtom, subs: dict[Label, Substitution]) -> VarAtom:
    sizes = atom.sizes if len(atom.sizes) == len(atom.index) else (None,) * len(atom.index)
    index = tuple(_substitute_index(idx, subs, n) for idx, n in zip(atom.index, sizes))
    return dataclasses.replace(atom, index=index)


def substitute_term(term: Term, subs: dict[Label, Substitution]) -> Term:
    operands = []
    for op in term.operands:
        array, labels = substitute_array(op.array, op.labels, subs)
        operands.append(Operand(array, labels))
    atoms = tuple(substitute_atom(a, subs) for a in term.atoms)
    return Term(term.coeff, tuple(operands), atoms)


def rename_internal(term: Term, keep: set[Label], space: Labels) -> Term:
    """Give the term's summed labels fresh names (before combining two terms)."""
    internal = term.labels - keep
    if not internal:
        return term
    subs = {lab: Substitution((space.fresh_like(lab),)) for lab in internal}
    return substitute_term(term, subs)


def unravel(flat: np.ndarray, shape: Sequence[int]) -> tuple[np.ndarray, ...]:
    """``np.unravel_index`` by table lookup or integer arithmetic (numpy 2.4's version returns
    wrong coordinates for some strided inputs, e.g. shape (N, 1) views): int64 coordinates of
    any positions (out of range ones as floor division and remainder give them).

    Planning a mixture on 100,000 points unravels millions of positions into a few
    components: where ``shape`` is small and the positions lie in it, each coordinate is
    one lookup in a table of ``shape``'s coordinates; else positions that fit in int32 are
    divided in int32 (3-5x faster than numpy's int64 division), others in int64.
    """
    shape = tuple(int(size) for size in shape)
    if not shape:
        return ()
    if tape.is_dual(flat):  # index data: the coordinates on the tape (one node per axis)
        return tuple(
            tape.lift(lambda f, axis=axis: unravel(f, shape)[axis], lambda f, axis=axis: _unravel_jnp(f, shape)[axis], (flat,))
            for axis in range(len(shape))
        )
    flat = np.asarray(flat)
    total = math.prod(shape)
    low, high = (int(flat.min()), int(flat.max())) if flat.size else (0, -1)
    if total <= UNRAVEL_TABLE_SIZE and flat.dtype.kind in "iu" and 0 <= low and high < total:
        table = np.indices(shape).reshape(len(shape), -1)
        return tuple(np.take(row, flat) for row in table)
    narrow = -(2**31) <= low and high < 2**31
    rest = np.array(flat, dtype=np.int32 if narrow else np.int64, copy=True)
    coords = []
    for size in reversed(shape):
        quotient = rest // rest.dtype.type(size)
        coords.append((rest - quotient * rest.dtype.type(size)).astype(np.int64, copy=False))
        rest = quotient
    return tuple(reversed(coords))


def _unravel_jnp(flat: jax.Array, shape: tuple) -> tuple:
    """:func:`unravel` in ``jax.numpy`` (floor division and remainder, int64 where enabled)."""
    import jax.numpy as jnp  # noqa: PLC0415 - the replay's twin only

    rest = jnp.asarray(flat)
    coords = []
    for size in reversed(shape):
        coords.append(rest % size)
        rest = rest // size
    return tuple(reversed(coords))


UNRAVEL_TABLE_SIZE = 1 << 16
"""The largest ``shape`` (elements) :func:`unravel` reads coordinates from a table of."""


def fill_missing(ids: np.ndarray) -> np.ndarray:
    """Non-negative integers with each negative entry replaced by a nearby entry's value.

    The nearest non-negative entry along one axis (ties: the earlier axis,
    then the earlier position), else the next one in C order (else the
    previous). Masked positions of an index (a structural zero, a constant
    component) thus read a neighbour of the same sequence and time, so that
    reads of a chain stay within one sequence and close in time. Linear time.
    """
    ids = np.asarray(ids)
    flat = ids.reshape(-1).copy()
    known = np.flatnonzero(flat >= 0)
    if known.size == 0 or known.size == flat.size:
        return ids
    missing = flat < 0
    after = np.searchsorted(known, np.flatnonzero(missing))
    fill = np.full(ids.shape, -1, np.int64)
    fill.reshape(-1)[missing] = flat[known[np.minimum(after, known.size - 1)]]
    best = np.full(ids.shape, np.inf)
    for axis, size in enumerate(ids.shape):
        line = np.moveaxis(ids, axis, -1)
        pos = np.broadcast_to(np.arange(size), line.shape)
        have = line >= 0
        before = np.maximum.accumulate(np.where(have, pos, -1), axis=-1)
        later = np.flip(np.minimum.accumulate(np.flip(np.where(have, pos, size), -1), axis=-1), -1)
        for source, ok in ((before, before >= 0), (later, later < size)):
            distance = np.where(ok, np.abs(pos - source), np.inf)
            value = np.take_along_axis(line, np.clip(source, 0, size - 1), axis=-1)
            distance = np.moveaxis(distance, -1, axis)
            value = np.moveaxis(value, -1, axis)
            take = distance < best
            fill = np.where(take, value, fill)
            best = np.where(take, distance, best)
    return np.where(ids >= 0, ids, fill)


def ravel(coords: Sequence[np.ndarray], shape: Sequence[int]) -> np.ndarray:
    """``np.ravel_multi_index`` by integer arithmetic (see :func:`unravel`)."""
    flat = np.zeros(np.broadcast_shapes(*[np.shape(c) for c in coords]), np.int64)
    for coord, size in zip(coords, shape):
        flat = flat * int(size) + np.asarray(coord, np.int64)
    return flat


def constant(value: np.ndarray, space: Labels) -> Poly:
    """A constant array as a Poly (one term with one operand)."""
    value = tape.asarray(value)
    labels = tuple(space.new(n) for n in value.shape)
    if value.ndim == 0:
        return Poly((), (), (Term(tape.scalar(value)),))
    return Poly(value.shape, labels, (Term(1.0, (Operand(value, labels),)),))


def variable(name: str, shape: tuple[int, ...], space: Labels) -> Poly:
    """The value of a latent variable as a Poly: one ``x`` atom, direct indices."""
    labels = tuple(space.new(n) for n in shape)
    atom = VarAtom(name, "x", tuple(Index((lab,)) for lab in labels), sizes=tuple(shape))
    return Poly(tuple(shape), labels, (Term(1.0, (), (atom,)),))


def relabel(poly: Poly, labels: Sequence[Label]) -> Poly:
    """Rename a Poly's output labels to ``labels`` (same sizes)."""
    subs = {old: Substitution((new,)) for old, new in zip(poly.labels, labels) if old != new}
    if not subs:
        return poly
    terms = tuple(substitute_term(t, subs) for t in poly.terms)
    selectors = tuple(substitute_atom(s, subs) for s in poly.selectors)
    return Poly(poly.shape, tuple(labels), terms, selectors)
