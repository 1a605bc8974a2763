"""Planning's small eager operations evaluated with numpy: nothing compiles.

Planning runs the model's code eagerly on the host (its first trace) and
NumPyro's constructors with it. Each eager ``jnp`` operation of a new shape
is a program JAX compiles (10-25 ms each with :mod:`blrppl.eager_ops`' cheap
settings): the GP's kernel matrix costs 16 of them, UCBadmit's first call
about 45, most of a second. On operands this small numpy computes the same
values in microseconds.

:func:`evaluate` applies a primitive to concrete operands with numpy where a
rule below covers it (elementwise arithmetic, comparisons, casts, shape
operations, reductions, ``dot_general``, slices; a jitted function, such as
``jnp.add``, by its jaxpr, equation by equation), with the dtype, shape and
weak type JAX's own abstract evaluation gives; anything else (random bits,
scatters, other linear algebra, loops, a parameter a rule does not know) returns
None, and the caller compiles it as JAX would. Values agree with XLA's to
the last bit or two (transcendental functions round differently), as
:mod:`blrppl.eager_ops`' cheap compilation already does, and so do XLA's
conventions (a float cast to an integer saturates; lgamma(-inf) = inf;
digamma is NaN at its poles), except for subnormal numbers, which XLA:CPU
flushes to zero in some operations (sign, floor, log, tanh...) and not in
others, and numpy never does.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import numpy as np
import scipy.linalg
import scipy.special

from blrppl import compile_mode

MAX_OPERAND_BYTES = 1 << 20
"""Operands of at most this many bytes in all are evaluated with numpy (beyond, XLA's
multi-threaded loops win, and its compilation is a smaller share)."""


class _Unsupported(Exception):
    """An equation no rule covers: the caller compiles the operation."""


def _binary(fun: Callable) -> Callable:
    return lambda args, params: fun(args[0], args[1])


def _unary(fun: Callable) -> Callable:
    return lambda args, params: fun(args[0])


def _float_only(fun: Callable) -> Callable:
    def rule(args: list, params: dict) -> np.ndarray:
        if not all(np.issubdtype(a.dtype, np.floating) for a in args):
            raise _Unsupported  # integer division and remainder round as C does, not numpy
        return fun(*args)

    return rule


def _broadcast_in_dim(args: list, params: dict) -> np.ndarray:
    (x,), shape, dims = args, params["shape"], params["broadcast_dimensions"]
    expanded = [1] * len(shape)
    for axis, dim in zip(range(x.ndim), dims):
        expanded[dim] = x.shape[axis]
    return np.broadcast_to(np.reshape(x, expanded), shape)


def _reshape(args: list, params: dict) -> np.ndarray:
    if params.get("dimensions") is not None:
        raise _Unsupported
    return np.reshape(args[0], params["new_sizes"])


def _iota(args: list, params: dict) -> np.ndarray:
    shape, dimension = params["shape"], params["dimension"]
    ramp = np.arange(shape[dimension], dtype=params["dtype"])
    return np.broadcast_to(np.reshape(ramp, [-1 if i == dimension else 1 for i in range(len(shape))]), shape)


def _select_n(args: list, params: dict) -> np.ndarray:
    which, cases = args[0], args[1:]
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0]) if len(cases) == 2 else cases[0]
    return np.choose(which, cases)


def _slice(args: list, params: dict) -> np.ndarray:
    strides = params["strides"] or (1,) * args[0].ndim
    return args[0][tuple(slice(s, e, k) for s, e, k in zip(params["start_indices"], params["limit_indices"], strides))]


def _dynamic_slice(args: list, params: dict) -> np.ndarray:
    x, starts, sizes = args[0], args[1:], params["slice_sizes"]
    if len(starts) != x.ndim:
        raise _Unsupported
    # XLA clamps a start so that the slice stays inside the operand.
    starts = [int(np.clip(int(s), 0, n - k)) for s, n, k in zip(starts, x.shape, sizes)]
    return x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]


def _dynamic_update_slice(args: list, params: dict) -> np.ndarray:
    x, update, starts = args[0], args[1], args[2:]
    if len(starts) != x.ndim:
        raise _Unsupported
    starts = [int(np.clip(int(s), 0, n - k)) for s, n, k in zip(starts, x.shape, update.shape)]
    out = np.array(x, copy=True)
    out[tuple(slice(s, s + k) for s, k in zip(starts, update.shape))] = update
    return out


def _reduction(fun: Callable) -> Callable:
    return lambda args, params: fun(args[0], axis=tuple(params["axes"]))


def _dot_general(args: list, params: dict) -> np.ndarray:
    lhs, rhs = args
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    left = [next(letters) for _ in range(lhs.ndim)]
    right = [next(letters) for _ in range(rhs.ndim)]
    for i, j in zip(lb, rb):
        right[j] = left[i]
    for i, j in zip(lc, rc):
        right[j] = left[i]
    batch = [left[i] for i in lb]
    free_left = [c for i, c in enumerate(left) if i not in lb and i not in lc]
    free_right = [c for j, c in enumerate(right) if j not in rb and j not in rc]
    spec = f"{''.join(left)},{''.join(right)}->{''.join(batch + free_left + free_right)}"
    return np.einsum(spec, lhs, rhs)


def _concatenate(args: list, params: dict) -> np.ndarray:
    return np.concatenate(args, axis=params["dimension"])


def _pad(args: list, params: dict) -> np.ndarray:
    x, value = args
    config = params["padding_config"]
    if any(interior or lo < 0 or hi < 0 for lo, hi, interior in config):
        raise _Unsupported
    return np.pad(x, [(lo, hi) for lo, hi, _ in config], constant_values=value)


def _cumulative(fun: Callable) -> Callable:
    def rule(args: list, params: dict) -> np.ndarray:
        x, axis = args[0], params["axis"]
        if params.get("reverse"):
            return np.flip(fun(np.flip(x, axis), axis=axis), axis)
        return fun(x, axis=axis)

    return rule


def _split(args: list, params: dict) -> list:
    edges = np.cumsum(params["sizes"])[:-1]
    return np.split(args[0], edges, axis=params["axis"])


def _gather(args: list, params: dict) -> np.ndarray:
    """XLA's gather (what ``x[idx]`` lowers to), vectorised: every start clamped into the operand
    (modes "clip" and "promise in bounds", as XLA does), or filled where out of bounds ("fill")."""
    operand, indices = args
    numbers, sizes, mode = params["dimension_numbers"], tuple(params["slice_sizes"]), str(params["mode"])
    if numbers.operand_batching_dims or numbers.start_indices_batching_dims:
        raise _Unsupported("batched gather")
    batch_shape = indices.shape[:-1]
    starts = np.reshape(indices, (-1, indices.shape[-1])).astype(np.int64)
    full = np.zeros((starts.shape[0], operand.ndim), np.int64)
    full[:, list(numbers.start_index_map)] = starts
    upper = np.asarray(operand.shape) - np.asarray(sizes)
    inside = np.all((full >= 0) & (full <= upper), axis=1)
    full = np.clip(full, 0, upper)
    grids = np.meshgrid(*[np.arange(k) for k in sizes], indexing="ij") if sizes else []
    picks = tuple(full[:, d].reshape((-1,) + (1,) * len(sizes)) + grids[d][None] for d in range(operand.ndim))
    values = operand[picks]  # (batch, *slice_sizes)
    if "FILL" in mode.upper():
        fill = params.get("fill_value")
        if fill is None:
            fill = np.nan if np.issubdtype(operand.dtype, np.inexact) else (
                True if operand.dtype == bool else np.iinfo(operand.dtype).min if np.issubdtype(operand.dtype, np.signedinteger)
                else np.iinfo(operand.dtype).max)
        values = np.where(inside.reshape((-1,) + (1,) * len(sizes)), values, np.asarray(fill).astype(operand.dtype))
    elif not any(m in mode.upper() for m in ("CLIP", "PROMISE")):
        raise _Unsupported(mode)
    kept = [d for d in range(operand.ndim) if d not in numbers.collapsed_slice_dims]
    values = np.reshape(values, (values.shape[0],) + tuple(sizes[d] for d in kept))  # collapsed dims have size 1
    values = np.reshape(values, batch_shape + values.shape[1:])
    # Output axes: the slice's kept dims at offset_dims, the batch dims elsewhere, in order.
    rank = len(batch_shape) + len(kept)
    batch_axes = [a for a in range(rank) if a not in numbers.offset_dims]
    order = np.empty(rank, np.int64)
    order[batch_axes] = np.arange(len(batch_shape))
    order[list(numbers.offset_dims)] = len(batch_shape) + np.arange(len(kept))
    return np.transpose(values, order)


def _cholesky(args: list, params: dict) -> np.ndarray:
    x = args[0]
    if params.get("symmetrize_input", False):
        x = 0.5 * (x + np.swapaxes(x, -1, -2))
    return np.linalg.cholesky(x)  # (not positive definite: LinAlgError, and XLA's NaNs compiled)


def _triangular_solve(args: list, params: dict) -> np.ndarray:
    a, b = args
    if a.ndim != 2 or b.ndim != 2 or params["conjugate_a"] and np.iscomplexobj(a):
        raise _Unsupported("batched triangular solve")
    lower, transpose = bool(params["lower"]), bool(params["transpose_a"])
    if params["left_side"]:  # op(a) x = b
        return scipy.linalg.solve_triangular(a, b, trans=int(transpose), lower=lower,
                                             unit_diagonal=bool(params["unit_diagonal"]))
    # x op(a) = b  <=>  op(a)^T x^T = b^T
    return scipy.linalg.solve_triangular(a, b.T, trans=int(not transpose), lower=lower,
                                         unit_diagonal=bool(params["unit_diagonal"])).T


def _logistic(x: np.ndarray) -> np.ndarray:
    return scipy.special.expit(x)


def _convert(args: list, params: dict) -> np.ndarray:
    x = args[0]
    target = np.dtype(params["new_dtype"])
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(target, np.integer):
        if not np.all(np.isfinite(x)):
            raise _Unsupported  # XLA's conversion of NaN and infinities to integers is its own
        info = np.iinfo(target)  # XLA saturates; numpy's cast wraps
        return np.clip(np.trunc(x), info.min, info.max)
    return x  # (cast to the output's dtype by the caller)


def _lgamma(x: np.ndarray) -> np.ndarray:
    return np.where(np.isneginf(x), np.inf, scipy.special.gammaln(x))  # XLA: log|Γ(-inf)| = inf


def _digamma(x: np.ndarray) -> np.ndarray:
    poles = (x <= 0) & (x == np.floor(x))  # XLA: NaN at 0 and the negative integers
    return np.where(poles, np.nan, scipy.special.digamma(x))


def _round(args: list, params: dict) -> np.ndarray:
    x = args[0]
    if int(params["rounding_method"]) == 1:  # to nearest even, as numpy
        return np.round(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)  # away from zero


def _integer_pow(args: list, params: dict) -> np.ndarray:
    return np.power(args[0], params["y"]) if np.issubdtype(args[0].dtype, np.floating) else args[0] ** params["y"]


_RULES: dict[str, Callable[[list, dict], Any]] = {
    "add": _binary(np.add),
    "add_any": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "div": _float_only(np.true_divide),
    "rem": _float_only(np.fmod),
    "max": _binary(np.maximum),
    "min": _binary(np.minimum),
    "pow": _float_only(np.power),
    "atan2": _float_only(np.arctan2),
    "eq": _binary(np.equal),
    "ne": _binary(np.not_equal),
    "lt": _binary(np.less),
    "le": _binary(np.less_equal),
    "gt": _binary(np.greater),
    "ge": _binary(np.greater_equal),
    "and": _binary(np.bitwise_and),
    "or": _binary(np.bitwise_or),
    "xor": _binary(np.bitwise_xor),
    "not": _unary(np.invert),
    "neg": _unary(np.negative),
    "abs": _unary(np.abs),
    "sign": _unary(np.sign),
    "floor": _unary(np.floor),
    "ceil": _unary(np.ceil),
    "exp": _unary(np.exp),
    "exp2": _unary(np.exp2),
    "expm1": _unary(np.expm1),
    "log": _unary(np.log),
    "log1p": _unary(np.log1p),
    "sqrt": _unary(np.sqrt),
    "rsqrt": _unary(lambda x: 1.0 / np.sqrt(x)),
    "square": _unary(np.square),
    "tanh": _unary(np.tanh),
    "sin": _unary(np.sin),
    "cos": _unary(np.cos),
    "logistic": _unary(_logistic),
    "lgamma": _unary(_lgamma),
    "digamma": _unary(_digamma),
    "is_finite": _unary(np.isfinite),
    "integer_pow": _integer_pow,
    "convert_element_type": _convert,
    "round": _round,
    "clamp": lambda args, params: np.minimum(np.maximum(args[1], args[0]), args[2]),
    "erf": _unary(scipy.special.erf),
    "erfc": _unary(scipy.special.erfc),
    "erf_inv": _unary(scipy.special.erfinv),
    "tan": _unary(np.tan),
    "atan": _unary(np.arctan),
    "sinh": _unary(np.sinh),
    "cosh": _unary(np.cosh),
    "asinh": _unary(np.arcsinh),
    "acosh": _unary(np.arccosh),
    "atanh": _unary(np.arctanh),
    "cbrt": _unary(np.cbrt),
    "copy": lambda args, params: args[0],
    "copy_p": lambda args, params: args[0],
    "stage": lambda args, params: args[0],
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": lambda args, params: np.squeeze(args[0], axis=tuple(params["dimensions"])),
    "transpose": lambda args, params: np.transpose(args[0], params["permutation"]),
    "rev": lambda args, params: np.flip(args[0], tuple(params["dimensions"])),
    "iota": _iota,
    "select_n": _select_n,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "stack": lambda args, params: np.stack(args, axis=params["axis"]),
    "unstack": lambda args, params: list(np.moveaxis(args[0], params["axis"], 0)),
    "split": _split,
    "reduce_sum": _reduction(np.sum),
    "reduce_max": _reduction(np.max),
    "reduce_min": _reduction(np.min),
    "reduce_prod": _reduction(np.prod),
    "reduce_and": _reduction(np.all),
    "reduce_or": _reduction(np.any),
    "cumsum": _cumulative(np.cumsum),
    "cumprod": _cumulative(np.cumprod),
    "cummax": _cumulative(np.maximum.accumulate),
    "dot_general": _dot_general,
    "gather": _gather,
    "stop_gradient": lambda args, params: args[0],
    "cholesky": _cholesky,
    "triangular_solve": _triangular_solve,
}

#: Primitives that call a jaxpr, evaluated equation by equation.
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr", "closed_call": "call_jaxpr"}


def evaluate(prim: Any, params: dict, args: tuple) -> Optional[Any]:
    """``prim.bind(*args, **params)`` computed with numpy on the host, as JAX arrays of the types
    JAX's abstract evaluation gives; None where a rule is missing, an operand is not a small
    concrete array on a CPU, or anything looks unusual (the caller then compiles it)."""
    if not _small_on_host(args):
        return None
    try:
        avals = [jax.typeof(a) for a in args]
        values = [np.asarray(a) for a in args]
        with np.errstate(all="ignore"):
            outputs, out_avals = _apply(prim, params, values, avals)
    except Exception:  # noqa: BLE001 - no rule, or a rule that does not fit these operands
        return None
    arrays = [_to_device(value, aval) for value, aval in zip(outputs, out_avals)]
    return arrays if prim.multiple_results else arrays[0]


def evaluate_call(closed: Any, args: tuple) -> Optional[list]:
    """A jitted function's eager call (its ``jaxpr`` parameter) computed with numpy, equation by
    equation, as :func:`evaluate`; None where any equation is not covered."""
    if not _small_on_host(args):
        return None
    try:
        with np.errstate(all="ignore"):
            outputs = _run_jaxpr(closed.jaxpr, closed.consts, [np.asarray(a) for a in args])
    except Exception:  # noqa: BLE001 - an equation no rule covers
        return None
    return [_to_device(np.asarray(o, v.aval.dtype), v.aval) for o, v in zip(outputs, closed.jaxpr.outvars)]


def _small_on_host(args: tuple) -> bool:
    """Operands of at most ``MAX_OPERAND_BYTES`` on a CPU, none placed or sharded on purpose (the
    results go where ``jax.device_put`` puts them: uncommitted, on the default device)."""
    leaves = jax.tree.leaves(args)
    if jax.config.jax_default_device is not None or not compile_mode._on_cpu(leaves):
        return False
    if jax.config.jax_debug_nans or jax.config.jax_debug_infs:  # XLA's eager ops raise on them: keep that
        return False
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and (leaf.committed or len(leaf.sharding.device_set) != 1):
            return False
    return sum(compile_mode._nbytes(leaf) for leaf in leaves) <= MAX_OPERAND_BYTES


def _apply(prim: Any, params: dict, values: list, avals: list) -> tuple[list, list]:
    """Numpy values and abstract values of the primitive's outputs (raises where unsupported)."""
    call = _CALLS.get(prim.name)
    if call is not None:
        closed = params[call]
        outputs = _run_jaxpr(closed.jaxpr, closed.consts, values)
        out_avals = [v.aval for v in closed.jaxpr.outvars]
        return [np.asarray(o, a.dtype) for o, a in zip(outputs, out_avals)], out_avals
    rule = _RULES.get(prim.name)
    if rule is None or _has_sharding(params) or any(np.iscomplexobj(v) for v in values):
        raise _Unsupported(prim.name)
    out, _ = prim.abstract_eval(*avals, **params)
    out_avals = list(out) if prim.multiple_results else [out]
    result = rule(values, params)
    results = list(result) if prim.multiple_results else [result]
    checked = []
    for value, aval in zip(results, out_avals):
        value = np.asarray(value).astype(aval.dtype, copy=False)
        if value.shape != tuple(aval.shape):
            raise _Unsupported(prim.name)
        checked.append(value)
    return checked, out_avals


