"""Walking jaxprs: the one table of primitives and the helpers every walker shares.

Three analyses read the jaxpr of model code: which inputs each output depends
on (:mod:`blrppl.graph.dependencies`), the symbolic interpreter over
polynomials in sufficient statistics (:mod:`blrppl.symbolic.interpret`), and
the search for a GLM's linear predictor
(:mod:`blrppl.estimators.linear_predictor`). They classify primitives by the
same table, :data:`PRIMITIVES`, and share:

- :func:`walk`, forward evaluation of a jaxpr under a non-standard
  interpretation (an environment from variables to abstract values);
- :func:`param` and :func:`call_body`, which read equation parameters and the
  body of a call-like equation under the names different jax versions use;
- :func:`live_equations` (backward liveness) and :func:`input_dependencies`
  (which inputs each output may depend on, equation by equation).

A primitive missing from the table is unknown to every walker: the
dependency analysis joins all its inputs (or enters its body, if it has one
that maps its inputs to its outputs one to one: :func:`inner_jaxpr`), the
interpreter refuses it on a random value, naming it, and the
linear-predictor search treats it as non-affine.

This module imports nothing from blrppl but jax and numpy, so that any layer may
use it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np
from jax.extend import core as jex_core

#: ``PrimitiveClass.data_args`` of a structural primitive whose every argument carries data.
ALL_ARGS = "all"
#: ``PrimitiveClass.data_args`` of ``select_n``: every argument but the predicate.
CASES = "cases"

STRUCTURAL = "structural"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
CONTRACTION = "contraction"
CALL = "call"
WRAPPED_CALL = "wrapped_call"
CONTROL_FLOW = "control_flow"

LINEAR = "linear"
BILINEAR = "bilinear"
LINEAR_IN_FIRST = "linear_in_first"
LINEAR_IN_CASES = "linear_in_cases"


class PrimitiveClass(NamedTuple):
    """How the jaxpr walkers treat one primitive.

    Attributes:
      role: what the primitive does. ``"structural"``: it moves elements and
        computes nothing (broadcast, reshape, slice, gather, concatenate,
        select with a constant predicate, ...). ``"elementwise"``,
        ``"reduction"``, ``"contraction"``: arithmetic. ``"call"``: its
        semantics is its body (``jit``, ``closed_call``), so it may be
        inlined anywhere. ``"wrapped_call"``: its body computes the value but
        the primitive also carries custom derivative or rematerialisation
        rules (``custom_jvp_call``, ``custom_vjp_call``, ``remat``); it may be
        entered for analysis, and is kept whole where code is re-run under
        autodiff. ``"control_flow"``: ``scan``, ``while`` and ``cond``, which
        each walker handles itself.
      data_args: for a structural primitive, which arguments carry data (the
        others are indices, shapes or a predicate): a tuple of positions,
        :data:`ALL_ARGS` or :data:`CASES`. None for other roles.
      linearity: how the output depends on the arguments, as the
        linear-predictor search needs it. ``"linear"``: jointly linear in all
        of them. ``"bilinear"``: linear in any one when the others are
        constants. ``"linear_in_first"``: linear in the first argument when
        the others are constants. ``"linear_in_cases"``: linear in the cases
        when the predicate is a constant. None: not linear (or linear for some
        parameters only, such as ``integer_pow`` with ``y=1``).
    """

    role: str
    data_args: tuple[int, ...] | str | None = None
    linearity: str | None = None


def _structural(data_args: tuple[int, ...] | str, linearity: str | None = None) -> PrimitiveClass:
    return PrimitiveClass(STRUCTURAL, data_args, linearity)


#: Primitive name -> :class:`PrimitiveClass`: the one table the walkers share.
PRIMITIVES: dict[str, PrimitiveClass] = {
    # Structural: only move elements around.
    "broadcast_in_dim": _structural((0,), LINEAR),
    "reshape": _structural((0,), LINEAR),
    "transpose": _structural((0,), LINEAR),
    "squeeze": _structural((0,), LINEAR),
    "expand_dims": _structural((0,), LINEAR),
    "rev": _structural((0,), LINEAR),
    "slice": _structural((0,), LINEAR),
    "dynamic_slice": _structural((0,), LINEAR_IN_FIRST),
    "gather": _structural((0,), LINEAR_IN_FIRST),
    "concatenate": _structural(ALL_ARGS, LINEAR),
    "stack": _structural(ALL_ARGS),
    "pad": _structural((0, 1), LINEAR),
    "select_n": _structural(CASES, LINEAR_IN_CASES),
    "dynamic_update_slice": _structural((0, 1)),
    "copy": _structural((0,), LINEAR),
    "copy_p": _structural((0,), LINEAR),
    "optimization_barrier": _structural(ALL_ARGS),
    # Elementwise arithmetic.
    "add": PrimitiveClass(ELEMENTWISE, linearity=LINEAR),
    "add_any": PrimitiveClass(ELEMENTWISE, linearity=LINEAR),
    "sub": PrimitiveClass(ELEMENTWISE, linearity=LINEAR),
    "neg": PrimitiveClass(ELEMENTWISE, linearity=LINEAR),
    "convert_element_type": PrimitiveClass(ELEMENTWISE, linearity=LINEAR),
    "reduce_precision": PrimitiveClass(ELEMENTWISE),
    "mul": PrimitiveClass(ELEMENTWISE, linearity=BILINEAR),
    "div": PrimitiveClass(ELEMENTWISE, linearity=LINEAR_IN_FIRST),
    "integer_pow": PrimitiveClass(ELEMENTWISE),
    "square": PrimitiveClass(ELEMENTWISE),
    "sqrt": PrimitiveClass(ELEMENTWISE),
    "rsqrt": PrimitiveClass(ELEMENTWISE),
    "pow": PrimitiveClass(ELEMENTWISE),
    "log": PrimitiveClass(ELEMENTWISE),
    "log1p": PrimitiveClass(ELEMENTWISE),
    "exp": PrimitiveClass(ELEMENTWISE),
    "eq": PrimitiveClass(ELEMENTWISE),
    "lt": PrimitiveClass(ELEMENTWISE),
    "ge": PrimitiveClass(ELEMENTWISE),
    # Reductions and contractions.
    "reduce_sum": PrimitiveClass(REDUCTION, linearity=LINEAR),
    "dot_general": PrimitiveClass(CONTRACTION, linearity=BILINEAR),
    # Calls: the body is the semantics.
    "pjit": PrimitiveClass(CALL),
    "jit": PrimitiveClass(CALL),
    "closed_call": PrimitiveClass(CALL),
    "core_call": PrimitiveClass(CALL),
    # Calls whose body carries custom derivative or rematerialisation rules.
    "custom_jvp_call": PrimitiveClass(WRAPPED_CALL),
    "custom_vjp_call": PrimitiveClass(WRAPPED_CALL),
    "custom_vjp_call_jaxpr": PrimitiveClass(WRAPPED_CALL),
    "remat": PrimitiveClass(WRAPPED_CALL),
    "remat2": PrimitiveClass(WRAPPED_CALL),  # ``jax.checkpoint`` (jax >= 0.4)
    "checkpoint": PrimitiveClass(WRAPPED_CALL),
    # Control flow.
    "scan": PrimitiveClass(CONTROL_FLOW),
    "while": PrimitiveClass(CONTROL_FLOW),
    "cond": PrimitiveClass(CONTROL_FLOW),
}

#: Parameter names under which call-like primitives keep their body, across jax versions.
_BODY_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_MISSING = object()


def role(name: str) -> str | None:
    """Return the role of primitive ``name`` (see :class:`PrimitiveClass`), or None."""
    row = PRIMITIVES.get(name)
    return None if row is None else row.role


def is_call(name: str, *, wrapped: bool = True) -> bool:
    """Whether ``name`` is a call-like primitive whose body may be entered.

    Args:
      name: a primitive name.
      wrapped: also count calls that carry custom derivative or
        rematerialisation rules (``custom_jvp_call``, ``remat``, ...).
    """
    return role(name) == CALL or (wrapped and role(name) == WRAPPED_CALL)


def structural_data_args(name: str, num_args: int) -> tuple[int, ...] | None:
    """Positions of the data arguments of a structural primitive, or None if not structural."""
    row = PRIMITIVES.get(name)
    if row is None or row.role != STRUCTURAL:
        return None
    if row.data_args == ALL_ARGS:
        return tuple(range(num_args))
    if row.data_args == CASES:
        return tuple(range(1, num_args))
    return tuple(row.data_args)


def linearity(name: str) -> str | None:
    """How primitive ``name``'s output depends on its arguments (see :class:`PrimitiveClass`)."""
    row = PRIMITIVES.get(name)
    return None if row is None else row.linearity


