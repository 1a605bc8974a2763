"""Interpret a jaxpr over symbolic arrays.

The user's parameter code (latent values -> distribution arguments) and the
canonical log density are traced together into one jaxpr; this module walks
it once, at analysis time, with each input latent replaced by a symbolic
array (:func:`~blrppl.symbolic.terms.variable`). Equations whose inputs are
all constant (data, folded parameter code) are evaluated as they are; the
rest follow the rules of :mod:`blrppl.symbolic.rules` (arithmetic),
:mod:`blrppl.symbolic.categorical` (categorical indices) and
:mod:`blrppl.symbolic.scan`, and call-like primitives are entered. Any
primitive without a rule, applied to a random value, marks the factor
non-conjugate in that variable, with a reason that names the primitive.

Index-remapping primitives (the structural rows of
:data:`blrppl.graph.jaxpr.PRIMITIVES`: broadcast, reshape, transpose, slice,
gather with constant indices, concatenate, pad, select with a constant
predicate, ...) are handled generically: the primitive is run on an integer
iota in place of each symbolic operand, and the positions it returns say
where each output element comes from.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.compile_mode import to_device
from blrppl.graph import tape
from blrppl.graph.jaxpr import (
    call_body,
    is_call,
    live_equations,
    open_jaxpr,
    param,
    returns_operand,
    structural_data_args,
    walk,
)
from blrppl.symbolic import algebra, categorical, rules
from blrppl.graph.host import host_bind, on_positions
from blrppl.symbolic.scan import interpret_scan
from blrppl.symbolic.terms import Labels, NonConjugate
from blrppl.symbolic.values import Poisoned, as_poly, first_var, int_params, is_key, is_symbolic, unsupported

LOGDET_NAME = "blrppl_logdet"
SUPPORT_NAME = "blrppl_support_bound"
NORMALIZER_PREFIX = "blrppl_normalizer"


class Held(NamedTuple):
    """A value that depends only on variables held at a point (``Interpreter(held=...)``), left
    uncomputed: an additive part of log f that its estimator adds back numerically (see
    :class:`~blrppl.symbolic.compiled.Analysis`'s ``residual``)."""

    shape: tuple

_RULES = {**rules.RULES, **categorical.RULES}


class Interpreter:
    """Walk a jaxpr with symbolic inputs (see the module docstring).

    Rules receive the interpreter and use its ``space``, its ``categorical``
    table, :meth:`structural` and :meth:`evaluate`.

    Args:
      space: the label space shared with the expectation step.
      categorical: categorical variable name -> (value shape, number of
        categories).
      held: variables held at a point whose own functions may be left out: a canonical
        normaliser (a named call ``blrppl_normalizer...``) of these alone is a :class:`Held`
        value, which may only be added to the rest (``left_out`` is then True) or combined
        with constants and other values of held variables; elsewhere it is non-conjugate.
    """

    def __init__(
        self, space: Labels, categorical: Mapping[str, tuple[tuple[int, ...], int]], held: frozenset = frozenset()
    ):
        self.space = space
        self.categorical = dict(categorical)
        self.held = frozenset(held)
        self.left_out = False

    def run(self, closed_jaxpr: Any, args: Sequence[Any]) -> list[Any]:
        """The outputs of ``closed_jaxpr`` for input values ``args`` (constants or Polys)."""
        return self.evaluate(closed_jaxpr.jaxpr, closed_jaxpr.consts, args)

    def evaluate(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The outputs of an open ``jaxpr``; only the equations the outputs need are run."""
        live, read = live_equations(jaxpr)
        consts = [c if is_symbolic(c) or is_key(c) else np.asarray(c) for c in consts]

        def apply(eqn: Any, invals: list) -> list:
            return self._apply(eqn, invals, [v in read for v in eqn.outvars])

        return walk(jaxpr, consts, args, apply, literal=lambda v: np.asarray(v.val), equations=live)

    def _apply(self, eqn: Any, invals: list, used: list[bool]) -> list:
        prim = eqn.primitive
        if any(isinstance(v, Held) for v in invals):
            if is_call(prim.name) and call_body(eqn) is not None:
                return self._call(eqn, invals)
            return self._held(eqn, invals)
        if not any(is_symbolic(v) for v in invals):
            same = _identity(eqn, invals)
            if same is not None:
                return [same]
            params = prim.get_bind_params(eqn.params)
            if any(tape.is_dual(v) for v in invals):  # data: computed and recorded (see blrppl.graph.tape)
                _guard_in_bounds(eqn, invals)  # x_group[g]: a replay must not clamp a new g
                host = lambda *xs: tuple(host_bind(eqn, params, xs) or _bind(prim, params, xs))  # noqa: E731
                return list(tape.lift(host, _replay_bind(prim, params), invals))
            return host_bind(eqn, params, invals) or _host_call(eqn, invals) or _bind(prim, params, invals)
        name = prim.name
        if is_call(name):
            return self._call(eqn, invals)
        rule = _RULES.get(name)
        if rule is not None:
            out = rule(self, eqn, *invals)
            return out if prim.multiple_results else [out]
        if name == "scan":
            return interpret_scan(self, eqn, invals, used)
        if structural_data_args(name, len(invals)) is not None:
            return [self.structural(eqn, invals)]
        raise unsupported(name, next((first_var(v) for v in invals if is_symbolic(v)), None))

    def _only_held(self, invals: list) -> bool:
        """Whether every symbolic input reads held variables alone."""
        return all(
            isinstance(v, Held) or not is_symbolic(v) or (self.held and _variables(v) <= self.held) for v in invals
        )

    def _held(self, eqn: Any, invals: list) -> list:
        """An equation with a :class:`Held` input: a sum leaves it out; a function of held values
        alone is held; anything else would need its value."""
        name = eqn.primitive.name
        shapes = [tuple(v.aval.shape) for v in eqn.outvars]
        if name in ("add", "add_any", "sub"):
            a, b = invals
            if isinstance(a, Held) and isinstance(b, Held):
                return [Held(shapes[0])]
            self.left_out = True
            if isinstance(b, Held):
                return [a]
            if name != "sub":
                return [b]
            return [rules.RULES["neg"](self, eqn, b) if is_symbolic(b) else -np.asarray(b)]
        if self._only_held(invals):
            return [Held(shape) for shape in shapes]
        var = next((first_var(v) for v in invals if is_symbolic(v) and not isinstance(v, Held)), None)
        raise NonConjugate(var, f"a normaliser of held values meets {var!r} in {name!r}")

    def _call(self, eqn: Any, invals: list) -> list:
        name = param(eqn, "name", default=None)
        if name and name.startswith(NORMALIZER_PREFIX) and any(is_symbolic(v) for v in invals):
            if self._only_held(invals):
                return [Held(tuple(v.aval.shape)) for v in eqn.outvars]
        if name == LOGDET_NAME:
            return [algebra.logdet(as_poly(invals[0], self.space))]
        if name == SUPPORT_NAME:
            var = next(first_var(v) for v in invals if is_symbolic(v))
            raise NonConjugate(
                var, f"the support of the distribution depends on {var!r}, so its density is not an "
                "exponential family in it"
            )
        body = call_body(eqn)
        if body is None:
            raise unsupported(eqn.primitive.name, next((first_var(v) for v in invals if is_symbolic(v)), None))
        return self.evaluate(*open_jaxpr(body), invals)

    def structural(self, eqn: Any, invals: list) -> Any:
        """An index-remapping primitive on symbolic data (see the module docstring)."""
        prim, params = eqn.primitive, eqn.params
        data = structural_data_args(prim.name, len(invals))
        for i, v in enumerate(invals):
            if i not in data and is_symbolic(v):
                raise NonConjugate(first_var(v), f"a random index or shape in {prim.name!r}")
        out_shape = eqn.outvars[0].aval.shape
        if prim.name == "select_n":
            predicate = np.asarray(invals[0])
        result = None
        for j in data:
            value = invals[j]
            if prim.name == "select_n" and not np.any(predicate == (j - 1)):
                continue  # This case is never selected.
            args = []
            for i, v in enumerate(invals):
                shape = tuple(eqn.invars[i].aval.shape)
                if i == j:
                    args.append(np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape))
                elif i in data:
                    args.append(np.full(shape, -1, np.int32))
                else:
                    # Index data of a gather stay on the tape (replayed); other data are read.
                    args.append(v if tape.is_dual(v) and prim.name in _INDEXING else np.asarray(v))
            positions = _positions(eqn, params, args)
            if np.all(positions < 0):
                continue
            piece = algebra.reindex(as_poly(value, self.space), positions, self.space)
            result = piece if result is None else algebra.add(result, piece, self.space)
        if result is None:
            return np.zeros(out_shape)
        return categorical.merge_categorical(result, self.space)


def _variables(value: Any) -> frozenset:
    """The variables a symbolic value reads."""
    if isinstance(value, Poisoned):
        return frozenset((value.var,))
    return frozenset(value.variables)


def _identity(eqn: Any, invals: list) -> Any:
    """The operand itself where a constant equation returns it unchanged
    (:func:`~blrppl.graph.jaxpr.returns_operand`), else None: evaluated, it
    would copy the data (``X[idx]`` at every row, in a minibatch model
    analysed on all N rows)."""
    if eqn.primitive.name == "gather" and tape.is_dual(invals[1]):
        return None
    indices = invals[1] if eqn.primitive.name == "gather" else None
    return invals[0] if returns_operand(eqn, indices) else None


def _positions(eqn: Any, params: dict, args: list) -> np.ndarray:
    """The primitive of ``eqn`` on integer positions (in numpy where it is exact there); with
    index data from the tape (a :class:`~blrppl.graph.tape.Dual`, ``alpha[county]``), the
    positions are on the tape too: a new data set's replay computes its own."""
    bind_params = int_params(eqn.primitive.name, params)
    if not any(tape.is_dual(a) for a in args):
        return on_positions(eqn, bind_params, args)
    _guard_in_bounds(eqn, args)
    return tape.lift(
        lambda *xs: on_positions(eqn, bind_params, list(xs)),
        lambda *xs: eqn.primitive.bind(*xs, **bind_params),
        tuple(args),
    )


_INDEXING = ("gather", "dynamic_slice")
"""Structural primitives whose index operands may stay on the tape (their positions replayed)."""


def _guard_in_bounds(eqn: Any, args: list) -> None:
    """Where a gather or dynamic slice reads at indices from the data (Duals), a guard that they are
    in range: JAX clamps an index out of range (a gather's ``PROMISE_IN_BOUNDS``, any dynamic
    slice), and on the host such data are a ModelError (graph/index_bounds.py), so a replay on new
    data must not clamp them silently. (``CLIP`` and ``FILL_OR_DROP`` replay what they did.)"""
    name = eqn.primitive.name
    if name not in _INDEXING or not any(tape.is_dual(a) for a in args[1:]):
        return
    if name == "gather" and not str(eqn.params.get("mode")).endswith("PROMISE_IN_BOUNDS"):
        return
    bool(tape.lift(lambda *xs: _in_bounds(np, eqn, xs), lambda *xs: _in_bounds(jnp, eqn, xs), tuple(args[1:])))


def _in_bounds(xp: Any, eqn: Any, indices: tuple) -> Any:
    """Whether a gather's indices (or a dynamic slice's starts) are inside the operand, in ``xp``."""
    shape = eqn.invars[0].aval.shape
    if eqn.primitive.name == "dynamic_slice":
        sizes = eqn.params["slice_sizes"]
        checks = [(xp.asarray(s) >= 0) & (xp.asarray(s) <= d - n) for s, d, n in zip(indices, shape, sizes)]
        return xp.all(xp.stack(checks)) if checks else xp.asarray(True)
    (index,) = indices
    dn, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
    high = xp.asarray([shape[axis] - sizes[axis] for axis in dn.start_index_map])
    return xp.all((index >= 0) & (index <= high))


class _NeedsXLA(Exception):
    """An equation of a constant call that numpy does not evaluate (:func:`_host_call`)."""


def _host_call(eqn: Any, invals: list) -> list | None:
    """A call on constants (the ``jit`` inside many ``jnp`` functions) evaluated equation by
    equation in numpy, or None where one of them needs XLA: the call is then bound whole,
    one compiled program rather than one per operation."""
    body = call_body(eqn) if is_call(eqn.primitive.name) else None
    if body is None or any(is_key(v) for v in invals):
        return None
    jaxpr, consts = open_jaxpr(body)
    if any(is_key(c) for c in consts):
        return None

    def apply(inner: Any, values: list) -> list:
        out = host_bind(inner, inner.primitive.get_bind_params(inner.params), values) or _host_call(inner, values)
        if out is None:
            raise _NeedsXLA
        return out

    try:
        return walk(jaxpr, [np.asarray(c) for c in consts], invals, apply, literal=lambda v: np.asarray(v.val),
                    equations=live_equations(jaxpr)[0])
    except _NeedsXLA:
        return None


def _bind(prim: Any, params: dict, invals: Sequence[Any]) -> list:
    """A primitive on constant inputs, evaluated now (numpy outputs)."""
    out = prim.bind(*[v if is_key(v) else to_device(v) for v in invals], **params)  # no staging compile
    outs = out if prim.multiple_results else [out]
    return [o if is_key(o) else np.asarray(o) for o in outs]


def _replay_bind(prim: Any, params: dict):
    """The same primitive on replayed (traced) inputs: a tuple of outputs."""

    def bind(*xs):
        out = prim.bind(*xs, **params)
        return tuple(out) if prim.multiple_results else (out,)

    return bind


def blrppl_logdet(x: jax.Array) -> jax.Array:
    """log |x| of symmetric positive-definite matrices; recognised symbolically.

    Canonical log densities call this (through :func:`logdet`) so that the
    interpreter sees one named call instead of a Cholesky factorisation.
    """
    chol = jnp.linalg.cholesky(x)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


logdet = jax.jit(blrppl_logdet)


def blrppl_support_bound(bound: jax.Array) -> jax.Array:
    """A bound of a distribution's support (the identity); recognised symbolically.

    Canonical densities pass support bounds (``Uniform``'s low and high)
    through this, so that a bound that depends on a latent value marks the
    factor non-conjugate instead of being read as a density parameter.
    """
    return bound


support_bound = jax.jit(blrppl_support_bound)
