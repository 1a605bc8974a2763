"""Arithmetic rules of the symbolic interpreter: one function per primitive.

Each rule takes the interpreter (for its label space), the equation and the
equation's input values, of which at least one is symbolic, and returns the
output value, a :class:`~blrppl.symbolic.terms.Poly` computed with
:mod:`blrppl.symbolic.algebra`. A rule raises
:class:`~blrppl.symbolic.terms.NonConjugate` where the result would not be a
polynomial in sufficient statistics, naming the variable and the reason.
Rules on categorical indices live in :mod:`blrppl.symbolic.categorical`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from blrppl.graph import tape
from blrppl.symbolic import algebra
from blrppl.symbolic.terms import NonConjugate, Poly, constant
from blrppl.symbolic.values import Poisoned, as_poly, first_var, is_categorical, is_symbolic, unsupported


def _add(interp: Any, eqn: Any, x: Any, y: Any) -> Any:
    if is_categorical(x) or is_categorical(y):
        var = first_var(x if is_categorical(x) else y)
        return Poisoned(var, f"arithmetic on the categorical index {var!r}")
    return algebra.add(as_poly(x, interp.space), as_poly(y, interp.space), interp.space)


def _sub(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    return algebra.sub(as_poly(x, interp.space), as_poly(y, interp.space), interp.space)


def _mul(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    return algebra.mul(as_poly(x, interp.space), as_poly(y, interp.space), interp.space)


def _neg(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.neg(as_poly(x, interp.space))


def _div(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    space = interp.space
    x = as_poly(x, space)
    if is_symbolic(y):
        return algebra.mul(x, algebra.power(as_poly(y, space), -1, space), space)
    return algebra.mul(x, constant(1.0 / tape.asarray(y, float), space), space)


def _integer_pow(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.power(as_poly(x, interp.space), eqn.params["y"], interp.space)


def _square(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.power(as_poly(x, interp.space), 2, interp.space)


def _sqrt(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.power(as_poly(x, interp.space), 0.5, interp.space)


def _rsqrt(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.power(as_poly(x, interp.space), -0.5, interp.space)


def _pow(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    if is_symbolic(y):
        var = first_var(y)
        raise NonConjugate(var, f"a power with the random exponent {var!r}")
    exponent = np.asarray(y)
    if exponent.size != 1 and not np.all(exponent == exponent.flat[0]):
        raise NonConjugate(first_var(x), "an elementwise-varying power of a random value")
    return algebra.power(as_poly(x, interp.space), float(exponent.flat[0]), interp.space)


def _log(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.log(as_poly(x, interp.space), interp.space)


def _exp(interp: Any, eqn: Any, x: Any) -> Poly:
    """exp(c x + b) as an ``exp`` atom, which a log turns back into x (a log-normal prior on the
    log scale); anything else is the primitive's non-conjugacy, as before."""
    out = algebra.exp(as_poly(x, interp.space))
    if out is None:
        raise unsupported("exp", first_var(x))
    return out


def _log1p(interp: Any, eqn: Any, x: Any) -> Poly:
    space = interp.space
    one = constant(np.ones(()), space)
    return algebra.log(algebra.add(one, as_poly(x, space), space), space)


def _same_value(interp: Any, eqn: Any, x: Any) -> Any:
    """``convert_element_type``, ``reduce_precision``: the value itself."""
    return x


def _reduce_sum(interp: Any, eqn: Any, x: Any) -> Poly:
    return algebra.reduce_sum(as_poly(x, interp.space), eqn.params["axes"], interp.space)


def _dot_general(interp: Any, eqn: Any, x: Any, y: Any) -> Poly:
    space = interp.space
    return algebra.dot_general(as_poly(x, space), as_poly(y, space), eqn.params["dimension_numbers"], space)


def _select_n(interp: Any, eqn: Any, predicate: Any, *cases: Any) -> Any:
    """``where``: index remapping for a constant predicate, else ``p on_true + (1 - p) on_false``."""
    if not is_symbolic(predicate):
        return interp.structural(eqn, [predicate, *cases])
    if len(cases) != 2:
        raise NonConjugate(first_var(predicate), "a multi-way select on a random value")
    space = interp.space
    p = as_poly(predicate, space)
    on_false, on_true = (as_poly(c, space) for c in cases)
    one = constant(np.ones(()), space)
    not_p = algebra.sub(one, p, space)
    return algebra.add(algebra.mul(p, on_true, space), algebra.mul(not_p, on_false, space), space)


#: Primitive name -> rule ``(interpreter, eqn, *invals) -> value``.
RULES: dict[str, Callable[..., Any]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "neg": _neg,
    "div": _div,
    "integer_pow": _integer_pow,
    "square": _square,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "pow": _pow,
    "log": _log,
    "exp": _exp,
    "log1p": _log1p,
    "convert_element_type": _same_value,
    "reduce_precision": _same_value,
    "reduce_sum": _reduce_sum,
    "dot_general": _dot_general,
    "select_n": _select_n,
}
