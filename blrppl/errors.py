"""Errors raised for models blrppl cannot run, with the site, the problem and the fix."""

from __future__ import annotations


class ModelError(ValueError):
    """A model blrppl cannot run.

    The message always has the form ``site 'x': <what is wrong>; <what to do>.``
    and is raised from Python, before anything is jit-compiled.
    """


def site_error(site: str, problem: str, remedy: str) -> ModelError:
    """Build a :class:`ModelError` in the house format.

    Example:
        >>> str(site_error("y", "observations contain NaN", "drop or mask them"))
        "site 'y': observations contain NaN; drop or mask them."
    """
    return ModelError(f"site {site!r}: {problem}; {remedy}.")


class IntegrationWarning(UserWarning):
    """An integrated fit whose grid is not to be trusted (``result.diagnostics.problems`` says why)."""


class RuntimeDeadlock(RuntimeError):
    """The JAX runtime stopped making progress on a computation of a fit.

    Raised by the driver's watchdog (:mod:`blrppl.blr.watchdog`) instead of
    waiting forever; the message names the cause and the workaround
    (``PJRT_NPROC=1``). The process's JAX runtime cannot recover from it.
    """
