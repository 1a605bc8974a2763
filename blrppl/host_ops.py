"""Planning's small eager operations evaluated with numpy: nothing compiles.

Planning runs the model's code eagerly on the host (its first trace) and
NumPyro's constructors with it. Each eager ``jnp`` operation of a new shape
is a program JAX compiles (10-25 ms each with :mod:`blrppl.eager_ops`' cheap
settings): the GP's kernel matrix costs 16 of them, UCBadmit's first call
about 45, most of a second. On operands this small numpy computes the same
values in microseconds.

:func:`evaluate` applies a primitive to concrete operands with numpy where
the symbolic interpreter's rules cover it (:mod:`blrppl.graph.host`:
elementwise arithmetic, comparisons, casts, shape operations, reductions,
``dot_general``, slices, gathers, Cholesky factors and triangular solves; a
jitted function, such as ``jnp.add``, by its jaxpr, equation by equation),
with the dtype, shape and weak type JAX's own abstract evaluation gives;
a short ``scan`` (NumPyro's ``scan`` over a time series, whose body splits its
PRNG key at every step) by its body, step by step (:func:`_scan`; the keys by
:mod:`blrppl.host_prng`); anything else (random bits, scatters, sorts, while loops, float-to-integer casts, other primitives
with several outputs, a parameter a rule does not know) returns None, and the
caller compiles it as JAX would. Values agree with XLA's to
the last bit or two (transcendental functions round differently), as
:mod:`blrppl.eager_ops`' cheap compilation already does, and so do XLA's
conventions (lgamma(-inf) = inf; digamma is NaN at its poles), except for
subnormal numbers, which XLA:CPU flushes to zero in some operations (sign,
floor, log, tanh...) and not in others, and numpy never does.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np

from blrppl import compile_mode, host_prng
from blrppl.graph import host

MAX_OPERAND_BYTES = 1 << 20
"""Operands of at most this many bytes in all are evaluated with numpy (beyond, XLA's
multi-threaded loops win, and its compilation is a smaller share)."""


class _Unsupported(Exception):
    """An equation no rule covers: the caller compiles the operation."""


MAX_SCAN_EQUATIONS = 4096
"""Most equations a ``scan`` may run in all (its length times its body's) to be evaluated
with numpy: a few microseconds each, against 50-80 ms for compiling the loop."""

#: Primitives with several outputs (``jnp.unstack``, ``jnp.split``).
_SEVERAL_OUTPUTS = {
    "unstack": lambda x, *, axis: [np.take(x, i, axis=axis) for i in range(np.shape(x)[axis])],
    "split": lambda x, *, sizes, axis: np.split(x, np.cumsum(sizes)[:-1], axis=axis),
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
        values = [_host_value(a) for a in args]
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
            outputs = _run_jaxpr(closed.jaxpr, closed.consts, [_host_value(a) for a in args])
    except Exception:  # noqa: BLE001 - an equation no rule covers
        return None
    return [_to_device(_typed(o, v.aval), v.aval) for o, v in zip(outputs, closed.jaxpr.outvars)]


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
    return sum(8 if host_prng.is_key(leaf) else compile_mode._nbytes(leaf) for leaf in leaves) <= MAX_OPERAND_BYTES


def _apply(prim: Any, params: dict, values: list, avals: list, out_avals: Optional[list] = None) -> tuple[list, list]:
    """Numpy values and abstract values of the primitive's outputs (raises where unsupported);
    ``out_avals``: the latter, where the caller knows them (a jaxpr's equation).

    The rules are the symbolic interpreter's (:func:`blrppl.graph.host.evaluate`: exact
    arithmetic and index operations, and the common transcendental functions, sums, products
    and linear algebra within an ulp or two of XLA)."""
    call = _CALLS.get(prim.name)
    if call is not None:
        closed = params[call]
        outputs = _run_jaxpr(closed.jaxpr, closed.consts, values)
        out_avals = [v.aval for v in closed.jaxpr.outvars]
        return [_typed(o, a) for o, a in zip(outputs, out_avals)], out_avals
    if prim.name == "scan":
        return _scan(params, values)
    if out_avals is None:
        out = prim.abstract_eval(*avals, **params)[0]
        out_avals = list(out) if prim.multiple_results else [out]
    if prim.name in host_prng.OPERATIONS:
        return host_prng.apply(prim.name, params, values), out_avals
    if prim.name in _SEVERAL_OUTPUTS and not _has_sharding(params):
        outputs = _SEVERAL_OUTPUTS[prim.name](*values, **params)
        return [np.asarray(o, a.dtype) for o, a in zip(outputs, out_avals)], out_avals
    if prim.multiple_results or _has_sharding(params):
        raise _Unsupported(prim.name)
    out_aval = out_avals[0]
    xs = [np.asarray(v, dtype=a.dtype) for v, a in zip(values, avals)]
    out = host.evaluate(prim.name, params, xs, out_aval.dtype, tuple(out_aval.shape), approximate=True)
    if out is None:
        raise _Unsupported(prim.name)
    return [out], [out_aval]


def _scan(params: dict, values: list) -> tuple[list, list]:
    """``lax.scan`` by its body, one step after another (``MAX_SCAN_EQUATIONS`` at most).

    NumPyro runs a model's ``scan`` eagerly while planning traces it (its sites' example
    values), and JAX would compile the loop for that one call: 50-80 ms for each of the two
    or three loops of an HMM or a state-space model. The body's equations whose outputs
    the loop does not use (the second half of NumPyro's key split) are left out."""
    closed, length = params["jaxpr"], params["length"]
    num_consts, num_carry = params["num_consts"], params["num_carry"]
    body = _used_equations(closed.jaxpr)
    if length * len(body) > MAX_SCAN_EQUATIONS or params.get("_split_transpose"):
        raise _Unsupported("scan")
    consts, carry, xs = values[:num_consts], values[num_consts:num_consts + num_carry], values[num_consts + num_carry:]
    if any(not isinstance(x, np.ndarray) for x in xs):
        raise _Unsupported("scan over keys")
    out_avals = [v.aval for v in closed.jaxpr.outvars]
    ys = []
    for i in reversed(range(length)) if params["reverse"] else range(length):
        outputs = _run_jaxpr(closed.jaxpr, closed.consts, consts + carry + [x[i] for x in xs], body)
        carry = [_typed(o, a) for o, a in zip(outputs[:num_carry], out_avals)]
        ys.append(outputs[num_carry:])
    if params["reverse"]:
        ys.reverse()
    y_avals = [a.update(shape=(length, *a.shape)) for a in out_avals[num_carry:]]
    stacked = [np.stack([np.asarray(y[j], a.dtype) for y in ys]) if ys else np.zeros(a.shape, a.dtype)
               for j, a in enumerate(y_avals)]
    return carry + stacked, out_avals[:num_carry] + y_avals


def _used_equations(jaxpr: Any) -> list:
    """``jaxpr``'s equations that its outputs read (directly or not), in order: the others
    (here NumPyro's unused half of each key split) have no effect on the loop."""
    needed = {v for v in jaxpr.outvars if not hasattr(v, "val")}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in needed for v in eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if not hasattr(v, "val"))
    return kept[::-1]


