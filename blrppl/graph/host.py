"""Constant primitives evaluated in numpy.

The symbolic interpreter evaluates every equation whose inputs are all
constants (data, literals, index arithmetic) as it walks a jaxpr. Bound
eagerly, each such primitive compiles a one-operation XLA program per new
shape (30-60 ms each, 5-10 per small model), which dominated the planning
time of small models. Index remapping, comparisons, selection and the
correctly rounded arithmetic (+, -, *, /, sqrt) give the same bits in numpy
once the inputs carry the equation's dtypes. With ``approximate=True``
(:func:`host_bind`, the interpreter's constants) the common transcendental
functions and sums run in numpy too: within an ulp or two of the true value
(a sum to its rounding order), they agree with XLA's to 1e-13 (XLA:CPU's own
log1p is up to ~70 ulps off near -0.4), far inside every tolerance a plan is
held to, and a plan made again from the same data gives the same bits. Integer
division and remainder truncate toward zero, as XLA's do. What is left (a zero
integer divisor, the rarer special functions, keys) goes to XLA.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
from scipy import special

_FLOAT_EXACT: dict[str, Callable] = {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "rem": np.fmod,
    "sqrt": np.sqrt,
    "square": np.square,
}
def _truncated_division(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """XLA's integer ``div``: the quotient rounded toward zero (numpy's ``//`` floors); a zero
    divisor, whose result XLA defines its own way, is left to XLA (ValueError: no rule)."""
    if np.any(b == 0):
        raise ValueError("integer division by zero")
    quotient = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -quotient, quotient)


def _truncated_remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """XLA's integer ``rem``: the sign of the dividend (C's ``%``, numpy's ``fmod``)."""
    if np.any(b == 0):
        raise ValueError("integer remainder by zero")
    return np.fmod(a, b)


_INTEGER_EXACT: dict[str, Callable] = {  # wrapping on overflow, as XLA does
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _truncated_division,
    "rem": _truncated_remainder,
}
_APPROXIMATE: dict[str, Callable] = {  # floating inputs (see the module docstring)
    **{name: (lambda f: lambda *xs, **_: f(*xs))(f) for name, f in {
        "exp": np.exp,
        "exp2": np.exp2,
        "log": np.log,
        "log1p": np.log1p,
        "expm1": np.expm1,
        "tanh": np.tanh,
        "logistic": special.expit,
        "sin": np.sin,
        "cos": np.cos,
        "lgamma": lambda x: np.where(np.isneginf(x), np.inf, special.gammaln(x)),  # log|Γ(-inf)| = inf, as XLA
        "digamma": lambda x: np.where((x <= 0) & (x == np.floor(x)), np.nan, special.digamma(x)),  # NaN at poles
        "pow": np.power,
        "rsqrt": lambda x: 1.0 / np.sqrt(x),
        "tan": np.tan,
        "atan": np.arctan,
        "atan2": np.arctan2,
        "sinh": np.sinh,
        "cosh": np.cosh,
        "asinh": np.arcsinh,
        "acosh": np.arccosh,
        "atanh": np.arctanh,
        "cbrt": np.cbrt,
        "erf": special.erf,
        "erfc": special.erfc,
        "erf_inv": special.erfinv,
    }.items()},  # their parameters (``accuracy``) ask for no more than numpy's
    "integer_pow": lambda x, *, y: np.power(x, y) if y >= 0 else 1.0 / np.power(x, -y),
    "reduce_sum": lambda x, *, axes, **_: np.sum(x, axis=tuple(axes)),
    "reduce_prod": lambda x, *, axes, **_: np.prod(x, axis=tuple(axes)),
    "cumsum": lambda x, *, axis, reverse: _cumulative(np.cumsum, x, axis, reverse),
    "cumprod": lambda x, *, axis, reverse: _cumulative(np.cumprod, x, axis, reverse),
    "dot_general": lambda lhs, rhs, *, dimension_numbers, **_: _dot_general(lhs, rhs, dimension_numbers),
    "cholesky": lambda x, *, symmetrize_input=False, **_: _cholesky(x, symmetrize_input),
    "triangular_solve": lambda a, b, **params: _triangular_solve(a, b, **params),
}
_EXACT: dict[str, Callable] = {
    "neg": np.negative,
    "abs": np.abs,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "not": np.invert,
    "max": np.maximum,
    "min": np.minimum,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "is_finite": np.isfinite,
    "stop_gradient": lambda x: x,
    "clamp": lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
}


