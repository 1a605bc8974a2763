"""Capture the arguments users pass to numpyro distribution constructors.

Some numpyro constructors transform their arguments when they are built:
``MultivariateNormal(precision_matrix=W)`` stores ``scale_tril`` (a Cholesky
and triangular solves), ``Categorical(probs=p)`` may be turned into logits,
and so on. The exact (symbolic) estimator needs the arguments as the user
wrote them, so while a model is traced every distribution built is tagged
with ``(cls, args, kwargs)`` through numpyro's ``COERCIONS`` hook (the same
hook numpyro's funsor integration uses).

The tag does not survive a round trip through a JAX pytree (numpyro's
``tree_unflatten`` rebuilds objects attribute by attribute; this happens to
sites inside ``numpyro.contrib.control_flow.scan``): :func:`constructor_call`
then falls back to the distribution's stored parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from typing import Any, Iterator

import jax
import numpy as np
from numpyro.distributions import Distribution, MultivariateNormal, constraints
from numpyro.distributions.distribution import COERCIONS, validation_enabled

_TAG = "_blrppl_constructor_call"
_ARGUMENTS_ONLY: list[bool] = []
_HOST_CHECKS: list[bool] = []  # numpyro's validation is on, and _coerce does it on the host


@dataclasses.dataclass(frozen=True)
class ConstructorCall:
    """A distribution constructor call: ``cls(**arguments)``.

    ``arguments`` binds positional and keyword arguments to parameter names
    (defaults left out), so ``Normal(0.0, 2.0)`` and ``Normal(scale=2.0)`` read
    the same way. Values are whatever the model passed: arrays, tracers or
    other distributions (wrappers such as ``Independent`` hold their base).
    """

    cls: type
    arguments: dict[str, Any]
    captured: bool  # False when rebuilt from stored attributes (lost tag)


def _bind(cls: type, args: tuple, kwargs: dict) -> dict[str, Any]:
    try:
        bound = inspect.signature(cls).bind_partial(*args, **kwargs)
    except TypeError:
        return dict(kwargs, **{f"arg{i}": a for i, a in enumerate(args)})
    return dict(bound.arguments)


def _coerce(cls: type, args: tuple, kwargs: dict) -> Distribution:
    bound = _bind(cls, args, kwargs)
    if _ARGUMENTS_ONLY and issubclass(cls, MultivariateNormal) and _matrix_argument(bound) is not None:
        # Only the arguments are read: skip the Cholesky factorisation (and its
        # derivatives, when the caller differentiates through the model).
        loc = bound.get("loc", 0.0)
        obj = type.__call__(cls, loc, scale_tril=_matrix_argument(bound), validate_args=False)
        object.__setattr__(obj, _TAG, ConstructorCall(cls, bound, True))
        return obj
    if _validates_on_host(cls, args, kwargs):
        # numpyro's argument validation evaluates every constraint with eager jnp
        # calls (each new shape compiles a small program: an eigh for a covariance
        # matrix); on concrete arguments the same checks run in numpy.
        _HOST_CHECKS.append(True)
        try:
            with validation_enabled(False):
                obj = _construct(cls, bound, args, kwargs)
        finally:
            _HOST_CHECKS.pop()
        _validate_args_on_host(obj)
    else:
        obj = _construct(cls, bound, args, kwargs)
    object.__setattr__(obj, _TAG, ConstructorCall(cls, bound, True))
    return obj


def _construct(cls: type, bound: dict, args: tuple, kwargs: dict) -> Distribution:
    """``cls(*args, **kwargs)``; a ``MultivariateNormal`` of a concrete matrix as one compiled program.

    numpyro factorises the matrix in the constructor (a Cholesky and triangular solves
    over every batch element). Run eagerly, each of those operations compiles a program
    of its own and runs alone: 2.4 s for a mixture's ``MultivariateNormal(mu[z],
    precision_matrix=lam[z])`` over 100,000 rows, 0.1-0.25 s as one program.
    """
    if not (issubclass(cls, MultivariateNormal) and _matrix_argument(bound) is not None):
        return type.__call__(cls, *args, **kwargs)
    leaves, treedef = jax.tree.flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves) or not positions:
        return type.__call__(cls, *args, **kwargs)

    def build(*arrays: Any) -> Distribution:
        full = list(leaves)
        for i, array in zip(positions, arrays):
            full[i] = array
        inner_args, inner_kwargs = jax.tree.unflatten(treedef, full)
        return type.__call__(cls, *inner_args, **inner_kwargs)

    from blrppl.compile_mode import probe  # compile_mode imports nothing of the graph

    return probe(build)(*[leaves[i] for i in positions])


def _validates_on_host(cls: type, args: tuple, kwargs: dict) -> bool:
    """Whether numpyro would validate this construction's arguments, and they are concrete."""
    if kwargs.get("validate_args") is not None or not (_HOST_CHECKS or Distribution._validate_args):
        return False
    if _init_reads_validation(cls):
        return False
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs)))