def _host_value(value: Any) -> Any:
    """A numpy array of ``value``, or a key array's :class:`~blrppl.host_prng.HostKey`."""
    return host_prng.from_jax(value) if host_prng.is_key(value) else np.asarray(value)


def _typed(value: Any, aval: Any) -> Any:
    """``value`` as a numpy array of ``aval``'s dtype (a host key as it is)."""
    return value if isinstance(value, host_prng.HostKey) else np.asarray(value, aval.dtype)


def _has_sharding(params: dict) -> bool:
    """A parameter placing the result on devices (a rule would drop it); an abstract sharding
    over no mesh axes (what ``jnp.asarray`` records outside a mesh) places nothing."""
    for name in ("sharding", "out_sharding"):
        sharding = params.get(name)
        if sharding is not None and not getattr(getattr(sharding, "mesh", None), "empty", False):
            return True
    return False


def _run_jaxpr(jaxpr: Any, consts: list, args: list, eqns: Optional[list] = None) -> list:
    """The jaxpr's outputs, every equation (of ``eqns``, default all) by :func:`_apply` (numpy
    values throughout)."""
    env: dict = {}

    def read(var: Any) -> Any:
        if hasattr(var, "val"):  # a literal
            return np.asarray(var.val, var.aval.dtype)
        return env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = _host_value(value)
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns if eqns is None else eqns:
        if eqn.effects:
            raise _Unsupported("effects")
        values = [read(v) for v in eqn.invars]
        outputs, _ = _apply(eqn.primitive, eqn.params, values, [v.aval for v in eqn.invars], [v.aval for v in eqn.outvars])
        for var, value in zip(eqn.outvars, outputs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _to_device(value: np.ndarray, aval: Any) -> jax.Array:
    """A JAX array of ``aval``'s type (its weak type included) holding ``value`` (a key array for a host key)."""
    if isinstance(value, host_prng.HostKey):
        return host_prng.to_jax(value)
    from jax._src import core  # jax is pinned below 0.11
    from jax._src.interpreters import pxla

    device, sharding = compile_mode._default_placement()
    value = np.asarray(value, dtype=aval.dtype, order="C")  # (ascontiguousarray makes a scalar 1-d)
    typed = core.ShapedArray(value.shape, value.dtype, weak_type=getattr(aval, "weak_type", False))
    return pxla.batched_device_put(typed, sharding, [value], [device], committed=False)