def param(eqn: Any, *names: str, default: Any = _MISSING) -> Any:
    """The first of ``names`` present in ``eqn.params`` (names differ across jax versions).

    Raises:
      KeyError: if none is present and no ``default`` is given.
    """
    for name in names:
        if name in eqn.params:
            return eqn.params[name]
    if default is _MISSING:
        raise KeyError(f"primitive {eqn.primitive.name!r} has none of the parameters {names}")
    return default


def open_jaxpr(body: Any) -> tuple[Any, Sequence[Any]]:
    """``(jaxpr, consts)`` of a closed or open jaxpr (an open one has no consts)."""
    if isinstance(body, jex_core.ClosedJaxpr):
        return body.jaxpr, body.consts
    return body, ()


def inner_jaxpr(eqn: Any) -> Any:
    """The body of an equation that maps its inputs to its outputs one to one, or None.

    Looks for a closed or open jaxpr under any of the parameter names
    call-like primitives use, with as many inputs and outputs as the
    equation. This is the test the dependency analysis uses: it enters any
    such body, whatever the primitive.
    """
    for key in _BODY_PARAMS:
        body = eqn.params.get(key)
        if isinstance(body, jex_core.ClosedJaxpr):
            inner = body.jaxpr
        elif isinstance(body, jex_core.Jaxpr):
            inner = body
        else:
            continue
        if len(inner.invars) == len(eqn.invars) and len(inner.outvars) == len(eqn.outvars):
            return body
    return None


