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


def needs_values_error(site: str, error: BaseException, where: str) -> "ModelError":
    """A :class:`ModelError` for model code that needs a concrete value where it is traced
    (``error``: JAX's ``TracerArrayConversionError`` and friends; ``where``: what was traced)."""
    return site_error(
        site,
        f"the model's code needs a concrete value where {where} ({type(error).__name__}): e.g. a numpy "
        "array indexed by a plate's indices (X[idx] with X a numpy array) or np.asarray of a latent "
        "value; NumPyro's own jitted inference (NUTS, SVI) refuses the same code",
        "make the model's data jax arrays (jnp.asarray(X)) and use jnp operations on traced values",
    )


class IntegrationWarning(UserWarning):
    """An integrated fit whose grid is not to be trusted (``result.diagnostics.problems`` says why)."""


class RuntimeDeadlock(RuntimeError):
    """The JAX runtime stopped making progress on a computation of a fit.

    Raised by the driver's watchdog (:mod:`blrppl.blr.watchdog`) instead of
    waiting forever; the message names the cause and the workaround
    (``PJRT_NPROC=1``). The process's JAX runtime cannot recover from it.
    """
