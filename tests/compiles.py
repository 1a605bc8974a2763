"""Count XLA compilations inside a block (compile-once guarantees)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import jax


@contextlib.contextmanager
def compilations() -> Iterator[list]:
    """Yield a list that fills with jax's "Compiling ..." messages issued inside the block."""
    messages: list = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield messages
    finally:
        logger.removeHandler(handler)
        messages[:] = [m for m in messages if m.startswith("Compiling")]