def call_body(eqn: Any, *, wrapped: bool = True) -> Any:
    """The body of a call-like equation (see :func:`is_call`), or None.

    Args:
      eqn: a jaxpr equation.
      wrapped: also enter calls that carry custom derivative or
        rematerialisation rules.

    Returns:
      The closed or open jaxpr to inline, or None when ``eqn`` is not a call
      in the table or its body cannot be found.
    """
    if not is_call(eqn.primitive.name, wrapped=wrapped):
        return None
    return inner_jaxpr(eqn)


def literal_value(var: Any) -> Any:
    """The value of a jaxpr literal."""
    return var.val


def walk(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    apply: Callable[[Any, list], Sequence[Any]],
    *,
    literal: Callable[[Any], Any] = literal_value,
    equations: Sequence[Any] | None = None,
) -> list:
    """Evaluate ``jaxpr`` forwards under a non-standard interpretation.

    Args:
      jaxpr: an open jaxpr.
      consts: abstract values of its constant variables.
      args: abstract values of its inputs.
      apply: ``(eqn, input values) -> output values`` for one equation.
      literal: the abstract value of a literal.
      equations: the equations to evaluate (default: all, in order); e.g.
        the live ones from :func:`live_equations`.

    Returns:
      The abstract values of the outputs.
    """
    env: dict = {}

    def read(var: Any) -> Any:
        if isinstance(var, jex_core.Literal):
            return literal(var)
        return env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns if equations is None else equations:
        outs = apply(eqn, [read(v) for v in eqn.invars])
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def returns_operand(eqn: Any, indices: Any = None) -> bool:
    """Whether ``eqn`` returns its first operand unchanged (so evaluating it only copies).

    Two such equations: a ``broadcast_in_dim`` to the operand's own shape
    (JAX ends advanced indexing with one), and a ``gather`` of every row in
    order, ``x[arange(N)]`` (a minibatch model run on all N rows), whose
    concrete index array is ``indices``.
    """
    name = eqn.primitive.name
    if name not in ("broadcast_in_dim", "gather"):
        return False
    operand, out = eqn.invars[0].aval, eqn.outvars[0].aval
    shape = tuple(operand.shape)
    if tuple(out.shape) != shape or out.dtype != operand.dtype or not shape:
        return False
    if name == "broadcast_in_dim":
        return tuple(eqn.params["broadcast_dimensions"]) == tuple(range(len(shape))) and eqn.params.get("sharding") is None
    dn = eqn.params["dimension_numbers"]
    if (
        tuple(dn.collapsed_slice_dims) != (0,)
        or tuple(dn.start_index_map) != (0,)
        or tuple(dn.offset_dims) != tuple(range(1, len(shape)))
        or tuple(getattr(dn, "operand_batching_dims", ()))
        or tuple(eqn.params["slice_sizes"]) != (1,) + shape[1:]
        or indices is None
    ):
        return False
    indices = np.asarray(indices)
    return indices.shape == (shape[0], 1) and bool(np.array_equal(indices[:, 0], np.arange(shape[0])))


