"""Hybrid factors: exact in their conjugate neighbours, estimated in the others.

A factor such as ``y ~ Normal(alpha[county] + beta * x, sigma)`` with
``sigma ~ HalfNormal`` is conjugate in ``alpha`` and ``beta`` but not in
``sigma`` (whose q is a Gaussian on log sigma). Conditionally on a value s of
the non-conjugate neighbours U, the expected log factor over the conjugate
ones C is still a symbolic polynomial in C's mean parameters and in simple
statistics of s (s^-2, log s, ...), so

    E_q[log f] = E_{q(U)}[ F(μ_C, s(u)) ],     F from the symbolic analysis,

and the site parameters are ∇_{μ_C} of that (exact in C, the outer
expectation by quadrature or Monte Carlo) and Bonnet/Price in U (Khan & Rue,
Eqs. 10-11), e.g. Gauss-Hermite on a scalar log-scale: deterministic, with
no sampling at all. Only the edges that are not conjugate are estimated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from blrppl.compile_mode import probe
from blrppl.graph import tape
from blrppl.graph.concrete import with_held_data
from blrppl.graph.data import DATA_ERRORS
from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, owner, var_info
from blrppl.estimators.cubature import MAX_CUBATURE_DIM
from blrppl.estimators.nonconjugate import expectation_over, refuse_minibatch, separable_blocks
from blrppl.graph.nodes import FactorGraph
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.canonical import Unsupported
from blrppl.symbolic.expectation import POINT, VarInfo, expected_value, point_stats, stats_needed
from blrppl.symbolic.terms import NonConjugate


def hybrid_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    param_examples: Mapping[str, Any],
    uncertain: Sequence[str],
    method: str,
    num_samples: int,
    *,
    second_order: bool = True,
) -> FactorEstimator:
    """Build the estimator, or raise :class:`NonConjugate` when no split works.

    Args:
      uncertain: the neighbours whose edges are not conjugate (U); the
        others (C) must become conjugate once U is held at a value.
      method: for U, as in :func:`~blrppl.estimators.nonconjugate.expectation_over`;
        ``"auto"`` is Gauss-Hermite for one scalar (or d <= 2) Gaussian U, else
        Monte Carlo.
      second_order: as in :func:`~blrppl.estimators.nonconjugate.expectation_over`.
    """
    node = graph.factors[factor]
    uncertain = tuple(uncertain)
    conjugate = tuple(v for v in node.neighbours if v not in uncertain)
    if not conjugate or not uncertain:
        raise NonConjugate(None, "no conjugate neighbour to keep exact")
    own = owner(graph, factor)
    for v in node.neighbours:
        if (v == own and (v in uncertain or qs[v].transform is not None)) or qs[v].joint:
            raise NonConjugate(v, "the prior of a transformed variable, or a joint block")
    points = tuple(p for p in node.param_neighbours if p in param_examples)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None and v not in uncertain}
    fixed = {k: x for k, x in examples.items() if k not in node.neighbours}
    log_factor = factor_log_density(graph, factor, transforms, fixed, per_site=True)
    held = {u: _constrain(qs[u], examples[u], probe) for u in uncertain}
    infos = {v: var_info(qs[v]) for v in conjugate}
    infos.update({u: VarInfo(POINT, tuple(jax.numpy.shape(held[u])), 0) for u in uncertain})
    infos.update({p: VarInfo(POINT, tuple(jax.numpy.shape(param_examples[p])), 0) for p in points})

    def symbolic(values, data=None):
        return log_factor({k: values[k] for k in conjugate + uncertain}, {p: values[p] for p in points}, data)

    example_values = {**{v: examples[v] for v in conjugate}, **held, **{p: param_examples[p] for p in points}}
    try:
        terms = analyse(
            symbolic, example_values, infos, data=tape.data_inputs(graph.data.arrays, lambda: graph.held_data),
            held=frozenset(uncertain),
        )
    except Unsupported as error:
        raise NonConjugate(uncertain[0], str(error)) from None
    left_out, closed = None, False
    if terms.residual:
        left_out, closed = _left_out(graph, qs, conjugate, uncertain, points, example_values, symbolic)
    needed = {p: stats_needed(terms.terms, p) for p in points + uncertain}
    if method == "auto":
        method = _auto(qs, uncertain)
        if method == "mc" and _separable_plate(graph, factor, qs, examples, uncertain):
            method = "quadrature"
    expectation = expectation_over(factor, qs, uncertain, method, num_samples, second_order=second_order)

    def estimate(rng_key, mean, params, arrays, batch=None):
        refuse_minibatch(factor, batch)
        analysis = arrays.factors[factor]
        point_layout = {p: point_stats(params[p], needed[p]) for p in points}

        def conditional(layout):
            def log_f(values):
                held = {u: point_stats(_constrain(qs[u], values[u]), needed[u]) for u in uncertain}
                value = expected_value(analysis, {**layout, **point_layout, **held}, None)
                if left_out is not None:  # the normaliser of the held values (Analysis.residual)
                    value = value + left_out(analysis, values, params, point_layout, held, arrays)
                return value

            return expectation(rng_key, mean, log_f)

        layout = {v: qs[v].to_value_layout(mean[v]) for v in conjugate}
        (value, uncertain_grads), grads = jax.value_and_grad(conditional, has_aux=True)(layout)
        return value, {**uncertain_grads, **{v: qs[v].from_value_layout(grads[v]) for v in conjugate}}

    return FactorEstimator(
        factor, tuple(node.neighbours), Method(conjugate, uncertain, method), estimate, terms, terms, closed_data=closed
    )


def _left_out(graph, qs, conjugate, uncertain, points, example_values, symbolic) -> tuple[Callable, bool]:
    """``((analysis, values, params, point_layout, held, arrays) -> h(u), closed)``: the part of log f that
    the analysis left out (a normaliser of the held values U alone, such as log B(a, b) of
    ``p ~ Beta(a, b)``), as log f(c0, u) - F(T(c0), u) at a fixed point c0 of the conjugate
    neighbours (the analysis's example): log f = F(T(c), u) + h(u) with F the analysis, affine
    in T(c), so h does not depend on c0. Differentiable in u (its site parameters), not in c.
    ``closed``: h reads the traced data as constants (the model needs them all as values)."""
    anchor = {v: example_values[v] for v in conjugate}
    anchor_layout = {
        v: qs[v].to_value_layout(qs[v].family.sufficient_stats(qs[v].value_to_family(jax.numpy.asarray(anchor[v]))))
        for v in conjugate
    }
    # The data as an argument, as the analysis took them (a refit's new data); the arrays the model
    # needs as values (graph.held_data) are None there, constants put back by the replay.
    closed = True  # the model needs every array as values: the traced data, as the analysis read them
    for data in (graph.data.arrays, with_held_data(graph, graph.held_data)):
        shapes = tuple(None if a is None else jax.ShapeDtypeStruct(jax.numpy.shape(a), a.dtype) for a in data)
        try:
            jax.eval_shape(lambda data: symbolic(example_values, data), shapes)
        except DATA_ERRORS:
            continue
        closed = False
        break

    def left_out(analysis, values, params, point_layout, held, arrays):
        point = {**anchor, **{u: _constrain(qs[u], values[u]) for u in uncertain}, **{p: params[p] for p in points}}
        whole = sum(jax.numpy.sum(x) for x in jax.tree.leaves(symbolic(point, None if closed else arrays.data)))
        return whole - expected_value(analysis, {**anchor_layout, **point_layout, **held}, None)

    return left_out, closed


def _constrain(q: Any, value: Any, run: Callable = lambda f: f) -> Any:
    """``value`` on the site's constrained space (``run``: how ``q.transform`` is called,
    :func:`~blrppl.compile_mode.probe` on the host)."""
    return value if q.transform is None else run(q.transform)(value)


def _separable_plate(graph: FactorGraph, factor: str, qs: Mapping[str, Any], examples: Mapping[str, Any], uncertain) -> bool:
    """Whether the estimated neighbours are one plated Gaussian (independent elements), or a
    scalar Gaussian and one such, in which log f is a sum of terms each touching one element of
    the plated one (a scale per group: ``Normal(loc, sigma[group])``; a global and a local
    scale: ``Normal(0, tau * lam)``), so that Gauss-Hermite takes every element at once with
    the same node (:func:`~blrppl.estimators.quadrature.gauss_hermite`, and its product with
    the scalar's rule, :func:`~blrppl.estimators.quadrature.gauss_hermite_product`):
    deterministic where Monte Carlo would be noisy. Checked on log f's Hessian in the plated
    variable at the example (random masks: :func:`~blrppl.estimators.nonconjugate.separable_blocks`)."""
    if not 1 <= len(uncertain) <= 2:
        return False
    diagonal = {u: qs[u].family.gaussian and not qs[u].family.chain and qs[u].family.event_ndim == 0 and not qs[u].joint
                for u in uncertain}
    plated = [u for u in uncertain if diagonal[u] and math.prod(qs[u].shape) >= 2]
    scalars = [u for u in uncertain if diagonal[u] and math.prod(qs[u].shape) == 1]
    if len(plated) != 1 or len(plated) + len(scalars) != len(uncertain):
        return False
    (u,) = plated
    node = graph.factors[factor]
    transforms = {v: qs[v].transform for v in node.neighbours if qs[v].transform is not None}
    fixed = {k: x for k, x in examples.items() if k not in node.neighbours}
    density = factor_log_density(graph, factor, transforms, fixed)
    try:
        return separable_blocks(density, examples, node.neighbours, u, num_axes=len(qs[u].shape))
    except Exception:  # noqa: BLE001 - no verdict: Monte Carlo, as before
        return False


def _auto(qs: Mapping[str, Any], uncertain: Sequence[str]) -> str:
    """Gauss-Hermite for one small Gaussian, the degree-5 cubature for a few
    Gaussian scalars (total dimension <= ``MAX_CUBATURE_DIM``), Monte Carlo otherwise."""
    gaussian = all(qs[u].family.gaussian and not qs[u].family.chain for u in uncertain)
    if len(uncertain) == 1 and gaussian:
        q = qs[uncertain[0]]
        if q.family.event_ndim == 1 and not q.num_batch and math.prod(q.block_shape) <= 2:
            return "quadrature"
        if q.family.event_ndim == 0 and math.prod(q.shape) == 1:
            return "quadrature"
    if gaussian and sum(math.prod(qs[u].shape) for u in uncertain) <= MAX_CUBATURE_DIM:
        return "cubature"
    return "mc"
