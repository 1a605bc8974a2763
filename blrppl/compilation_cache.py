"""Opt-in persistent compilation cache, so that a second process pays no compilation.

JAX can store compiled XLA programs on disk and reuse them in later processes
(``jax_compilation_cache_dir``). blrppl leaves JAX's global configuration alone
unless asked: call :func:`enable_compilation_cache` once, or set the
environment variable ``BLRPPL_COMPILATION_CACHE`` to a directory before
importing blrppl. The command line turns it on by default (``--no-cache``
turns it off).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import jax

ENVIRONMENT_VARIABLE = "BLRPPL_COMPILATION_CACHE"
DEFAULT_DIRECTORY = Path.home() / ".cache" / "blrppl" / "jax"


def enable_compilation_cache(path: Optional[Union[str, os.PathLike]] = None, min_compile_seconds: float = 0.0) -> Path:
    """Store compiled programs under ``path`` and reuse them in later processes.

    Args:
      path: the cache directory (created if missing); None: the environment
        variable ``BLRPPL_COMPILATION_CACHE`` if set, else
        ``~/.cache/blrppl/jax``.
      min_compile_seconds: programs that compile faster than this are not
        stored (JAX's ``jax_persistent_cache_min_compile_time_secs``; its
        default of 1 s would skip most of blrppl's programs).

    Returns:
      The cache directory.
    """
    directory = Path(path or os.environ.get(ENVIRONMENT_VARIABLE) or DEFAULT_DIRECTORY).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def stable_distribution_pytrees() -> None:
    """Flatten numpyro distributions in one order in every process (their fields sorted by name).

    numpyro 0.22 gathers a distribution's pytree fields in a ``set``, whose order follows
    Python's per-process string hashing: a program that takes a distribution as an argument
    (the start's prior, a probe) then has its arguments in another order in another process,
    and its cache key differs, so a second process compiled again about every other time.
    Sorting the names fixes the order; flattening and unflattening both read it, so nothing
    else changes. Idempotent (imported with blrppl).
    """
    from numpyro.distributions.distribution import Distribution

    for name in ("gather_pytree_data_fields", "gather_pytree_aux_fields"):
        gather = getattr(Distribution, name).__func__
        if getattr(gather, "_blrppl_sorted", False):
            continue

        def ordered(cls, _gather=gather):
            return tuple(sorted(_gather(cls)))

        ordered._blrppl_sorted = True
        setattr(Distribution, name, classmethod(ordered))


def enable_from_environment() -> Optional[Path]:
    """Turn the cache on when ``BLRPPL_COMPILATION_CACHE`` names a directory (import time)."""
    if os.environ.get(ENVIRONMENT_VARIABLE):
        return enable_compilation_cache()
    return None