def _select_n(which, *cases):
    out = cases[0]
    for i, case in enumerate(cases[1:], 1):
        out = np.where(which == i, case, out)
    return out


def _broadcast_in_dim(x, *, shape, broadcast_dimensions, **_):
    expanded = [1] * len(shape)
    for axis, size in zip(broadcast_dimensions, x.shape):
        expanded[axis] = size
    return np.broadcast_to(np.reshape(x, expanded), tuple(shape))


def _reshape(x, *, new_sizes, dimensions=None, **_):
    if dimensions is not None:
        raise NotImplementedError("reshape with dimensions: evaluated by XLA instead")
    return np.reshape(x, tuple(new_sizes))


def _iota(*, dtype, shape, dimension, **_):
    index = [1] * len(shape)
    index[dimension] = shape[dimension]
    return np.broadcast_to(np.arange(shape[dimension], dtype=dtype).reshape(index), tuple(shape))


def _slice(x, *, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * len(start_indices)
    return x[tuple(slice(s, e, k) for s, e, k in zip(start_indices, limit_indices, strides))]


def _convert(x, *, new_dtype, **_):
    new_dtype = np.dtype(new_dtype)
    if x.dtype.kind == "f" and new_dtype.kind in "iub":  # NaN and overflow differ
        raise NotImplementedError("float to integer: NaN and overflow differ from XLA; evaluated by XLA instead")
    if new_dtype.kind == "b":
        return x != 0
    return x.astype(new_dtype)


def _gather(operand, indices, *, dimension_numbers, slice_sizes, mode, fill_value=None, **_):
    """XLA's gather (the index vector on the last axis of ``indices``, as JAX writes it).

    Each batch position reads the window of ``slice_sizes`` that starts at its index vector
    (mapped to operand axes by ``start_index_map``; a vmapped gather's operand batching axes
    are at the batch position's own row); out-of-range starts are clamped, or the window is
    ``fill_value`` under ``FILL_OR_DROP``. Collapsed and batching axes are dropped, and the
    window's other axes land at ``offset_dims`` of the output, the batch axes around them.
    """
    dn = dimension_numbers
    batch_shape, sizes, dims = indices.shape[:-1], np.asarray(slice_sizes), np.asarray(operand.shape)
    starts = np.zeros((int(np.prod(batch_shape)), operand.ndim), np.int64)
    starts[:, list(dn.start_index_map)] = np.reshape(indices, (-1, indices.shape[-1]))
    positions = np.reshape(np.indices(batch_shape), (len(batch_shape), len(starts)))  # vmapped: batch i reads
    for axis, batch_axis in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):  # operand row i
        starts[:, axis] = positions[batch_axis]
    outside = np.any((starts < 0) | (starts > dims - sizes), axis=1)
    starts = np.clip(starts, 0, dims - sizes)
    grids = [
        np.reshape(starts[:, d], (-1,) + (1,) * operand.ndim)
        + np.reshape(np.arange(sizes[d]), (1,) + tuple(-1 if e == d else 1 for e in range(operand.ndim)))
        for d in range(operand.ndim)
    ]
    window = operand[tuple(grids)]  # (batch, *slice_sizes)
    if str(mode).endswith("FILL_OR_DROP"):
        fill = _fill_value(operand.dtype, fill_value)
        window = np.where(np.reshape(outside, (-1,) + (1,) * operand.ndim), fill, window)
    window = np.squeeze(window, axis=tuple(1 + d for d in dn.collapsed_slice_dims + dn.operand_batching_dims))
    window = np.reshape(window, batch_shape + window.shape[1:])
    return np.moveaxis(window, list(range(len(batch_shape), window.ndim)), list(dn.offset_dims))


