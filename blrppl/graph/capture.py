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
import inspect
from typing import Any, Iterator

from numpyro.distributions import Distribution, MultivariateNormal
from numpyro.distributions.distribution import COERCIONS

_TAG = "_blrppl_constructor_call"
_ARGUMENTS_ONLY: list[bool] = []


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
    obj = type.__call__(cls, *args, **kwargs)
    object.__setattr__(obj, _TAG, ConstructorCall(cls, bound, True))
    return obj


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
