"""Arithmetic on symbolic arrays (:class:`~blrppl.symbolic.terms.Poly`).

Every operation keeps the result a sum of einsum terms over constant operands
and variable atoms, or raises :class:`NonConjugate` naming the variable and
saying why (``exp`` of a random value, the log of a sum, a power that does
not land on a sufficient statistic is caught later, when expectations are
taken).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.terms import (
    Index,
    Labels,
    NonConjugate,
    Operand,
    Poly,
    Substitution,
    Term,
    VarAtom,
    constant,
    fill_missing,
    relabel,
    rename_internal,
    simplify_index,
    substitute_atom,
    substitute_term,
    unravel,
)


def _describe(poly: Poly) -> str:
    names = sorted(poly.variables)
    return ", ".join(repr(n) for n in names)


def _first_var(poly: Poly):
    names = sorted(poly.variables)
    return names[0] if names else None


def free_labels(poly: Poly) -> set:
    """Output labels plus the category labels of the selectors."""
    out = set(poly.labels)
    for sel in poly.selectors:
        out |= {sel.index[-1].labels[0]}
    return out


# ---------------------------------------------------------------------------
# Normalisation of terms.


def compress_operand(op: Operand) -> tuple[Operand | None, float]:
    """Drop axes an operand is constant along; fold scalars into a coefficient."""
    array, labels = tape.asarray(op.array), list(op.labels)
    if tape.is_dual(array):  # one recorded decision (a guard) for all axes, once per value
        keep = tape.memo(array, "varying_axes", lambda: [int(a) for a in np.flatnonzero(tape.lift(
            lambda x: varying_axes(x, np), lambda x: varying_axes(x, jnp), (array,)).read())])
    else:
        keep = [a for a in range(array.ndim) if varying_axes(array, np)[a]]
    if len(keep) < array.ndim:
        array = array[tuple(slice(None) if a in keep else 0 for a in range(array.ndim))]
    labels = [labels[a] for a in keep]
    if array.ndim == 0:
        return None, tape.scalar(array)
    return Operand(array, tuple(labels)), 1.0


def varying_axes(array, xp) -> list:
    """Per axis, whether ``array`` varies along it (``xp``: numpy or jax.numpy)."""
    flags = [
        xp.logical_not(xp.all(array == xp.take(array, xp.asarray([0]), axis=axis))) if array.shape[axis] > 1 else False
        for axis in range(array.ndim)
    ]
    return xp.asarray(flags, dtype=bool)


_POWERED = ("x", "exp")
"""Atoms whose powers add up at one position: x^a x^b = x^(a+b), exp(a x) exp(b x) = exp((a+b) x)."""


def normalize_term(term: Term) -> Term:
    """Compress operands and merge powers of the same atom at the same position."""
    coeff = term.coeff
    operands = []
    for op in term.operands:
        new, scalar = compress_operand(op)
        coeff *= scalar
        if new is not None:
            operands.append(new)
    atoms: list[VarAtom] = []
    for atom in term.atoms:
        for i, other in enumerate(atoms):
            if other.kind == atom.kind and atom.kind in _POWERED and other.same_position(atom):
                atoms[i] = dataclasses.replace(other, power=other.power + atom.power)
                break
        else:
            atoms.append(atom)
    atoms = [a for a in atoms if not (a.kind in _POWERED and a.power == 0)]
    return Term(coeff, tuple(operands), tuple(atoms))


def _atom_key(atom: VarAtom):
    index = tuple(
        (idx.labels, None if idx.direct else (idx.array.shape, idx.array.tobytes())) for idx in atom.index
    )
    return (atom.var, atom.kind, atom.power, index)


def _clean(terms) -> tuple[Term, ...]:
    """Normalise terms, merge like terms without operands, drop zeros.

    Merging makes ``1 + (-1 + p)`` the monomial ``p`` again (so that
    ``log1p(-(1 - p))`` is ``log p``).
    """
    out: list[Term] = []
    like: dict = {}
    for term in terms:
        term = normalize_term(term)
        if not term.operands:
            key = tuple(sorted((_atom_key(a) for a in term.atoms), key=repr))
            if key in like:
                i = like[key]
                out[i] = Term(out[i].coeff + term.coeff, (), out[i].atoms)
                continue
            like[key] = len(out)
        out.append(term)
    return tuple(t for t in out if t.coeff != 0.0)


# ---------------------------------------------------------------------------
# Selectors (enumerated categorical variables).


def _unify_selectors(poly: Poly, other: Poly) -> tuple[Poly, tuple[VarAtom, ...]]:
    """Rename ``poly``'s selector labels to match ``other``'s shared selectors."""
    subs = {}
    kept = []
    for sel in poly.selectors:
        match = None
        for osel in other.selectors:
            if osel.var == sel.var and all(
                a.same_as(b) for a, b in zip(osel.index[:-1], sel.index[:-1])
            ):
                match = osel
        if match is None:
            kept.append(sel)
        else:
            old, new = sel.index[-1].labels[0], match.index[-1].labels[0]
            if old != new:
                subs[old] = Substitution((new,))
    if subs:
        terms = tuple(substitute_term(t, subs) for t in poly.terms)
        poly = Poly(poly.shape, poly.labels, terms, ())
    return poly, tuple(kept)


def push_selectors(poly: Poly, labels: set | None = None) -> Poly:
    """Move selectors that read any of ``labels`` (all if None) into the terms."""
    push = [
        s
        for s in poly.selectors
        if labels is None or any(lab in labels for idx in s.index[:-1] for lab in idx.labels)
    ]
    if not push:
        return poly
    keep = tuple(s for s in poly.selectors if not any(s is p for p in push))
    terms = tuple(Term(t.coeff, t.operands, t.atoms + tuple(push)) for t in poly.terms)
    return Poly(poly.shape, poly.labels, terms, keep)


# ---------------------------------------------------------------------------
# Elementwise binary operations.


def broadcast_to(poly: Poly, shape: tuple[int, ...], space: Labels) -> Poly:
    """Broadcast ``poly`` to ``shape`` (numpy rules)."""
    shape = tuple(shape)
    if poly.shape == shape:
        return poly
    if poly.shape == ():
        labels = tuple(space.new(n) for n in shape)
        return Poly(shape, labels, poly.terms, poly.selectors)
    iota = np.arange(int(np.prod(poly.shape))).reshape(poly.shape)
    return reindex(poly, np.broadcast_to(iota, shape), space)


def align(poly: Poly, other: Poly, space: Labels) -> tuple[Poly, Poly]:
    """Bring two Polys to one shape and one set of output and selector labels."""
    shape = np.broadcast_shapes(poly.shape, other.shape)
    poly = broadcast_to(poly, shape, space)
    other = broadcast_to(other, shape, space)
    other = relabel(other, poly.labels)
    other_unified, other_only = _unify_selectors(other, poly)
    return poly, Poly(other.shape, other.labels, other_unified.terms, other_only)


def add(poly: Poly, other: Poly, space: Labels) -> Poly:
    poly, other = align(poly, other, space)
    return Poly(
        poly.shape, poly.labels, _clean(poly.terms + other.terms), poly.selectors + other.selectors
    )


def scale(poly: Poly, factor: float) -> Poly:
    terms = tuple(Term(t.coeff * factor, t.operands, t.atoms) for t in poly.terms)
    return Poly(poly.shape, poly.labels, _clean(terms), poly.selectors)


def neg(poly: Poly) -> Poly:
    return scale(poly, -1.0)


def sub(poly: Poly, other: Poly, space: Labels) -> Poly:
    return add(poly, neg(other), space)


def _product_terms(a: Sequence[Term], b: Sequence[Term], keep: set, space: Labels):
    out = []
    for ta in a:
        for tb in b:
            tb = rename_internal(tb, keep, space)  # Summed labels stay private.
            out.append(Term(ta.coeff * tb.coeff, ta.operands + tb.operands, ta.atoms + tb.atoms))
    return _clean(out)


def mul(poly: Poly, other: Poly, space: Labels) -> Poly:
    poly, other = align(poly, other, space)
    keep = free_labels(poly) | free_labels(other)
    terms = _product_terms(poly.terms, other.terms, keep, space)
    return Poly(poly.shape, poly.labels, terms, poly.selectors + other.selectors)


# ---------------------------------------------------------------------------
# Elementwise nonlinear operations.


def _monomial(poly: Poly) -> Term | None:
    """The single term of ``poly`` if it reads only free labels, else None."""
    if len(poly.terms) != 1:
        return None
    term = poly.terms[0]
    if term.labels - free_labels(poly):
        return None
    return term


def power(poly: Poly, exponent: float, space: Labels) -> Poly:
    """``poly ** exponent`` for a constant exponent."""
    exponent = Fraction(exponent).limit_denominator(1000)
    if exponent == 1:
        return poly
    if exponent == 0:
        return constant(np.ones(poly.shape), space)
    term = _monomial(poly)
    if term is None:
        if exponent.denominator == 1 and exponent > 0:
            out = poly
            for _ in range(int(exponent) - 1):
                out = mul(out, poly, space)
            return out
        pieces = piecewise(poly, lambda piece: power(piece, float(exponent), space), space, exponent > 0)
        if pieces is not None:
            return pieces
        raise NonConjugate(
            _first_var(poly),
            f"a power {exponent} of a sum involving {_describe(poly)} is not a "
            "polynomial in sufficient statistics",
        )
    if term.coeff < 0 and exponent.denominator != 1:
        raise NonConjugate(_first_var(poly), "a fractional power of a negative quantity")
    operands = tuple(Operand(tape.asarray(op.array, float) ** float(exponent), op.labels) for op in term.operands)
    atoms = []
    for atom in term.atoms:
        if atom.kind in _POWERED:
            atoms.append(dataclasses.replace(atom, power=atom.power * exponent))
        elif exponent.denominator == 1 and exponent > 0 and atom.kind == "one_hot":
            atoms.append(atom)
        else:
            raise NonConjugate(
                atom.var,
                f"{atom.kind}({atom.var!r}) ** {exponent} is not a sufficient statistic",
            )
    new = Term(tape.scalar(term.coeff) ** float(exponent), operands, tuple(atoms))
    return Poly(poly.shape, poly.labels, _clean([new]), poly.selectors)


def _dense_over(op: Operand, labels: Sequence) -> np.ndarray:
    """An operand broadcast over ``labels`` (which hold all of its labels), full shape."""
    array = np.asarray(op.array, float)
    own = list(op.labels)
    array = np.transpose(array, [own.index(lab) for lab in labels if lab in own]) if array.ndim else array
    dims = iter(array.shape)
    return array.reshape([next(dims) if lab in own else 1 for lab in labels])


def piecewise(poly: Poly, fn, space: Labels, zero_ok: bool) -> Poly | None:
    """``fn`` applied elementwise to a Poly whose terms live on disjoint constant supports.

    User code lays parameters out in arrays (``concatenate([sd0, full(T - 1,
    sqrt(v))])``, ``pad``, ``where`` with a constant condition): each position
    of the result is then one piece (a constant, or one monomial), and the
    terms carry 0/1 masks over the output positions. Positions are grouped
    into cells by which terms are non-zero there (read off the terms'
    operands over output labels); on each cell the active terms, with their
    operands restricted to the cell, form one piece, and

        fn(poly) = sum_cells mask_cell * fn(piece_cell).

    Args:
      poly: the argument.
      fn: the elementwise function on one piece (it may raise NonConjugate).
      space: the label space.
      zero_ok: whether ``fn(0) = 0`` (a cell with no active term is then
        dropped); otherwise such a cell is an error.

    Returns:
      The result, or None when the terms do not split into several cells.
    """
    if not poly.shape or len(poly.terms) < 2:
        return None
    labels = list(poly.labels)
    own = set(labels)
    supports = []
    for term in poly.terms:
        support = np.ones(poly.shape, bool)
        for op in term.operands:
            if set(op.labels) <= own:
                support = support & (np.broadcast_to(_dense_over(op, labels), poly.shape) != 0)
        supports.append(support.reshape(-1))
    signature = np.stack(supports, -1)
    cells, inverse = np.unique(signature, axis=0, return_inverse=True)
    if len(cells) < 2:
        return None
    out = None
    for c, active in enumerate(cells):
        cell = (np.reshape(inverse, -1) == c).reshape(poly.shape)
        terms = []
        for term, on in zip(poly.terms, active):
            if not on:
                continue
            operands = []
            for op in term.operands:
                if set(op.labels) <= own:
                    dense = np.where(cell, np.broadcast_to(_dense_over(op, labels), poly.shape), 1.0)
                    op = Operand(dense, poly.labels)
                operands.append(op)
            terms.append(Term(term.coeff, tuple(operands), term.atoms))
        if not terms:
            if zero_ok:
                continue
            raise NonConjugate(_first_var(poly), "a function of zero (a structural zero) at some positions")
        piece = fn(Poly(poly.shape, poly.labels, _clean(terms), poly.selectors))
        mask = Poly(poly.shape, poly.labels, (Term(1.0, (Operand(cell.astype(float), poly.labels),)),))
        value = mul(mask, piece, space)
        out = value if out is None else add(out, value, space)
    return out if out is not None else constant(np.zeros(poly.shape), space)


def _log_one_minus(poly: Poly) -> Poly | None:
    """log(c - c x) = log c + log(1 - x) for a single atom x, else None."""
    if len(poly.terms) != 2:
        return None
    const = [t for t in poly.terms if not t.atoms]
    atom_terms = [t for t in poly.terms if t.atoms]
    if len(const) != 1 or len(atom_terms) != 1:
        return None
    c, t = const[0], atom_terms[0]
    if len(t.atoms) != 1 or t.atoms[0].kind != "x" or t.atoms[0].power != 1:
        return None
    if t.labels - free_labels(poly) or c.labels - free_labels(poly):
        return None
    if not np.isclose(c.coeff, -t.coeff) or len(c.operands) != len(t.operands):
        return None
    for a, b in zip(c.operands, t.operands):
        if a.labels != b.labels or not np.array_equal(a.array, b.array):
            return None
    atom = dataclasses.replace(t.atoms[0], kind="log1m")
    log_c = log(Poly(poly.shape, poly.labels, (c,), poly.selectors), None)
    return Poly(
        poly.shape,
        poly.labels,
        _clean(log_c.terms + (Term(1.0, (), (atom,)),)),
        poly.selectors,
    )


def _dense_mask(op: Operand, labels: tuple) -> np.ndarray | None:
    """A 0/1 operand over output labels as a dense array over ``labels``, else None."""
    array = np.asarray(op.array)
    if not set(op.labels) <= set(labels) or not np.all((array == 0) | (array == 1)):
        return None
    own = list(op.labels)
    array = np.transpose(array, [own.index(lab) for lab in labels if lab in own])
    dims = iter(array.shape)
    return array.reshape([next(dims) if lab in own else 1 for lab in labels]).astype(bool)


def _log_piecewise(poly: Poly, space: Labels | None) -> Poly | None:
    """log of an array assembled from pieces at disjoint positions, piece by piece.

    ``jnp.stack([theta, 1 - theta])`` is ``theta`` where a 0/1 mask is one and
    ``1 - theta`` where another is: its log is ``log(theta)`` on the first
    positions and ``log(1 - theta)`` on the second, each a sufficient statistic
    (Stan's ``log_mix`` ported with an enumerated Categorical). None when the
    terms do not split into pieces whose masks partition the positions.
    """
    if not poly.shape or space is None:
        return None
    shape = poly.shape
    groups: dict = {}
    for term in poly.terms:
        mask, rest = np.ones(shape, bool), []
        for op in term.operands:
            dense = _dense_mask(op, poly.labels)
            if dense is None:
                rest.append(op)
            else:
                mask = mask & np.broadcast_to(dense, shape)
        key = mask.tobytes()
        groups.setdefault(key, (mask, []))[1].append(Term(term.coeff, tuple(rest), term.atoms))
    if len(groups) < 2:
        return None
    masks = [mask for mask, _ in groups.values()]
    if not np.all(np.sum(masks, axis=0) == 1):
        return None  # overlapping pieces, or positions where the array is zero
    out = None
    for mask, terms in groups.values():
        piece = log(Poly(shape, poly.labels, _clean(terms), poly.selectors), space)
        operand = Operand(mask.astype(float), poly.labels)
        masked = Poly(shape, poly.labels, tuple(Term(t.coeff, t.operands + (operand,), t.atoms) for t in piece.terms), piece.selectors)
        out = masked if out is None else add(out, masked, space)
    return out


def log(poly: Poly, space: Labels | None) -> Poly:
    """Elementwise log: of a monomial, of ``c (1 - x)``, or piecewise of such pieces."""
    term = _monomial(poly)
    if term is None:
        out = _log_one_minus(poly)
        if out is None and space is not None:
            out = piecewise(poly, lambda piece: log(piece, space), space, False)
        if out is None:
            out = _log_piecewise(poly, space)
        if out is not None:
            return out
        raise NonConjugate(
            _first_var(poly),
            f"the log of a sum involving {_describe(poly)} is not affine in "
            "sufficient statistics",
        )
    if term.coeff <= 0:
        raise NonConjugate(_first_var(poly), "the log of a non-positive quantity")
    terms = [Term(tape.scalar(np.log(term.coeff)))]
    for op in term.operands:
        terms.append(Term(1.0, (Operand(np.log(tape.asarray(op.array, float)), op.labels),)))
    for atom in term.atoms:
        if atom.kind == "x":
            terms.append(Term(float(atom.power), (), (dataclasses.replace(atom, kind="log", power=Fraction(1)),)))
        elif atom.kind == "exp":  # log(exp(c x)) = c x
            terms.append(Term(float(atom.power), (), (dataclasses.replace(atom, kind="x", power=Fraction(1)),)))
        else:
            raise NonConjugate(atom.var, f"log({atom.kind}({atom.var!r})) is not a sufficient statistic")
    return Poly(poly.shape, poly.labels, _clean(terms), poly.selectors)


def exp(poly: Poly) -> Poly | None:
    """exp(c x + b) (x a latent's value, c a number, b known): the atom ``exp`` (power c) times exp(b), else
    None: no q's statistic, but a log turns it back into x (a log-normal prior on the log scale)."""
    random, fixed = [t for t in poly.terms if t.atoms], [t for t in poly.terms if not t.atoms]
    if poly.selectors or len(random) != 1 or random[0].operands or len(random[0].atoms) != 1:
        return None
    (term,), (atom,) = random, random[0].atoms
    known = [t.coeff for t in fixed + random] + [op.array for t in fixed for op in t.operands]
    local = all(t.labels <= set(poly.labels) for t in poly.terms)  # elementwise; data on a tape: exp(b) not replayed
    if (atom.kind, atom.power) != ("x", 1) or not local or any(map(tape.is_dual, known)):
        return None
    offset = np.zeros(poly.shape)
    for t in fixed:
        dense = [np.broadcast_to(_dense_over(op, list(poly.labels)), poly.shape) for op in t.operands]
        offset = offset + float(t.coeff) * np.prod(dense, 0)
    operands = (Operand(np.exp(offset), poly.labels),) if poly.shape else ()
    coeff = 1.0 if poly.shape else float(np.exp(offset))
    new = Term(coeff, operands, (dataclasses.replace(atom, kind="exp", power=Fraction(float(term.coeff))),))
    return Poly(poly.shape, poly.labels, _clean([new]))


def logdet(poly: Poly) -> Poly:
    """log |X| over the last two axes, for a single matrix-variable atom."""
    term = _monomial(poly)
    batch = poly.labels[:-2]
    if term is None or len(term.atoms) != 1 or term.operands or term.coeff <= 0:
        raise NonConjugate(_first_var(poly), "log det of anything but a scaled matrix variable")
    atom = term.atoms[0]
    if atom.kind != "x" or any(not i.direct for i in atom.index[-2:]):
        raise NonConjugate(atom.var, f"log det of a function of {atom.var!r}")
    d = poly.shape[-1]
    new_atom = VarAtom(atom.var, "logdet", atom.index[:-2], sizes=atom.sizes[:-2])
    terms = (Term(d * tape.scalar(np.log(term.coeff))), Term(float(atom.power), (), (new_atom,)))
    return Poly(poly.shape[:-2], batch, _clean(terms), poly.selectors)


# ---------------------------------------------------------------------------
# Reductions, contractions and index remapping.


def reduce_sum(poly: Poly, axes: Sequence[int], space: Labels) -> Poly:
    axes = tuple(a % len(poly.shape) for a in axes)
    summed = {poly.labels[a] for a in axes}
    poly = push_selectors(poly, summed)
    terms = []
    for term in poly.terms:
        factor = 1.0
        for lab in summed - term.labels:
            factor *= space.size[lab]
        terms.append(Term(term.coeff * factor, term.operands, term.atoms))
    shape = tuple(n for i, n in enumerate(poly.shape) if i not in axes)
    labels = tuple(lab for i, lab in enumerate(poly.labels) if i not in axes)
    return _private_sums(Poly(shape, labels, _clean(terms), poly.selectors), space)


def _private_sums(poly: Poly, space: Labels) -> Poly:
    """Give every summed label fresh names, so that no summed label of one
    Poly can collide with an output label another Poly later renames to."""
    keep = free_labels(poly)
    terms = tuple(rename_internal(t, keep, space) for t in poly.terms)
    return Poly(poly.shape, poly.labels, terms, poly.selectors)


def dot_general(poly: Poly, other: Poly, dimension_numbers, space: Labels) -> Poly:
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = map(tuple, (lc, rc, lb, rb))
    # Fresh labels for the right operand, then tie its contracted and batch axes.
    fresh = [space.new(n) for n in other.shape]
    other = relabel(other, fresh)
    tie = {}
    for l_ax, r_ax in list(zip(lc, rc)) + list(zip(lb, rb)):
        tie[other.labels[r_ax]] = poly.labels[l_ax]
    new_labels = tuple(tie.get(lab, lab) for lab in other.labels)
    other = relabel(other, new_labels)
    other_unified, other_only = _unify_selectors(other, poly)
    other = Poly(other.shape, other.labels, other_unified.terms, other_only)
    contracted = {poly.labels[a] for a in lc}
    lhs = push_selectors(poly, contracted)
    rhs = push_selectors(other, contracted)
    keep = free_labels(lhs) | free_labels(rhs)
    terms = _product_terms(lhs.terms, rhs.terms, keep, space)
    out_labels = (
        tuple(poly.labels[a] for a in lb)
        + tuple(lab for i, lab in enumerate(poly.labels) if i not in lc + lb)
        + tuple(lab for i, lab in enumerate(other.labels) if i not in rc + rb)
    )
    shape = tuple(space.size[lab] for lab in out_labels)
    return _private_sums(Poly(shape, out_labels, terms, lhs.selectors + rhs.selectors), space)


def reindex(poly: Poly, positions: np.ndarray, space: Labels) -> Poly:
    """Read ``poly`` at flat positions (``-1``: a structural zero).

    ``positions`` has the output's shape; entry ``p`` says which element of
    ``poly`` (flat, C order) lands there. Any index-remapping primitive
    (broadcast, reshape, transpose, slice, gather with constant indices,
    concatenate, pad) is expressed this way by running it on an iota.
    """
    positions = tape.asarray(positions)  # a Dual (index data) stays on the tape
    labels = tuple(space.new(n) for n in positions.shape)
    masked = positions < 0
    # Masked positions read a neighbour (their terms are zeroed below; a
    # selector, common to all terms, then stays in its sequence).
    safe = fill_missing(positions) if masked.any() and not masked.all() else np.where(masked, 0, positions)
    if poly.shape:
        coords = unravel(safe, poly.shape)
    else:
        coords = ()
    subs = {}
    for axis, (old, coord) in enumerate(zip(poly.labels, coords)):
        idx = simplify_index(Index(labels, tape.asarray(coord)), poly.shape[axis])
        subs[old] = Substitution(idx.labels, idx.array)
    terms = tuple(substitute_term(t, subs) for t in poly.terms)
    selectors = tuple(substitute_atom(s, subs) for s in poly.selectors)
    if masked.any():
        mask, _ = compress_operand(Operand((~masked).astype(float), labels))
        terms = tuple(Term(t.coeff, t.operands + (mask,), t.atoms) for t in terms)
    return Poly(positions.shape, labels, _clean(terms), selectors)


def select(mask: np.ndarray, on_true: Poly, on_false: Poly, space: Labels) -> Poly:
    """``where(mask, on_true, on_false)`` for a constant boolean mask."""
    mask = np.broadcast_to(np.asarray(mask, bool), on_true.shape or on_false.shape)
    m = constant(mask.astype(float), space)
    return add(mul(m, on_true, space), mul(constant(1.0 - mask, space), on_false, space), space)