def _fill_value(dtype: Any, fill_value: Any) -> Any:
    """``FILL_OR_DROP``'s value: the given one, else NaN, the most negative or the largest integer."""
    if fill_value is not None:
        return fill_value
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "b":
        return True
    info = np.iinfo(dtype)
    return info.min if dtype.kind == "i" else info.max


def _dynamic_slice(x, *starts, slice_sizes):
    """XLA's dynamic_slice: the window at ``starts``, each clamped so that it fits."""
    starts = [int(np.clip(s, 0, d - n)) for s, d, n in zip(starts, x.shape, slice_sizes)]
    return x[tuple(slice(s, s + n) for s, n in zip(starts, slice_sizes))]


def _dynamic_update_slice(x, update, starts):
    """XLA's dynamic_update_slice: ``update`` written at ``starts``, each clamped so that it fits."""
    starts = [int(np.clip(s, 0, d - n)) for s, d, n in zip(starts, x.shape, update.shape)]
    out = np.array(x, copy=True)
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


def _pad(x, value, config):
    if any(interior or lo < 0 or hi < 0 for lo, hi, interior in config):
        raise NotImplementedError("interior or negative padding: evaluated by XLA instead")
    return np.pad(x, [(lo, hi) for lo, hi, _ in config], constant_values=value)


def _round(x, method):
    if int(method) == 1:  # to nearest even, as numpy
        return np.round(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)  # away from zero


def _cumulative(fn, x, axis, reverse):
    if reverse:
        return np.flip(fn(np.flip(x, axis), axis=axis), axis)
    return fn(x, axis=axis)


def _dot_general(lhs, rhs, dimension_numbers):
    """XLA's dot_general as an einsum: batch axes first, then lhs's free axes, then rhs's."""
    (lc, rc), (lb, rb) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    left = [next(letters) for _ in range(lhs.ndim)]
    right = [next(letters) for _ in range(rhs.ndim)]
    for i, j in zip(tuple(lb) + tuple(lc), tuple(rb) + tuple(rc)):
        right[j] = left[i]
    batch = [left[i] for i in lb]
    free_left = [c for i, c in enumerate(left) if i not in lb and i not in lc]
    free_right = [c for j, c in enumerate(right) if j not in rb and j not in rc]
    return np.einsum(f"{''.join(left)},{''.join(right)}->{''.join(batch + free_left + free_right)}", lhs, rhs)


def _cholesky(x, symmetrize_input):
    if symmetrize_input:
        x = 0.5 * (x + np.swapaxes(x, -1, -2))
    try:
        return np.linalg.cholesky(x)
    except np.linalg.LinAlgError:  # XLA's NaNs where not positive definite
        raise NotImplementedError("not positive definite: evaluated by XLA instead") from None


