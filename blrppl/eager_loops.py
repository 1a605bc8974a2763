"""Eager loops in planning, compiled once per structure rather than once per run.

Planning runs the model's code eagerly (its host trace) and evaluates constant
parts of it (the symbolic analysis). Each eager ``jnp`` operation is one small
program that JAX compiles once per shape and reuses, but an eager
``lax.scan`` or ``while_loop`` (``numpyro.contrib.control_flow.scan``, a
``fori_loop`` in the model) carries its body as a freshly traced jaxpr, which
JAX's cache compares by identity: every plan compiled every loop again
(0.15 s each; three per plan of the Nile local level, so 0.7 s for a second
call on new data whose compiled fit takes 14 ms).

Inside :func:`loops_compiled_once`, an eager ``scan`` or ``while`` is looked
up by its printed parameters (the body's equations, shapes and literals) and
its arguments' types, and runs the program compiled for the first loop of
that structure (with cheap settings where :func:`blrppl.eager_ops.options_for`
says so). A short ``scan`` with small operands is not compiled at all: it runs
its body step by step in numpy (:func:`blrppl.host_ops.evaluate`). A body whose text does not determine it (constants closed
over outside its arguments, a Python callback, an object printed by address)
is compiled as JAX would. Outside the context, and inside any trace, the
primitives behave exactly as JAX's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Optional

import jax
from jax.extend.core import ClosedJaxpr
from jax.extend.core import primitives as _primitives

from blrppl import host_ops
from blrppl.compile_mode import recently_used
from blrppl.eager_ops import cheap_eager_ops, options_for, switched_on

_ACTIVE = contextvars.ContextVar("blrppl_loops_compiled_once", default=False)
_PROGRAMS: dict = {}
_MAX_PROGRAMS = 256
_LOCK = threading.Lock()
_INSTALLED: dict = {}
_PRIMITIVES = ("scan_p", "while_p")


def loops_compiled_once() -> contextlib.AbstractContextManager:
    """Within this context, eager ``scan`` and ``while`` loops compile once per structure."""
    return switched_on(_ACTIVE, _install)


def _install() -> None:
    if _INSTALLED:
        return
    with _LOCK:
        for name in _PRIMITIVES:
            primitive = getattr(_primitives, name, None)
            if primitive is None or name in _INSTALLED:
                continue
            _INSTALLED[name] = primitive.impl
            primitive.def_impl(_structural_impl(primitive, primitive.impl))


def _structural_impl(primitive: Any, original: Callable) -> Callable:
    def impl(*args: Any, **params: Any) -> Any:
        key = _ACTIVE.get() and _key(primitive, args, params)
        if not key:
            return original(*args, **params)
        options = options_for(args)  # cheap settings for small loops on a CPU (blrppl.eager_ops)
        if options is not None:  # a short scan is run by its body in numpy: nothing compiles
            on_host = host_ops.evaluate(primitive, params, args)
            if on_host is not None:
                return on_host
        key = key + (options is not None,)
        with _LOCK:
            program = recently_used(
                _PROGRAMS, key, lambda: jax.jit(_bind(primitive, params), compiler_options=options), _MAX_PROGRAMS
            )
        with jax.disable_jit(False):  # as JAX's own eager dispatch: never the Python body again
            return program(*args)

    return impl


def _bind(primitive: Any, params: dict) -> Callable:
    def run(*args: Any) -> Any:
        return primitive.bind(*args, **params)

    return run


def _key(primitive: Any, args: tuple, params: dict) -> Optional[tuple]:
    """The loop's structure as text, or None where the text does not determine the loop."""
    parts = []
    for name in sorted(params):
        value = params[name]
        if isinstance(value, ClosedJaxpr) and value.consts:
            return None
        text = str(value)
        if " at 0x" in text or "callback" in text:
            return None
        parts.append((name, text))
    types = []
    for arg in args:
        aval = getattr(arg, "aval", None)
        if aval is None:
            return None
        types.append(str(aval) + ("~" if getattr(aval, "weak_type", False) else ""))
    return (primitive.name, tuple(parts), tuple(types))


def with_loops_compiled_once(fun: Callable) -> Callable:
    """``fun`` run inside :func:`loops_compiled_once` and
    :func:`~blrppl.eager_ops.cheap_eager_ops` (for planning entry points)."""

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with loops_compiled_once(), cheap_eager_ops():
            return fun(*args, **kwargs)

    return wrapped
