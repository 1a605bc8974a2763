"""Analyse a log factor once: jaxpr -> symbolic polynomial -> statistic terms."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import numpy as np

from blrppl.graph import tape
from blrppl.graph.data import DATA_ERRORS
from blrppl.symbolic import algebra
from blrppl.symbolic.compiled import Analysis, with_index_leaves
from blrppl.symbolic.interpret import Held, Interpreter
from blrppl.symbolic.resolve import resolve
from blrppl.symbolic.stacking import stack_terms
from blrppl.symbolic.statistics import BERNOULLI, CATEGORICAL, VarInfo, is_index_kind
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Poly, Term, VarAtom, constant, variable
from blrppl.symbolic.values import categorical_variable


def analyse(
    log_factor: Callable[..., jax.Array],
    example_values: Mapping[str, jax.Array],
    infos: Mapping[str, VarInfo],
    data: tuple | None = None,
    held: frozenset = frozenset(),
) -> Analysis:
    """Compile ``E_q[log_factor(values)]`` into statistic terms.

    Args:
      log_factor: a pure function from a dict of latent values to a scalar
        (the factor's log density summed over its plates), or to a vector over
        the observations of one subsampled plate (summed over the rest), or
        to a tuple of such (one per site of a joined factor), summed.
      example_values: values with the right shapes and dtypes (e.g. a draw
        from the prior); only their shapes matter.
      infos: for every key of ``example_values``, its q (family kind and the
        axes q factorises over).
      data: the model's array arguments as inputs of the traced jaxpr
        (:class:`~blrppl.graph.tape.Dual` values of a recording), passed to
        ``log_factor(values, data)``; None: ``log_factor(values)`` closes
        over its data (constants of the jaxpr).
      held: variables held at a point by the caller (their info POINT), whose canonical
        normalisers may be left out of the terms (the result's ``residual`` then says so;
        :class:`~blrppl.symbolic.interpret.Held`): the caller adds them back.

    Returns:
      The :class:`~blrppl.symbolic.compiled.Analysis`, a pytree;
      :func:`~blrppl.symbolic.expectation.expected_value` evaluates it from
      mean parameters.

    Raises:
      NonConjugate: naming the variable and the reason.
    """
    names = sorted(example_values)
    examples = [example_values[n] for n in names]
    closed = None
    if data is not None:
        # The recording's inputs (Duals) are the jaxpr's inputs; plain arrays among them (those the
        # model needs as values: ``held``) are constants of it.
        inputs = [i for i, d in enumerate(data) if tape.is_dual(d)]
        shapes = [jax.ShapeDtypeStruct(np.shape(data[i]), data[i].dtype) for i in inputs]

        def with_inputs(ds):
            full = list(data)
            for i, d in zip(inputs, ds):
                full[i] = d
            return tuple(full)

        try:
            closed = jax.make_jaxpr(lambda xs, ds: log_factor(dict(zip(names, xs)), with_inputs(ds)))(examples, shapes)
            data = tuple(data[i] for i in inputs)
        except DATA_ERRORS:  # the model needs concrete data: they stay constants
            data = None
    if closed is None:
        tape.give_up("an analysis closed over the data")
        closed = jax.make_jaxpr(lambda *xs: log_factor(dict(zip(names, xs))))(*examples)
    space = Labels()
    categorical = {}
    args = []
    binary = {name for name in names if infos[name].kind == BERNOULLI}
    for name in names:
        info = infos[name]
        shape = tuple(np.shape(example_values[name]))
        if name in binary:
            categorical[name] = (shape, 2)
            args.append(categorical_variable(name, shape, space))
        elif is_index_kind(info.kind):
            categorical[name] = (shape, info.num_categories)
            args.append(categorical_variable(name, shape, space))
        else:
            args.append(variable(name, shape, space))
    interpreter = Interpreter(space, categorical, held)
    outs = []
    for out in interpreter.run(closed, args + list(data or ())):
        if isinstance(out, Held):  # log f of held values alone: all of it added back by the caller
            interpreter.left_out, out = True, np.zeros(out.shape)
        outs.append(_as_poly(out, space))
    joined = len(outs) > 1
    # Several outputs (the sites of a joined loop factor) are summed. Each one's
    # enumeration selectors go into its own terms first: a read of z_3 in one site's
    # density does not multiply another site's terms (as one sum would make it).
    # Summed pairwise: each sum normalises the terms of both sides, so a running sum
    # over a T-step loop's sites cost O(T^2) (half of planning a 400-step loop).
    while len(outs) > 1:
        pairs = [
            algebra.add(algebra.push_selectors(a), algebra.push_selectors(b), space)
            for a, b in zip(outs[::2], outs[1::2])
        ]
        outs = pairs + outs[len(pairs) * 2:]
    out = outs[0]
    if len(out.shape) > 1:
        raise ValueError("log_factor must return a scalar or a vector over observations")
    if binary:
        out = _binary_as_indicator(out, binary)
        infos = {
            name: VarInfo(CATEGORICAL, info.shape, info.num_batch, 2) if name in binary else info
            for name, info in infos.items()
        }
    for name in names:
        if is_index_kind(infos[name].kind) and any(
            a.var == name and a.kind == "cat" for t in out.terms for a in t.atoms
        ):
            raise NonConjugate(name, f"the categorical {name!r} is used as a number, not as an index")
    analysis = resolve(out, infos, space)
    analysis = with_index_leaves(stack_terms(analysis, space) if joined else analysis)
    return dataclasses.replace(analysis, residual=True) if interpreter.left_out else analysis


def _as_poly(out, space: Labels) -> Poly:
    """One output of the interpreter as a Poly (a constant output is a constant Poly)."""
    if isinstance(out, Poly):
        return out
    out = tape.asarray(out, float)
    if out.ndim == 0:
        return Poly((), (), (Term(tape.scalar(out)),))
    return constant(out, space)


def _binary_as_indicator(poly: Poly, binary: set) -> Poly:
    """A Bernoulli used as a number: z = one_hot(z)_1 (and z ** p = z for z in {0, 1}).

    A Bernoulli latent is interpreted as a two-category index, so that
    ``mu[z]`` and ``z == 1`` enumerate it like a Categorical; where it is used
    as a number instead (``z * beta``, ``z log p + (1 - z) log(1 - p)``), its
    value is the indicator of category 1. Its reads are then all one-hot
    reads, whose products at one position pair as ``one_hot_j one_hot_k =
    delta_jk one_hot_k`` (the Bernoulli's value layout supplies ``one_hot`` =
    (1 - p, p)).
    """
    one = Index((), np.array(1))

    def convert(atom: VarAtom) -> VarAtom:
        if atom.var not in binary or atom.kind != "cat":
            return atom
        if atom.power <= 0 or atom.power.denominator != 1:
            raise NonConjugate(atom.var, f"{atom.var!r} ** {atom.power} of a Bernoulli latent")
        return VarAtom(atom.var, "one_hot", atom.index + (one,), sizes=atom.sizes + (2,))

    terms = tuple(Term(t.coeff, t.operands, tuple(convert(a) for a in t.atoms)) for t in poly.terms)
    return Poly(poly.shape, poly.labels, terms, poly.selectors)