def _triangular_solve(a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    """``op(a) x = b`` (``left_side``) or ``x op(a) = b`` for one triangular matrix ``a``."""
    from scipy.linalg import solve_triangular  # noqa: PLC0415 - only here

    if a.ndim != 2 or b.ndim != 2:
        raise NotImplementedError("batched triangular solve: evaluated by XLA instead")
    if left_side:
        return solve_triangular(a, b, trans=int(bool(transpose_a)), lower=bool(lower), unit_diagonal=bool(unit_diagonal))
    return solve_triangular(a, b.T, trans=int(not transpose_a), lower=bool(lower), unit_diagonal=bool(unit_diagonal)).T


_STRUCTURAL: dict[str, Callable] = {
    "gather": _gather,
    "dynamic_slice": _dynamic_slice,
    "select_n": _select_n,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": lambda x, *, dimensions: np.squeeze(x, axis=tuple(dimensions)),
    "transpose": lambda x, *, permutation: np.transpose(x, tuple(permutation)),
    "concatenate": lambda *xs, dimension: np.concatenate(xs, axis=dimension),
    "iota": _iota,
    "slice": _slice,
    "convert_element_type": _convert,
    "reduce_max": lambda x, *, axes, **_: np.max(x, axis=tuple(axes)),
    "reduce_min": lambda x, *, axes, **_: np.min(x, axis=tuple(axes)),
    "reduce_and": lambda x, *, axes, **_: np.all(x, axis=tuple(axes)),
    "reduce_or": lambda x, *, axes, **_: np.any(x, axis=tuple(axes)),
    "copy": lambda x: x,
    "copy_p": lambda x: x,
    "stage": lambda x: x,
    "rev": lambda x, *, dimensions: np.flip(x, tuple(dimensions)),
    "stack": lambda *xs, axis: np.stack(xs, axis=axis),
    "pad": lambda x, value, *, padding_config: _pad(x, value, padding_config),
    "dynamic_update_slice": lambda x, update, *starts: _dynamic_update_slice(x, update, starts),
    "round": lambda x, *, rounding_method: _round(x, rounding_method),
    "cummax": lambda x, *, axis, reverse: _cumulative(np.maximum.accumulate, x, axis, reverse),
    "cummin": lambda x, *, axis, reverse: _cumulative(np.minimum.accumulate, x, axis, reverse),
}


def host_bind(eqn: Any, params: dict, invals: list) -> Optional[list]:
    """``eqn``'s primitive on constant ``invals`` in numpy (exact, or within an ulp or two of
    XLA for the functions of ``_APPROXIMATE``), or None where numpy has no such primitive."""
    try:
        xs = [np.asarray(v, dtype=var.aval.dtype) for v, var in zip(invals, eqn.invars)]
        (out_aval,) = [v.aval for v in eqn.outvars]
        dtype, shape = np.dtype(out_aval.dtype), tuple(out_aval.shape)
    except (TypeError, ValueError, AttributeError):  # keys, several outputs, exotic avals
        return None
    out = evaluate(eqn.primitive.name, params, xs, dtype, shape, approximate=True)
    return None if out is None else [out]


def evaluate(
    name: str, params: dict, xs: list, dtype: Any, shape: tuple, *, approximate: bool = False
) -> Optional[np.ndarray]:
    """Primitive ``name`` on numpy ``xs`` (already of the equation's dtypes), or None;
    ``approximate``: also the functions of ``_APPROXIMATE`` (see the module docstring)."""
    keyword = name in _STRUCTURAL
    fn = _EXACT.get(name) or _STRUCTURAL.get(name)
    kinds = {x.dtype.kind for x in xs}
    if fn is None and name in _FLOAT_EXACT and kinds == {"f"}:
        fn = _FLOAT_EXACT[name]
    if fn is None and name in _INTEGER_EXACT and kinds in ({"i"}, {"u"}):
        fn = _INTEGER_EXACT[name]
    if fn is None and approximate and name in _APPROXIMATE and kinds == {"f"} and np.dtype(dtype).kind == "f":
        fn, keyword = _APPROXIMATE[name], True
    if fn is None:
        return None
    try:
        with np.errstate(all="ignore"):  # XLA computes inf and NaN silently
            out = fn(*xs, **params) if keyword else fn(*xs)
    except (NotImplementedError, TypeError, ValueError, IndexError):
        return None
    out = np.array(out, dtype=dtype)  # a fresh contiguous array of the equation's dtype
    return out if out.shape == shape else None


def on_positions(eqn: Any, params: dict, args: list) -> np.ndarray:
    """``eqn``'s primitive run on integer positions (an int32 iota in place of its operand):
    in numpy where :func:`evaluate` has it (exact on integers), else one XLA call."""
    out = evaluate(eqn.primitive.name, params, [np.asarray(a) for a in args], np.int32, tuple(eqn.outvars[0].aval.shape))
    if out is not None:
        return out
    import jax  # noqa: PLC0415 - the rest of this module is numpy only

    return np.asarray(eqn.primitive.bind(*[jax.device_put(a) for a in args], **params))