def _has_sharding(params: dict) -> bool:
    """A parameter placing the result on devices (a rule would drop it)."""
    for name in ("sharding", "out_sharding"):
        if params.get(name) is not None:
            return True
    return False


def _run_jaxpr(jaxpr: Any, consts: list, args: list) -> list:
    """The jaxpr's outputs, every equation by :func:`_apply` (numpy values throughout)."""
    env: dict = {}

    def read(var: Any) -> Any:
        if hasattr(var, "val"):  # a literal
            return np.asarray(var.val, var.aval.dtype)
        return env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = np.asarray(value)
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        if eqn.effects:
            raise _Unsupported("effects")
        values = [read(v) for v in eqn.invars]
        outputs, _ = _apply(eqn.primitive, eqn.params, values, [v.aval for v in eqn.invars])
        for var, value in zip(eqn.outvars, outputs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _to_device(value: np.ndarray, aval: Any) -> jax.Array:
    """A JAX array of ``aval``'s type (its weak type included) holding ``value``."""
    from jax._src import core  # jax is pinned below 0.11
    from jax._src.interpreters import pxla

    device, sharding = compile_mode._default_placement()
    value = np.asarray(value, dtype=aval.dtype, order="C")  # (ascontiguousarray makes a scalar 1-d)
    typed = core.ShapedArray(value.shape, value.dtype, weak_type=getattr(aval, "weak_type", False))
    return pxla.batched_device_put(typed, sharding, [value], [device], committed=False)
