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

from numpyro.distributions import Distribution
from numpyro.distributions.distribution import COERCIONS

_TAG = "_blrppl_constructor_call"


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
    obj = type.__call__(cls, *args, **kwargs)
    object.__setattr__(obj, _TAG, ConstructorCall(cls, _bind(cls, args, kwargs), True))
    return obj


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
