"""Count XLA compilations inside a block (compile-once guarantees)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import jax


@contextlib.contextmanager
def compilations() -> Iterator[list]:
    """Yield a list that fills with jax's "Compiling ..." messages issued inside the block,
    in every thread (blrppl compiles some programs in threads: ``blrppl.blr.ahead``)."""
    messages: list = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)  # a context manager would set it for this thread only
    try:
        yield messages
    finally:
        jax.config.update("jax_log_compiles", previous)
        logger.removeHandler(handler)
        messages[:] = [m for m in messages if m.startswith("Compiling")]


def compiled_names(messages: list) -> list:
    """The programs' names (``jit(_chunk)``) in :func:`compilations`' messages."""
    return [m.split()[1] for m in messages]


def cheap_jit(fun=None, **jit_kwargs):
    """``jax.jit`` with blrppl's cheap XLA:CPU settings, for a test's program that runs once
    (compiled fully optimised, such programs cost seconds to compile and microseconds to run).
    Use as ``@cheap_jit``, ``@partial(cheap_jit, static_argnames=...)`` or ``cheap_jit(f)``."""
    from blrppl.compile_mode import fast_cpu_options

    if fun is None:
        return lambda f: cheap_jit(f, **jit_kwargs)
    return jax.jit(fun, compiler_options=fast_cpu_options(), **jit_kwargs)
