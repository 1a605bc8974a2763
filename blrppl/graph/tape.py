"""Record the data-dependent arithmetic of planning, to replay it compiled on new data.

Planning a fit (tracing the model, the symbolic analysis of every factor)
runs numpy on concrete data once per data set: ~tens of milliseconds of host
work that a refit of new data of the same shapes should not pay. While a
plan is made under :func:`recording`, the model's array arguments enter the
analysis as :class:`Dual` values: a numpy value (what planning computes
today, unchanged) paired with a :class:`Node` of a tape that says how the
value was computed from the data. numpy dispatches its ufuncs and functions
on a ``Dual`` (``__array_ufunc__``, ``__array_function__``); each is computed
on the numpy value and recorded with its ``jax.numpy`` twin.

Where planning *decides* something from a data value (``if np.all(a == b)``,
a term dropped because its coefficient is zero, a data array used as a
static index), the decision is recorded as a *guard*: the value the decision
read, which a replay must reproduce exactly. :func:`replay` evaluates the
tape with ``jax.numpy`` (jit-able, vmap-able) and returns, with the replayed
values, whether every guard holds: where one does not, a new data set would
change the plan's structure, and the caller plans it on the host instead.
Anything not on the tape (a function without a ``jax.numpy`` twin, a
conversion to a plain array or Python number) reads the concrete value and
guards it, so a replay is never silently stale: at worst it falls back.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Callable, Iterator, Optional, Sequence

import jax.numpy as jnp
import numpy as np

INPUT = "input"

# numpy functions whose result depends on shapes and dtypes only: no guard.
_SHAPE_ONLY = {"shape", "ndim", "size", "result_type", "iscomplexobj", "isrealobj", "can_cast", "min_scalar_type"}

# numpy functions replayed with their jax.numpy twin (same name, same meaning).
_LIFTED = {
    "moveaxis", "transpose", "reshape", "take", "diagonal", "broadcast_to", "einsum", "all", "any", "sum", "prod",
    "stack", "concatenate", "expand_dims", "squeeze", "isclose", "array_equal", "clip", "ones_like", "zeros_like",
    "full_like", "tensordot", "dot", "matmul", "outer", "swapaxes", "trace", "tril", "triu", "flip", "cumsum",
    "mean", "max", "min", "amax", "amin", "ravel", "atleast_1d", "atleast_2d", "real", "imag", "kron", "repeat",
    "tile", "take_along_axis", "round", "around", "maximum", "minimum", "where", "copy", "abs", "sqrt", "log", "exp",
    "square", "negative", "logical_not", "logical_and", "logical_or", "allclose", "count_nonzero", "einsum_path",
}
_NOT_LIFTED_IF = {"where": lambda args, kwargs: len(args) != 3, "einsum": lambda args, kwargs: "out" in kwargs}


class Node:
    """One recorded operation: ``fn(*args, **kwargs)`` on replayed values.

    ``args`` and ``kwargs`` hold Nodes (replayed inputs) and constants,
    nested in tuples, lists and dicts. ``serial`` orders nodes as recorded
    (an operand is always recorded before its uses).
    """

    __slots__ = ("fn", "args", "kwargs", "serial")

    def __init__(self, fn: Any, args: tuple, kwargs: Optional[dict], serial: int):
        self.fn, self.args, self.kwargs, self.serial = fn, args, kwargs or {}, serial


class Recording:
    """The tape of one planning run: inputs, operations and guards."""

    def __init__(self, arrays: Sequence[Any]):
        self.arrays = tuple(arrays)
        self.count = 0
        self.failed: Optional[str] = None
        self.memo: dict = {}
        self.guards: list[tuple[Node, np.ndarray]] = []
        self.keyed: dict = {}  # (shape, dtype, bytes) -> the first value read as that key (:meth:`key`)
        self.equal: dict = {}  # id -> a value guarded equal to its key's first
        self.inputs = tuple(Dual(np.asarray(a), self.node(INPUT, (i,))) for i, a in enumerate(self.arrays))

    def node(self, fn: Any, args: tuple, kwargs: Optional[dict] = None) -> Node:
        self.count += 1
        return Node(fn, args, kwargs, self.count)

    def guard(self, dual: "Dual") -> np.ndarray:
        self.guards.append((dual.node, dual.value))
        return dual.value

    def key(self, dual: "Dual") -> bytes:
        """``dual``'s bytes as a key (terms merged where they read the same positions), guarded by
        its equality with the first keyed value of the same bytes, not by its value, so that index
        data (``alpha[county]``) can change while the merges the analysis made stay right. Values
        that differ here are not guarded apart: equal on new data, their terms stay two terms of
        the same sum (a plan the host would merge; the same answer)."""
        raw = dual.value.tobytes()
        first = self.keyed.setdefault((dual.shape, str(dual.dtype), raw), dual)
        if first is not dual and first.node is not dual.node and id(dual) not in self.equal:
            self.equal[id(dual)] = dual  # held: its id is not reused while the recording lives
            self.guard(lift(np.array_equal, jnp.array_equal, (first, dual)))
        return raw


_active: list[Recording] = []


@contextlib.contextmanager
def recording(arrays: Sequence[Any]) -> Iterator[Recording]:
    """Record the planning done inside the block for the model arrays ``arrays``."""
    rec = Recording(arrays)
    _active.append(rec)
    try:
        yield rec
    finally:
        _active.remove(rec)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No recording inside the block: planning there computes plain values (for an estimator
    that then gives up the recording, :func:`give_up`, or reads nothing from the data)."""
    saved = list(_active)
    _active.clear()
    try:
        yield
    finally:
        _active[:] = saved


