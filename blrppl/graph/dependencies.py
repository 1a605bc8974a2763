"""Which inputs each output of a function depends on, read off its jaxpr.

The tracer needs, for every sample site, the latent sites its value and its
distribution arguments depend on (its factor's neighbours), and the same for
deterministic sites. :func:`output_dependencies` answers this for any function
of arrays: it builds the function's jaxpr with ``jax.make_jaxpr`` and walks
the equations forwards, propagating for each variable the set of inputs it
depends on.

Control flow is analysed per output, not per equation: ``scan`` and ``while``
bodies are walked with the carry's dependency sets iterated to a fixed point,
``cond`` takes the union over its branches (plus the predicate), and call-like
primitives (``jit``/``pjit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``; any body that maps an equation's inputs to
its outputs one to one, :func:`blrppl.graph.jaxpr.inner_jaxpr`) are entered;
the equations are walked with :func:`blrppl.graph.jaxpr.walk`. This is what
makes the answer precise through ``numpyro.contrib.control_flow.scan``, where
``numpyro.infer.inspect.get_model_relations`` over-approximates (it joins all
sites of a scan body).

An indexing equation whose indices come from the data and fall outside its
operand (:mod:`blrppl.graph.index_bounds`) marks its outputs with its
:class:`~blrppl.graph.index_bounds.OutOfRange`, so that the tracer can name
the sites it reaches.

Every top-level ``scan`` also marks its outputs with a :class:`ScanTag`, and
the inputs its initial carry depends on are recorded: the tracer uses both to
recognise latent chains and to join a chain with its initial state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Sequence

import jax

from blrppl.graph.index_bounds import OutOfRange, out_of_range
from blrppl.graph.jaxpr import inner_jaxpr, open_jaxpr, walk

Deps = frozenset  # a set of input indices (ints), ScanTag and OutOfRange values


@dataclasses.dataclass(frozen=True)
class ScanTag:
    """Marks values produced by the ``index``-th top-level ``scan`` equation."""

    index: int


@dataclasses.dataclass
class Analysis:
    """The result of :func:`output_dependencies`.

    Attributes:
        outputs: one dependency set per flattened output leaf: input indices
            (ints, positions in the flattened inputs) and :class:`ScanTag`
            values of the top-level scans the output passes through.
        scan_init: ScanTag -> input indices the scan's initial carry depends on.
    """

    outputs: list[Deps]
    scan_init: dict[ScanTag, Deps]

    def inputs_of(self, position: int) -> frozenset[int]:
        """Input indices (no tags) that output ``position`` depends on."""
        return frozenset(d for d in self.outputs[position] if isinstance(d, int))

    def scans_of(self, position: int) -> frozenset[ScanTag]:
        """Top-level scans that output ``position`` passes through."""
        return frozenset(d for d in self.outputs[position] if isinstance(d, ScanTag))

    def out_of_range(self, position: int) -> list[OutOfRange]:
        """Indexing equations with out-of-range data indices that output ``position`` reads."""
        return [d for d in self.outputs[position] if isinstance(d, OutOfRange)]


_EMPTY: Deps = frozenset()


@dataclasses.dataclass
class _Context:
    depth: int = 0
    scan_init: dict = dataclasses.field(default_factory=dict)
    out_of_range: dict = dataclasses.field(default_factory=dict)  # id(eqn) -> OutOfRange


def output_dependencies(fn: Callable[..., Any], *flat_args: Any) -> Analysis:
    """Dependencies of each output leaf of ``fn(*flat_args)`` on its arguments.

    Args:
        fn: a function of ``len(flat_args)`` arrays returning a pytree of arrays.
        *flat_args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
        An :class:`Analysis` whose ``outputs[k]`` is the set of argument
        positions the k-th flattened output leaf depends on.

    Raises:
        Whatever ``jax.make_jaxpr`` raises when ``fn`` needs concrete values
        (``ConcretizationTypeError`` and friends); the tracer turns these into
        a ``ModelError`` naming the site.
    """
    closed = jax.make_jaxpr(fn)(*flat_args)
    ctx = _Context(out_of_range=out_of_range(closed))
    in_deps = [frozenset([i]) for i in range(len(closed.jaxpr.invars))]
    return Analysis(outputs=_walk_closed(closed, in_deps, ctx), scan_init=ctx.scan_init)


def _walk_closed(closed: Any, in_deps: Sequence[Deps], ctx: _Context) -> list[Deps]:
    jaxpr, _ = open_jaxpr(closed)
    return _walk(jaxpr, in_deps, ctx)


def _walk(jaxpr: Any, in_deps: Sequence[Deps], ctx: _Context) -> list[Deps]:
    return walk(
        jaxpr,
        [_EMPTY] * len(jaxpr.constvars),
        in_deps,
        lambda eqn, ins: _equation(eqn, ins, ctx),
        literal=lambda _: _EMPTY,
    )


def _union(sets: Sequence[Deps]) -> Deps:
    out: set[Hashable] = set()
    for s in sets:
        out |= s
    return frozenset(out)


def _equation(eqn: Any, ins: list[Deps], ctx: _Context) -> list[Deps]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if name == "scan":
        return _scan(eqn, ins, ctx)
    if name == "while":
        return _while(eqn, ins, ctx)
    if name == "cond":
        index, ops = ins[0], ins[1:]
        ctx.depth += 1
        try:
            branch_outs = [_walk_closed(b, ops, ctx) for b in eqn.params["branches"]]
        finally:
            ctx.depth -= 1
        return [_union([b[k] for b in branch_outs]) | index for k in range(n_out)]
    # Any body that maps the equation's inputs to its outputs one to one is
    # entered: the call-like primitives of the table, and others (shard_map).
    sub = inner_jaxpr(eqn)
    if sub is not None:
        ctx.depth += 1
        try:
            return _walk_closed(sub, ins, ctx)
        finally:
            ctx.depth -= 1
    every = _union(ins)
    bad = ctx.out_of_range.get(id(eqn))
    return [every if bad is None else every | {bad}] * n_out


def _scan(eqn: Any, ins: list[Deps], ctx: _Context) -> list[Deps]:
    """``scan``: iterate the carry's dependencies to a fixed point, then read the outputs."""
    num_consts = eqn.params["num_consts"]
    num_carry = eqn.params["num_carry"]
    consts = ins[:num_consts]
    carry = list(ins[num_consts : num_consts + num_carry])
    xs = ins[num_consts + num_carry :]
    tag = None
    if ctx.depth == 0:
        tag = ScanTag(len(ctx.scan_init))
        ctx.scan_init[tag] = frozenset(d for d in _union(carry) if isinstance(d, int))
    ctx.depth += 1
    try:
        while True:
            outs = _walk_closed(eqn.params["jaxpr"], [*consts, *carry, *xs], ctx)
            new_carry = [c | o for c, o in zip(carry, outs[:num_carry])]
            if new_carry == carry:
                break
            carry = new_carry
    finally:
        ctx.depth -= 1
    result = [*carry, *outs[num_carry:]]
    if tag is not None:
        result = [deps | {tag} for deps in result]
    return result


def _while(eqn: Any, ins: list[Deps], ctx: _Context) -> list[Deps]:
    """``while``: a fixed point over the carry; the predicate's inputs reach every output."""
    cond_n = eqn.params["cond_nconsts"]
    body_n = eqn.params["body_nconsts"]
    cond_consts = ins[:cond_n]
    body_consts = ins[cond_n : cond_n + body_n]
    carry = list(ins[cond_n + body_n :])
    ctx.depth += 1
    try:
        while True:
            (pred,) = _walk_closed(eqn.params["cond_jaxpr"], [*cond_consts, *carry], ctx)
            outs = _walk_closed(eqn.params["body_jaxpr"], [*body_consts, *carry], ctx)
            new_carry = [c | o | pred for c, o in zip(carry, outs)]
            if new_carry == carry:
                break
            carry = new_carry
    finally:
        ctx.depth -= 1
    return carry