@functools.lru_cache(maxsize=None)
def _init_reads_validation(cls: type) -> bool:
    """A constructor that checks more than its arguments when validation is on."""
    try:
        return "_validate_args" in inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return True


def _validate_args_on_host(obj: Distribution) -> None:
    """numpyro's ``Distribution.validate_args`` with the constraints evaluated in numpy.

    An argument is valid when its constraint holds everywhere, so an
    ``independent`` constraint is checked as its base constraint.
    """
    for param, value in obj.get_args().items():
        constraint = obj.arg_constraints[param]
        if constraints.is_dependent(constraint):
            continue
        host = _host_array(value)
        if host is not None and host.dtype.kind in "biuf":
            while isinstance(constraint, constraints._IndependentConstraint):
                constraint = constraint.base_constraint
            value = host
        if not np.all(np.asarray(constraint(value))):
            raise ValueError(f"{type(obj).__name__} distribution got invalid {param} parameter.")


def _matrix_argument(bound: dict) -> Any:
    for name in ("covariance_matrix", "precision_matrix", "scale_tril"):
        if bound.get(name) is not None:
            return bound[name]
    return None


@contextlib.contextmanager
def arguments_only() -> Iterator[None]:
    """Within this context, a ``MultivariateNormal`` built from a matrix is not
    factorised: the object carries the matrix as its ``scale_tril`` (wrong as a
    distribution) and its true constructor call. For code that reads only the
    captured arguments (:func:`constructor_call`), e.g. a Gaussian process's
    kernel matrix as a function of its hyperparameters."""
    _ARGUMENTS_ONLY.append(True)
    try:
        yield
    finally:
        _ARGUMENTS_ONLY.pop()


@contextlib.contextmanager
def capturing_constructors() -> Iterator[None]:
    """Within this context, every numpyro distribution built records its call."""
    COERCIONS.append(_coerce)
    try:
        yield
    finally:
        COERCIONS.remove(_coerce)


def constructor_call(fn: Distribution) -> ConstructorCall:
    """The call that built ``fn``: captured if tagged, else from its parameters."""
    call = getattr(fn, _TAG, None)
    if call is not None:
        return call
    names = list(getattr(type(fn), "arg_constraints", {}))
    arguments = {}
    for k in names:
        if k in fn.__dict__:
            arguments[k] = fn.__dict__[k]
            continue
        try:  # A parameter numpyro derives lazily (Wishart's, MVN's other forms).
            arguments[k] = getattr(fn, k)
        except Exception:  # noqa: BLE001 - not available in this parametrisation
            continue
    for wrapped in ("base_dist",):
        if wrapped in fn.__dict__:
            arguments[wrapped] = fn.__dict__[wrapped]
    return ConstructorCall(type(fn), arguments, False)


def _host_array(value: Any) -> Any:
    """``value`` as a numpy array, or None (not an array, or a PRNG key)."""
    if not isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, bool)):
        return None
    try:
        return np.asarray(value)
    except TypeError:
        return None