def _variables(vars_: Sequence[Any]) -> list:
    return [v for v in vars_ if not isinstance(v, jex_core.Literal)]


def live_equations(jaxpr: Any) -> tuple[list, set]:
    """The equations the outputs depend on, in order, and every variable read.

    Dead code (e.g. argument validation in numpyro constructors whose result
    nobody uses) is left out.

    Returns:
      ``(equations, read)``: the live equations, and the variables that the
      outputs or the live equations read (an output of a live equation not in
      ``read`` is never used).
    """
    read = set(_variables(jaxpr.outvars))
    live = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in read for v in eqn.outvars):
            live.append(eqn)
            read.update(_variables(eqn.invars))
    return live[::-1], read


def input_dependencies(jaxpr: Any) -> list[set[int]]:
    """For each output of ``jaxpr``, the positions of the inputs it may depend on.

    Every equation's outputs are taken to depend on all of its inputs (sound,
    and coarse through calls and control flow; :mod:`blrppl.graph.dependencies`
    is precise per output).
    """
    deps: dict = {v: {i} for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        sources: set = set()
        for v in _variables(eqn.invars):
            sources |= deps.get(v, set())
        for v in eqn.outvars:
            deps[v] = sources
    return [set() if isinstance(v, jex_core.Literal) else deps.get(v, set()) for v in jaxpr.outvars]


#: Primitives XLA:CPU runs as LAPACK custom calls (factorisations, triangular solves, eigensolvers).
LAPACK_PRIMITIVES = frozenset({
    "cholesky", "triangular_solve", "lu", "qr", "geqrf", "geqp3", "householder_product", "eigh", "eig",
    "svd", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve", "cholesky_update",
    "lu_pivots_to_permutation",
})


def _sub_jaxprs(eqn: Any):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def lapack_primitives(jaxpr: Any) -> set[str]:
    """The LAPACK primitives a (closed or open) jaxpr calls, bodies of calls and loops included.

    Code that calls LAPACK is evaluated one sample (node, configuration) at a
    time with ``lax.map`` rather than under ``vmap``: jaxlib 0.10.x runs a
    *batched* LAPACK call whose batch is large over XLA's intra-op thread
    pool and blocks its own thread waiting for the pieces, which deadlocks
    when as many such calls run at once as the pool has threads (a 2-core
    machine; fixed upstream in jaxlib 0.11.2). Unbatched calls never wait.
    """
    found: set[str] = set()
    stack = [open_jaxpr(jaxpr)[0]]
    while stack:
        current = stack.pop()
        for eqn in live_equations(current)[0]:  # dead code (a replayed model's other sites) is compiled away
            if eqn.primitive.name in LAPACK_PRIMITIVES:
                found.add(eqn.primitive.name)
            stack.extend(_sub_jaxprs(eqn))
    return found


def map_batch(fn: Any, *xs: Any) -> Any:
    """``jax.vmap(fn)(*xs)``, or ``jax.lax.map`` (one row at a time) when ``fn``'s code calls LAPACK.

    The rows' leading axis is mapped; see :func:`lapack_primitives` for why a
    batched LAPACK call is avoided (jaxlib 0.10.x deadlocks on some). Works
    inside ``jit`` (``fn`` may close over the enclosing trace's values).
    """
    one = jax.tree.map(lambda x: x[0], xs)
    if lapack_primitives(jax.make_jaxpr(fn)(*one)):
        return jax.lax.map(lambda args: fn(*args), xs)
    return jax.vmap(fn)(*xs)
