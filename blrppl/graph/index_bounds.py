"""Indices from the data that fall outside the axis they index.

JAX does not raise on an out-of-range index: ``x[i]`` clamps it (XLA's gather
promises in-bounds indices and reads the last row), ``jnp.take`` fills NaN,
``lax.dynamic_slice`` moves the window. A model whose group codes run 1..G
against a (G,) latent (``alpha[g]``) therefore fits, silently, a model in
which the last group's effect is shared. NumPy would raise ``IndexError``.

:func:`out_of_range` walks a model's jaxpr (its data closed over as
constants, the latents as inputs) with the values that depend on no latent:
the constants, and integer or boolean arithmetic on them (JAX's own
normalisation of negative indices, casts, broadcasts) evaluated in numpy. At
every ``gather`` and ``dynamic_slice`` whose indices are so known it checks
them against the operand's shape, and returns the equations that read
outside it. A ``gather`` in ``CLIP`` mode (``jnp.take(..., mode="clip")``)
clamps because the user asked for it and is not reported. Indices that come
from a loop's carry or its per-step inputs, or from float arithmetic, are
not known here and are not checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from blrppl.graph.jaxpr import inner_jaxpr, open_jaxpr, walk
from blrppl.graph.host import evaluate

MAX_KNOWN_ELEMENTS = 1 << 24
"""Integer arrays up to this many elements are computed in numpy; larger ones are not checked."""


@dataclasses.dataclass(frozen=True)
class OutOfRange:
    """An indexing equation that reads outside its operand; ``detail`` says where."""

    detail: str


def out_of_range(closed: Any) -> dict[int, OutOfRange]:
    """``id(eqn)`` -> :class:`OutOfRange` for every indexing equation of ``closed`` (a closed
    jaxpr, bodies of calls and loops included) whose indices are known and out of range."""
    found: dict[int, OutOfRange] = {}
    jaxpr, consts = open_jaxpr(closed)
    _walk(jaxpr, [_known(c) for c in consts], [None] * len(jaxpr.invars), found)
    return found


def _known(value: Any) -> Optional[np.ndarray]:
    if not isinstance(getattr(value, "dtype", None), np.dtype):  # a key, a token
        return None
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - an abstract value: not known
        return None
    return array if array.dtype != object and array.size <= MAX_KNOWN_ELEMENTS else None


def _walk(jaxpr: Any, consts: Sequence, args: Sequence, found: dict) -> list:
    return walk(jaxpr, consts, args, lambda eqn, ins: _equation(eqn, ins, found), literal=_literal)


def _literal(var: Any) -> Optional[np.ndarray]:
    dtype = getattr(var.aval, "dtype", None)
    return np.asarray(var.val, dtype) if isinstance(dtype, np.dtype) else None


def _equation(eqn: Any, ins: list, found: dict) -> list:
    name = eqn.primitive.name
    unknown = [None] * len(eqn.outvars)
    if name == "gather" and ins[1] is not None:
        _check_gather(eqn, ins[1], found)
    elif name == "dynamic_slice" and all(v is not None for v in ins[1:]):
        _check_dynamic_slice(eqn, ins[1:], found)
    if name == "scan":  # its constants are known; carry and per-step inputs are not
        n = eqn.params["num_consts"]
        body = eqn.params["jaxpr"]
        inner, consts = open_jaxpr(body)
        _walk(inner, [_known(c) for c in consts], [*ins[:n], *[None] * (len(ins) - n)], found)
        return unknown
    body = inner_jaxpr(eqn)
    if body is not None:
        inner, consts = open_jaxpr(body)
        return _walk(inner, [_known(c) for c in consts], ins, found)
    if any(v is None for v in ins) or eqn.effects or len(eqn.outvars) != 1:
        return unknown
    aval = eqn.outvars[0].aval
    dtype = getattr(aval, "dtype", None)
    if not isinstance(dtype, np.dtype) or dtype.kind not in "iub" or int(np.prod(aval.shape)) > MAX_KNOWN_ELEMENTS:
        return unknown  # float arithmetic, keys, tokens: not index values
    try:
        xs = [np.asarray(v, dtype=var.aval.dtype) for v, var in zip(ins, eqn.invars)]
        out = evaluate(name, dict(eqn.params), xs, dtype, tuple(aval.shape))
    except Exception:  # noqa: BLE001 - a rule that does not fit: the value stays unknown
        out = None
    return [out]


def _check_gather(eqn: Any, indices: np.ndarray, found: dict) -> None:
    mode = str(eqn.params.get("mode"))
    if mode.endswith("CLIP") or indices.size == 0:
        return
    dn = eqn.params["dimension_numbers"]
    shape = np.asarray(eqn.invars[0].aval.shape)
    sizes = np.asarray(eqn.params["slice_sizes"])
    vectors = np.reshape(indices, (-1, indices.shape[-1])) if indices.ndim else np.reshape(indices, (1, 1))
    for k, axis in enumerate(dn.start_index_map):
        column = vectors[:, k]
        high = int(shape[axis] - sizes[axis])
        bad = (column < 0) | (column > high)
        if bad.any():
            value = int(column[np.argmax(bad)])
            what = "reads NaN there (jnp.take fills)" if mode.endswith("FILL_OR_DROP") else "clamps it silently"
            wrapped = " (a negative index after numpy's wrap, i + size)" if value < 0 else ""
            found[id(eqn)] = OutOfRange(
                f"index {value}{wrapped} on an axis of size {int(shape[axis])} ({int(bad.sum())} of {column.size} "
                f"indices out of range, valid 0..{int(shape[axis]) - 1}); JAX {what}"
            )
            return


def _check_dynamic_slice(eqn: Any, starts: list, found: dict) -> None:
    shape = eqn.invars[0].aval.shape
    for axis, (start, size) in enumerate(zip(starts, eqn.params["slice_sizes"])):
        start = int(np.asarray(start))
        if start < 0 or start > shape[axis] - size:
            found[id(eqn)] = OutOfRange(
                f"a slice of {size} at {start} on an axis of size {shape[axis]}; JAX moves it silently to fit"
            )
            return
