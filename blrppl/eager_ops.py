"""Planning's eager operations compiled with cheap settings on a CPU.

Planning runs the model's code eagerly on the host (its first trace, with
NumPyro's argument checks) and evaluates constant parts of it. JAX runs each
eager primitive as a program of its own, compiled once per operation, shape
and dtype with XLA's default settings: 35-60 ms each on XLA:CPU, and a first
call meets a few (a linear regression) to a few dozen (a Gaussian mixture)
of them. A one-operation program gains nothing from LLVM's optimisations;
with ``FAST_CPU_OPTIONS`` it compiles in 10-25 ms.

Inside :func:`cheap_eager_ops`, an eager primitive on a CPU whose operands
hold at most ``CHEAP_OPERAND_BYTES`` runs as a program compiled with those
settings, cached apart from JAX's own (so planning computes the same bits
whichever programs the process compiled before). So does an eager call of a
jitted function, such as the ``jax.numpy`` functions that are jitted as a
whole (``jnp.add``, ``jnp.matmul``), unless it sets compiler options of its
own; its program is kept out of jit's fast path, which would otherwise serve
it to the user's own eager calls after planning. Larger operands, other
devices, compile mode ``"optimized"`` and anything outside the context or
inside a trace go through JAX's dispatch unchanged. Results agree with JAX's to the
last bit or two (LLVM level 0 fuses no multiply-adds).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Iterator, Optional

import jax

from blrppl import compile_mode, host_ops

CHEAP_OPERAND_BYTES = 1 << 22
"""Operands of at most this many bytes (4 MiB) take the cheap settings: an unoptimised
elementwise pass over them costs a few milliseconds, less than the compilation saved."""

_ACTIVE = contextvars.ContextVar("blrppl_cheap_eager_ops", default=False)
_LOCK = threading.Lock()
_ORIGINAL: dict = {}


def cheap_eager_ops() -> contextlib.AbstractContextManager:
    """Within this context, small eager primitives on a CPU compile with ``FAST_CPU_OPTIONS``."""
    return switched_on(_ACTIVE, _install)


@contextlib.contextmanager
def switched_on(flag: contextvars.ContextVar, install: Callable[[], None]) -> Iterator[None]:
    """``flag`` set while the context lasts (in this thread and context), after ``install()``:
    the pattern of planning's hooks on JAX's eager dispatch (here and :mod:`blrppl.eager_loops`)."""
    install()
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def options_for(args: tuple) -> Optional[dict]:
    """``FAST_CPU_OPTIONS`` for an eager program over ``args`` inside :func:`cheap_eager_ops`
    (see the module docstring), else None: XLA's defaults."""
    if not _ACTIVE.get() or compile_mode.compile_mode() == "optimized" or not _small_on_cpu(args):
        return None
    return compile_mode.fast_cpu_options()


def _install() -> None:
    """Route JAX's eager dispatch through :func:`_routed` (once per process).

    JAX 0.10 runs an eager primitive by ``dispatch.apply_primitive``, which takes its program
    from the module-level ``xla_primitive_callable``; where that hook is missing (another JAX)
    nothing is installed and every operation compiles as JAX would.
    """
    if _ORIGINAL:
        return
    from jax._src import dispatch  # jax is pinned below 0.11

    with _LOCK:
        original = getattr(dispatch, "xla_primitive_callable", None)
        if _ORIGINAL or original is None or not callable(getattr(dispatch, "apply_primitive", None)):
            return
        _ORIGINAL["callable"] = original
        dispatch.xla_primitive_callable = _routed(original)
        from jax._src import pjit  # jax is pinned below 0.11

        jitted = getattr(pjit, "_pjit_call_impl_python", None)
        if callable(jitted):
            _ORIGINAL["jitted"] = jitted
            pjit._pjit_call_impl_python = _routed_jit(jitted)


def _routed(original: Callable) -> Callable:
    def xla_primitive_callable(prim: Any, **params: Any) -> Callable:
        if not _ACTIVE.get() or compile_mode.compile_mode() == "optimized":
            return original(prim, **params)
        try:
            cheap = _cheap_callable(prim, **params)
        except TypeError:  # parameters that do not hash: JAX's own cache refuses them too
            return original(prim, **params)

        def call(*args: Any) -> Any:
            if not _small_on_cpu(args):
                return original(prim, **params)(*args)
            on_host = host_ops.evaluate(prim, params, args)  # numpy: nothing compiles
            return cheap(*args) if on_host is None else on_host

        return call

    return xla_primitive_callable


def _routed_jit(original: Callable) -> Callable:
    """JAX's eager call of a jitted function (``jnp.add``, ``jnp.matmul``: jitted as a whole), compiled
    with ``FAST_CPU_OPTIONS`` inside :func:`cheap_eager_ops` when its arguments are small and on a
    CPU and it asks for no options of its own. The compiled program is not handed back for jit's
    fast path, so it serves planning's calls only: outside planning, the same function compiles
    and runs as JAX would."""

    def call(*args: Any, **params: Any) -> Any:
        if (
            not _ACTIVE.get()
            or params.get("compiler_options_kvs")
            or compile_mode.compile_mode() == "optimized"
            or not _small_on_cpu(args)
        ):
            return original(*args, **params)
        on_host = host_ops.evaluate_call(params["jaxpr"], args)  # numpy: nothing compiles
        if on_host is not None:
            return on_host, None, None, []
        params["compiler_options_kvs"] = tuple(compile_mode.fast_cpu_options().items())
        out, _, profiler, const_args = original(*args, **params)
        return out, None, profiler, const_args

    return call


def _small_on_cpu(args: tuple) -> bool:
    leaves = jax.tree.leaves(args)
    if not compile_mode._on_cpu(leaves):
        return False
    return sum(compile_mode._nbytes(leaf) for leaf in leaves) <= CHEAP_OPERAND_BYTES


@functools.lru_cache(maxsize=4096)
def _cheap_callable(prim: Any, **params: Any) -> Callable:
    """As JAX's ``xla_primitive_callable``, compiled with ``FAST_CPU_OPTIONS``."""
    from jax._src import config  # jax is pinned below 0.11

    def prim_fun(*args: Any) -> Any:
        with config.eager_constant_folding(False):
            return prim.bind(*args, **params)

    prim_fun.__name__ = prim.name
    prim_fun.__qualname__ = prim.name
    prim_fun._apply_primitive = True  # as JAX marks its own (named in debug_nans messages)
    return jax.jit(prim_fun, compiler_options=compile_mode.fast_cpu_options())