def data_inputs(arrays: Sequence[Any], held: Callable[[], Sequence[int]] = tuple) -> Optional[tuple]:
    """The recording's :class:`Dual` inputs when ``arrays`` are the recorded ones, else None;
    ``held()``: positions of arrays the model needs as values (``FactorGraph.held_data``, asked
    for only while recording), given as their plain values: constants of the analysis, so that a
    replay is valid for the same values only (:mod:`blrppl.blr.replan` checks them)."""
    if not _active:
        return None
    rec = _active[-1]
    if len(arrays) != len(rec.arrays) or any(a is not b for a, b in zip(arrays, rec.arrays)):
        return None
    positions = held()
    return tuple(d.value if i in positions else d for i, d in enumerate(rec.inputs))


def memo(dual: "Dual", name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, once per recorded value and ``name`` (repeated decisions on one value)."""
    rec = _recording()
    if rec is None:
        return compute()
    key = (id(dual.node), name)
    if key not in rec.memo:
        rec.memo[key] = (dual.node, compute())
    return rec.memo[key][1]


def give_up(reason: str) -> None:
    """Mark the active recording unusable (its plan read data off the tape)."""
    if _active and _active[-1].failed is None:
        _active[-1].failed = reason


def _recording() -> Optional[Recording]:
    return _active[-1] if _active else None


def is_dual(value: Any) -> bool:
    return isinstance(value, Dual)


def concrete(value: Any) -> Any:
    """``value`` with every Dual in it read as its numpy value (guarded)."""
    if isinstance(value, Dual):
        return value.read()
    if isinstance(value, (tuple, list)):
        return type(value)(concrete(v) for v in value)
    if isinstance(value, dict):
        return {k: concrete(v) for k, v in value.items()}
    return value


def _values(value: Any) -> Any:
    if isinstance(value, Dual):
        return value.value
    if isinstance(value, (tuple, list)):
        return type(value)(_values(v) for v in value)
    if isinstance(value, dict):
        return {k: _values(v) for k, v in value.items()}
    return value


def _nodes(value: Any) -> Any:
    if isinstance(value, Dual):
        return value.node
    if isinstance(value, list) and value and all(isinstance(v, (bool, int, float, np.generic)) for v in value):
        return np.asarray(value)  # jax.numpy takes arrays, not lists of numbers
    if isinstance(value, (tuple, list)):
        return type(value)(_nodes(v) for v in value)
    if isinstance(value, dict):
        return {k: _nodes(v) for k, v in value.items()}
    return value


def _has_dual(value: Any) -> bool:
    if isinstance(value, Dual):
        return True
    if isinstance(value, (tuple, list)):
        return any(_has_dual(v) for v in value)
    if isinstance(value, dict):
        return any(_has_dual(v) for v in value.values())
    return False


def lift(fn: Callable, jfn: Callable, args: tuple, kwargs: Optional[dict] = None) -> Any:
    """``fn(*args, **kwargs)`` on the numpy values, recorded as ``jfn`` on the tape.

    Without a recording or a Dual among the arguments this is ``fn`` itself.
    """
    kwargs = kwargs or {}
    rec = _recording()
    if rec is None or not (_has_dual(args) or _has_dual(kwargs)):
        return fn(*concrete(args), **concrete(kwargs))
    out = fn(*_values(args), **_values(kwargs))
    node = rec.node(jfn, _nodes(args), _nodes(kwargs))
    return _wrap(rec, out, node)


def _wrap(rec: Recording, out: Any, node: Node) -> Any:
    if isinstance(out, tuple):
        return tuple(_wrap(rec, o, rec.node(operator.getitem, (node, i))) for i, o in enumerate(out))
    if isinstance(out, (np.ndarray, np.generic, bool, int, float)):
        return Dual(np.asarray(out), node)
    return out  # not an array (a dtype, a shape): structure, no guard needed


def _twin(func: Any) -> Optional[Callable]:
    name = func.__name__
    module = getattr(func, "__module__", "") or ""
    if name not in _LIFTED:
        return None
    if "linalg" in module:
        return getattr(jnp.linalg, name, None)
    return getattr(jnp, name, None)


class Dual:
    """A numpy value and the tape node that computes it from the data (module docstring)."""

    __slots__ = ("value", "node")
    __array_priority__ = 10_000
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: np.ndarray, node: Node):
        self.value = value
        self.node = node

    # -- structure: shapes and dtypes are the same for every data set of a signature
    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)
    size = property(lambda self: self.value.size)

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"Dual({self.value!r})"

    # -- reads of the value: guarded
    def read(self) -> np.ndarray:
        rec = _recording()
        return rec.guard(self) if rec is not None else self.value

    def __bool__(self) -> bool:
        return bool(self.read())

    def __float__(self) -> float:
        return float(self.read())

    def __int__(self) -> int:
        return int(self.read())

    def __index__(self) -> int:
        return operator.index(self.read())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.read()
        return np.asarray(value, dtype) if dtype is not None else value

    def __jax_array__(self) -> Any:
        return jnp.asarray(self.read())

    def tobytes(self) -> bytes:  # a key: guarded by equality with the other keys (Recording.key)
        rec = _recording()
        return rec.key(self) if rec is not None else self.value.tobytes()

    def item(self) -> Any:
        return self.read().item()

    def tolist(self) -> Any:
        return self.read().tolist()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- numpy dispatch
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        jfn = getattr(jnp, ufunc.__name__, None) if method == "__call__" and not kwargs else None
        if jfn is None:
            return getattr(ufunc, method)(*concrete(inputs), **concrete(kwargs))
        return lift(ufunc, jfn, inputs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        name = func.__name__
        if name in _SHAPE_ONLY:
            return func(*_values(args), **_values(kwargs))
        jfn = _twin(func)
        veto = _NOT_LIFTED_IF.get(name)
        if jfn is None or (veto is not None and veto(args, kwargs)):
            return func(*concrete(args), **concrete(kwargs))
        return lift(func, jfn, args, kwargs)

    # -- methods
    def __getitem__(self, key: Any) -> Any:
        return lift(operator.getitem, operator.getitem, (self, key))

    def astype(self, dtype: Any, copy: bool = True) -> Any:
        return lift(lambda x: x.astype(dtype), lambda x: x.astype(dtype), (self,))

    def reshape(self, *shape: Any) -> Any:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return lift(np.reshape, jnp.reshape, (self, tuple(shape)))

    def transpose(self, *axes: Any) -> Any:
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return lift(np.transpose, jnp.transpose, (self, tuple(axes) or None))

    T = property(lambda self: self.transpose())

    def copy(self) -> "Dual":
        return self

    def ravel(self) -> Any:
        return lift(np.ravel, jnp.ravel, (self,))

    def sum(self, axis: Any = None, **kwargs: Any) -> Any:
        return lift(np.sum, jnp.sum, (self,), {"axis": axis, **kwargs})

    def all(self, axis: Any = None) -> Any:
        return lift(np.all, jnp.all, (self,), {"axis": axis})

    def any(self, axis: Any = None) -> Any:
        return lift(np.any, jnp.any, (self,), {"axis": axis})


def _binary(ufunc: Any, swap: bool = False) -> Callable:
    if swap:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


for _name, _ufunc in {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide, "floordiv": np.floor_divide,
    "mod": np.remainder, "pow": np.power, "matmul": np.matmul, "and": np.logical_and, "or": np.logical_or,
}.items():
    setattr(Dual, f"__{_name}__", _binary(_ufunc))
    setattr(Dual, f"__r{_name}__", _binary(_ufunc, swap=True))
for _name, _ufunc in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                      "ge": np.greater_equal}.items():
    setattr(Dual, f"__{_name}__", _binary(_ufunc))
Dual.__neg__ = lambda self: np.negative(self)  # type: ignore[attr-defined]
Dual.__abs__ = lambda self: np.abs(self)  # type: ignore[attr-defined]
Dual.__invert__ = lambda self: np.invert(self)  # type: ignore[attr-defined]


def needed(outputs: Sequence[Any], guards: Sequence[tuple[Node, Any]]) -> list[Node]:
    """The nodes that ``outputs`` and the guards read, in recording order."""
    seen: dict[int, Node] = {}
    stack = [n for n in _flat_nodes(outputs)] + [n for n, _ in guards]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if node.fn != INPUT:
            stack.extend(_flat_nodes((node.args, node.kwargs)))
    return sorted(seen.values(), key=lambda n: n.serial)


def _flat_nodes(value: Any) -> list[Node]:
    if isinstance(value, Node):
        return [value]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _flat_nodes(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _flat_nodes(v)]
    return []


def replay(order: Sequence[Node], outputs: Sequence[Any], guards: Sequence[tuple[Node, Any]], inputs: Sequence[Any]):
    """The replayed ``outputs`` (Nodes or constants) on new ``inputs``, and whether every guard holds.

    ``order`` is :func:`needed` of the same outputs and guards. Pure
    ``jax.numpy``: jit and vmap it.
    """
    env: dict[int, Any] = {}

    def value(x: Any) -> Any:
        if isinstance(x, Node):
            return env[id(x)]
        if isinstance(x, (tuple, list)):
            return type(x)(value(v) for v in x)
        if isinstance(x, dict):
            return {k: value(v) for k, v in x.items()}
        return x

    for node in order:
        if node.fn == INPUT:
            env[id(node)] = jnp.asarray(inputs[node.args[0]])
        else:
            env[id(node)] = node.fn(*value(node.args), **value(node.kwargs))
    ok = jnp.asarray(True)
    for node, expected in guards:
        ok = ok & jnp.all(jnp.asarray(env[id(node)]) == expected)
    return [value(x) for x in outputs], ok


def asarray(value: Any, dtype: Any = None) -> Any:
    """``np.asarray(value, dtype)``, keeping a Dual on the tape."""
    if isinstance(value, Dual):
        return value if dtype is None or value.dtype == np.dtype(dtype) else value.astype(dtype)
    return np.asarray(value, dtype)


def scalar(value: Any) -> Any:
    """``float(value)``, keeping a Dual (0-d) on the tape."""
    if isinstance(value, Dual):
        return value.astype(float) if value.ndim == 0 else lift(float, float, (value,))
    return float(value)


def strip(tree: Any) -> Any:
    """``tree`` with every Dual replaced by its numpy value (no guard)."""
    import jax

    return jax.tree.map(lambda x: x.value if isinstance(x, Dual) else x, tree)
