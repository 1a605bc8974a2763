"""The values the symbolic interpreter holds, and small tests on them.

While :mod:`blrppl.symbolic.interpret` walks a jaxpr, each variable holds
either a constant (a numpy array, or a PRNG key), a symbolic array
(:class:`~blrppl.symbolic.terms.Poly`), or a :class:`Poisoned` value that may
be carried along but must never be used. The interpreter's rule modules share
these helpers, and :func:`int_params`, which reruns a primitive on integer
positions instead of its data (index remapping).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Poly, Term, VarAtom, constant


class Poisoned:
    """A value that must be discarded (e.g. ``z + K`` in index normalisation).

    Args:
      var: the variable it was computed from.
      reason: why it cannot be used (the non-conjugacy reason if it is).
    """

    def __init__(self, var: str | None, reason: str):
        self.var = var
        self.reason = reason


def unsupported(name: str, var: str | None) -> NonConjugate:
    """The non-conjugacy of primitive ``name`` applied to a random value of ``var``."""
    return NonConjugate(
        var, f"the primitive {name!r} applied to {var!r} is not supported by the symbolic interpreter"
    )


def is_key(value: Any) -> bool:
    """Whether ``value`` is a concrete array of PRNG keys."""
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` depends on a latent variable (a Poly or a Poisoned value)."""
    return isinstance(value, (Poly, Poisoned))


def as_poly(value: Any, space: Labels) -> Poly:
    """``value`` as a Poly (a constant becomes one).

    Raises:
      NonConjugate: for a :class:`Poisoned` value.
    """
    if isinstance(value, Poisoned):
        raise NonConjugate(value.var, value.reason)
    if isinstance(value, Poly):
        return value
    return constant(tape.asarray(value), space)


def first_var(value: Any) -> str | None:
    """The first (sorted) variable ``value`` depends on, to name in a reason."""
    if isinstance(value, Poisoned):
        return value.var
    if isinstance(value, Poly):
        names = sorted(value.variables)
        return names[0] if names else None
    return None


def is_categorical(value: Any) -> bool:
    """Whether ``value`` is exactly a categorical latent's value (an index)."""
    return (
        isinstance(value, Poly)
        and len(value.terms) == 1
        and len(value.terms[0].atoms) == 1
        and value.terms[0].atoms[0].kind == "cat"
        and not value.terms[0].operands
        and value.terms[0].coeff == 1.0
        and not value.selectors
    )


def categorical_variable(name: str, shape: tuple[int, ...], space: Labels) -> Poly:
    """The value of a categorical latent: an integer index, enumerated on use."""
    labels = tuple(space.new(n) for n in shape)
    atom = VarAtom(name, "cat", tuple(Index((lab,)) for lab in labels), sizes=tuple(shape))
    return Poly(tuple(shape), labels, (Term(1.0, (), (atom,)),))


def int_params(name: str, params: dict) -> dict:
    """Parameters to rerun primitive ``name`` on int32 positions instead of its data.

    Index remapping runs a structural primitive on an integer iota; a
    ``preferred_element_type`` is dropped, and a gather fills out-of-bounds
    reads with ``-1`` (a structural zero).
    """
    params = dict(params)
    if "preferred_element_type" in params:
        params["preferred_element_type"] = None
    if name == "gather":
        params["fill_value"] = -1
    return params
