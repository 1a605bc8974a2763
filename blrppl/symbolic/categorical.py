"""Categorical latents as indices: enumeration and selectors.

A categorical latent z enters a factor as an index (``mu[z]``, ``trans[z_prev]``,
``z == k``). Its value is a Poly with one ``cat`` atom
(:func:`~blrppl.symbolic.values.categorical_variable`); indexing by it is
enumeration, as NumPyro's enumeration does: the result gets a new label over
the categories and a ``one_hot(z)`` *selector* (see
:mod:`blrppl.symbolic.terms`). The rules here turn equality tests, slices at a
random position and gathers with a random index into selectors; the helpers
rebuild a categorical index from the pieces a structural primitive (a scan's
shifted state) splits it into.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from blrppl.symbolic import algebra
from blrppl.graph.host import on_positions
from blrppl.symbolic.terms import (
    Index,
    Labels,
    NonConjugate,
    Operand,
    Poly,
    Term,
    VarAtom,
    fill_missing,
    ravel,
    simplify_index,
    unravel,
)
from blrppl.symbolic.values import as_poly, first_var, int_params, is_categorical, is_symbolic


def _lt(interp: Any, eqn: Any, x: Any, y: Any) -> Any:
    """``z < c`` for c <= 0 (index normalisation: never true)."""
    if is_index(x) and not is_symbolic(y) and np.all(np.asarray(y) <= 0):
        return np.zeros(eqn.outvars[0].aval.shape, bool)
    var = first_var(x) or first_var(y)
    raise NonConjugate(var, f"a comparison involving the random value {var!r}")


def _ge(interp: Any, eqn: Any, x: Any, y: Any) -> Any:
    """``z >= c`` for c <= 0 (index normalisation: always true)."""
    if is_index(x) and not is_symbolic(y) and np.all(np.asarray(y) <= 0):
        return np.ones(eqn.outvars[0].aval.shape, bool)
    var = first_var(x) or first_var(y)
    raise NonConjugate(var, f"a comparison involving the random value {var!r}")


def _eq(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    """``z == k`` for a constant k: the one-hot statistic ``one_hot(z)_k``."""
    if is_categorical(y) and not is_categorical(x):
        x, y = y, x
    if not is_categorical(x) or is_symbolic(y):
        var = first_var(x) or first_var(y)
        raise NonConjugate(var, f"an equality test involving the random value {var!r}")
    atom = x.terms[0].atoms[0]
    value = np.broadcast_to(np.asarray(y), x.shape).astype(int)
    category = simplify_index(Index(x.labels, value)) if x.shape else Index((), value)
    num = interp.categorical[atom.var][1]
    one_hot = VarAtom(atom.var, "one_hot", atom.index + (category,), sizes=atom.sizes + (num,))
    return Poly(x.shape, x.labels, (Term(1.0, (), (one_hot,)),))


def _dynamic_slice(interp: Any, eqn: Any, operand: Any, *starts: Any) -> Any:
    """A slice at a constant position (index remapping) or at one scalar categorical."""
    if not any(is_symbolic(v) for v in starts):
        return interp.structural(eqn, [operand, *starts])
    cats = [v for v in starts if is_symbolic(v)]
    if len(cats) != 1 or not is_categorical(cats[0]) or cats[0].shape != ():
        raise NonConjugate(first_var(cats[0]), "a slice at a random position other than one scalar categorical")
    (z,) = cats
    z_atom = z.terms[0].atoms[0]
    var = z_atom.var
    _, num = interp.categorical[var]
    operand_shape = tuple(eqn.invars[0].aval.shape)
    iota = np.arange(int(np.prod(operand_shape)), dtype=np.int32).reshape(operand_shape)
    positions = []
    for k in range(num):
        args = [np.asarray(k if is_symbolic(v) else v, np.int32) for v in starts]
        positions.append(on_positions(eqn, eqn.params, [iota, *args]))
    extended = algebra.reindex(as_poly(operand, interp.space), np.stack(positions, -1), interp.space)
    category = extended.labels[-1]
    # The selector reads z where the index came from (z itself, or one
    # position of it: a chain's initial state z[0]).
    selector = VarAtom(var, "one_hot", z_atom.index + (Index((category,)),), sizes=z_atom.sizes + (num,))
    shape = tuple(eqn.outvars[0].aval.shape)
    return Poly(shape, extended.labels[:-1], extended.terms, extended.selectors + (selector,))


def _gather(interp: Any, eqn: Any, operand: Any, indices: Any) -> Any:
    """A gather at constant indices (index remapping) or at a categorical index."""
    if not is_symbolic(indices):
        return interp.structural(eqn, [operand, indices])
    return _enumerate_gather(interp, eqn, operand, indices)


def _enumerate_gather(interp: Any, eqn: Any, operand: Any, indices: Any) -> Poly:
    """``operand[z]`` for a categorical latent z: a selector over its categories."""
    space = interp.space
    params = eqn.params
    poly = as_poly(indices, space)
    cats = {a.var for t in poly.terms for a in t.atoms if a.kind == "cat"}
    if len(cats) != 1 or any(a.kind != "cat" for t in poly.terms for a in t.atoms) or poly.selectors:
        raise NonConjugate(
            first_var(poly), "an index computed from random values other than one categorical latent"
        )
    (var,) = cats
    z_value_shape, num = interp.categorical[var]
    dn = params["dimension_numbers"]
    out_shape = tuple(eqn.outvars[0].aval.shape)
    offset_dims = tuple(dn.offset_dims)
    batch_dims = [d for d in range(len(out_shape)) if d not in offset_dims]
    operand_shape = np.shape(operand) if not isinstance(operand, Poly) else operand.shape
    # Which element of z each index position reads (-1: a constant component).
    element_ids = densify_categorical(poly, var, None, z_value_shape, space)
    positions = []
    for k in range(num):
        idx_k = densify_categorical(poly, var, k, z_value_shape, space).astype(np.int32)
        iota = np.arange(int(np.prod(operand_shape)), dtype=np.int32).reshape(operand_shape)
        positions.append(on_positions(eqn, int_params("gather", params), [iota, idx_k]))
    positions = np.stack(positions, axis=-1)
    extended = algebra.reindex(as_poly(operand, space), positions, space)
    category_label = extended.labels[-1]
    labels = extended.labels[:-1]
    # The z element read at each output position, from the index batch dims.
    ids = element_ids.max(axis=-1) if element_ids.ndim else element_ids
    coords = np.indices(out_shape) if out_shape else np.zeros((0,), int)
    batch_coords = tuple(coords[d] for d in batch_dims)
    ids_out = ids[batch_coords] if batch_coords else np.broadcast_to(ids, out_shape)
    ids_out = _fill_constant_ids(ids_out)
    z_coords = unravel(ids_out, z_value_shape) if z_value_shape else ()
    z_index = tuple(simplify_index(Index(labels, np.asarray(c)), n) for c, n in zip(z_coords, z_value_shape))
    selector = VarAtom(var, "one_hot", z_index + (Index((category_label,)),), sizes=tuple(z_value_shape) + (num,))
    return Poly(out_shape, labels, extended.terms, extended.selectors + (selector,))


#: Primitive name -> rule ``(interpreter, eqn, *invals) -> value``.
RULES: dict[str, Callable[..., Any]] = {
    "lt": _lt,
    "ge": _ge,
    "eq": _eq,
    "dynamic_slice": _dynamic_slice,
    "gather": _gather,
}


def is_index(value: Any) -> bool:
    """A categorical latent as an index, possibly a constant (non-negative) one at some positions.

    The second form is a scan's previous state when the initial carry is a
    constant: ``[c, z_0, z_1, ...]``.
    """
    if is_categorical(value):
        return True
    if not isinstance(value, Poly) or value.selectors or not value.terms:
        return False
    variables = set()
    for term in value.terms:
        if not term.atoms:
            if any(np.any(np.asarray(op.array) < 0) for op in term.operands) or term.coeff < 0:
                return False
            continue
        if len(term.atoms) != 1 or term.atoms[0].kind != "cat" or term.coeff != 1.0:
            return False
        variables.add(term.atoms[0].var)
    return len(variables) == 1


def _fill_constant_ids(ids: np.ndarray) -> np.ndarray:
    """Element ids of a gather index, with constant positions (-1) given a neighbour's id.

    Where an index is a constant, ``operand[c]`` is the same for every category
    k, and the selector ``one_hot(z_p)_k`` sums to one over k whatever p is. A
    nearby p keeps the term's reads of z close in time and in one sequence,
    which a chain's q needs (:func:`~blrppl.symbolic.terms.fill_missing`).
    """
    return fill_missing(ids)


def merge_categorical(poly: Any, space: Labels) -> Any:
    """Pieces of one categorical index joined by a structural primitive, as one index.

    A scan's previous state is the initial state at step 0 and the stacked
    states after it (a concatenation): terms ``mask_i * z[positions_i]`` whose
    0/1 masks partition the output become one ``z[positions]``, so the result
    can index (``trans[z_prev]``) like the variable itself. Anything else is
    returned unchanged.
    """
    if not isinstance(poly, Poly) or len(poly.terms) < 2 or poly.selectors or not poly.shape:
        return poly
    own = set(poly.labels)
    atoms = [t.atoms for t in poly.terms]
    if any(len(a) != 1 or a[0].kind != "cat" or not a[0].labels <= own for a in atoms):
        return poly
    var, sizes = atoms[0][0].var, atoms[0][0].sizes
    if any(a[0].var != var or a[0].sizes != sizes for a in atoms):
        return poly
    total = np.zeros(poly.shape)
    for term in poly.terms:
        if any(not set(op.labels) <= own for op in term.operands):
            return poly
        dense = np.full(poly.shape, term.coeff, float)
        for op in term.operands:
            dense = dense * _operand_dense(op, poly.labels)
        if not np.all((dense == 0) | (dense == 1)):
            return poly
        total = total + dense
    if not np.all(total == 1):
        return poly
    ids = densify_categorical(poly, var, None, sizes, space)
    coords = unravel(ids, sizes) if sizes else ()
    index = tuple(simplify_index(Index(poly.labels, np.asarray(c)), n) for c, n in zip(coords, sizes))
    atom = VarAtom(var, "cat", index, sizes=sizes)
    return Poly(poly.shape, poly.labels, (Term(1.0, (), (atom,)),))


def densify_categorical(
    poly: Poly, var: str, k: int | None, value_shape: tuple[int, ...], space: Labels
) -> np.ndarray:
    """Evaluate an index Poly with z := k, or (k None) with z := its element id.

    With ``k`` None, positions that hold a constant component read -1.
    """
    out = np.zeros(poly.shape)
    for term in poly.terms:
        dense = np.full(poly.shape, term.coeff, float)
        for op in term.operands:
            dense = dense * _operand_dense(op, poly.labels)
        if term.atoms:
            (atom,) = term.atoms
            if k is None:
                coords = [_index_dense(idx, poly.labels, space) for idx in atom.index]
                coords = np.broadcast_arrays(*coords) if coords else []
                ids = ravel(tuple(coords), value_shape) if coords else 0
                dense = dense * (np.asarray(ids) + 1.0)
            else:
                dense = dense * float(k)
        elif k is None:
            dense = dense * 0.0
        out = out + dense
    out = np.rint(out).astype(np.int64)
    return out - 1 if k is None else out


def _operand_dense(op: Operand, labels: Sequence) -> np.ndarray:
    """An operand broadcast over ``labels`` (its own axes in that order, size 1 elsewhere)."""
    arr = np.asarray(op.array, float)
    own = list(op.labels)
    order = [own.index(lab) for lab in labels if lab in own]
    arr = np.transpose(arr, order) if arr.ndim else arr
    dims = iter(arr.shape)
    return arr.reshape([next(dims) if lab in own else 1 for lab in labels])


def _index_dense(idx: Index, labels: Sequence, space: Labels) -> np.ndarray:
    """An Index as a dense integer array over ``labels`` (broadcastable)."""
    shape = [space.size[lab] for lab in labels]
    if idx.direct:
        axis = list(labels).index(idx.labels[0])
        view = [1] * len(labels)
        view[axis] = shape[axis]
        return np.arange(shape[axis]).reshape(view)
    arr = np.asarray(idx.array)
    own = list(idx.labels)
    order = [own.index(lab) for lab in labels if lab in own]
    arr = np.transpose(arr, order) if arr.ndim else arr
    dims = iter(arr.shape)
    return arr.reshape([next(dims) if lab in own else 1 for lab in labels])
