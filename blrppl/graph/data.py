"""A model's arguments as data: arrays that compiled fits take as arguments.

Fitting the same model to new data of the same shapes must not compile again
(the data are arguments of the compiled step, not constants folded into it).
:func:`split_model_data` separates the array leaves of ``(model_args,
model_kwargs)`` from the static ones; :meth:`ModelData.rebuild` puts new
arrays (or tracers) back in their places.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
import weakref
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np


class ModelData(NamedTuple):
    """A model's arguments split into arrays (passed to compiled code) and the rest.

    ``arrays`` are the array leaves of ``(model_args, model_kwargs)`` (numpy
    or JAX arrays, any dtype): they may change between fits without a new
    compilation. Everything else (Python scalars, strings, None, callables)
    is static: it is part of the structure a compiled fit is keyed by.
    """

    arrays: tuple
    treedef: Any
    static: tuple  # (position, value) of every non-array leaf

    def rebuild(self, arrays: Optional[Sequence[Any]] = None) -> tuple[tuple, dict]:
        """``(model_args, model_kwargs)`` with ``arrays`` in place of the stored ones (a None
        entry of ``arrays``: the stored array there, a constant: ``Plan.held_data``)."""
        arrays = self.arrays if arrays is None else tuple(
            stored if array is None else array for array, stored in zip(arrays, self.arrays, strict=True)
        )
        leaves: list[Any] = [None] * (len(arrays) + len(self.static))
        static = dict(self.static)
        it = iter(arrays)
        for i in range(len(leaves)):
            leaves[i] = static[i] if i in static else next(it)
        args, kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return tuple(args), dict(kwargs)

    @property
    def signature(self) -> tuple:
        """Hashable structure: the tree, the static leaves, the arrays' shapes and dtypes."""
        shapes = tuple((tuple(a.shape), str(a.dtype)) for a in self.arrays)  # numpy or JAX arrays
        static = tuple((i, _hashable(v)) for i, v in self.static)
        return (self.treedef, static, shapes)


DATA_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    TypeError,
    ValueError,
    IndexError,
)
"""What running a model with abstract data raises when it needs concrete data values."""


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return ("unhashable", type(value).__name__, id(value))


def split_model_data(model_args: tuple, model_kwargs: Mapping[str, Any]) -> ModelData:
    """Split a model's arguments into :class:`ModelData` (arrays and static leaves)."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(model_args), dict(model_kwargs)))
    arrays, static = [], []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (np.ndarray, jax.Array)) and not isinstance(leaf, jax.core.Tracer):
            arrays.append(leaf)
        else:
            static.append((i, leaf))
    return ModelData(tuple(arrays), treedef, tuple(static))


def content_digest(obj: Any) -> str:
    """A digest of an object's structure and array contents (data closed over, saved fits)."""
    digest = hashlib.sha1()
    _digest(obj, digest, set())
    return digest.hexdigest()


def _digest(obj: Any, digest: Any, seen: set) -> None:
    if isinstance(obj, (np.ndarray, jax.Array, np.generic)):
        array = np.asarray(obj)
        digest.update(f"array{array.dtype}{array.shape}".encode())
        contiguous = np.ascontiguousarray(array)
        try:  # the array's own buffer: no copy of large data
            digest.update(memoryview(contiguous).cast("B"))
        except (TypeError, ValueError):  # object or unusual dtypes
            digest.update(contiguous.tobytes())
        return
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, type)):
        digest.update(f"{type(obj).__name__}:{obj!r}".encode())
        return
    if id(obj) in seen:
        digest.update(b"<cycle>")
        return
    seen.add(id(obj))
    digest.update(type(obj).__name__.encode())
    if isinstance(obj, dict):
        for key in obj:
            _digest(key, digest, seen)
            _digest(obj[key], digest, seen)
    elif isinstance(obj, (tuple, list, frozenset, set)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        for item in items:
            _digest(item, digest, seen)
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            _digest(getattr(obj, field.name), digest, seen)
    elif isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        digest.update(f"{getattr(obj, '__qualname__', '')}:{id(obj)}".encode())
    elif isinstance(obj, weakref.ref):
        digest.update(b"<weakref>")  # a cache (numpyro's transforms keep their inverse so)
    elif hasattr(obj, "__dict__"):
        # Caches (numpyro's transforms keep a weakref to their inverse once
        # used) are not content: leave them out so use does not change a digest.
        # (Digested in place, not as a new dict: a temporary's id, once freed, is
        # reused by the next one, which ``seen`` would then skip as a cycle.)
        digest.update(b"dict")
        for key, value in vars(obj).items():
            if not isinstance(value, weakref.ref):
                _digest(key, digest, seen)
                _digest(value, digest, seen)
    else:
        digest.update(repr(obj).encode())
