"""The exact estimator: symbolic E_q[log f] and its gradient (Khan & Rue, Eq. 54).

For a conjugate-exponential factor, E_q[log f] under mean-field q is affine in
each neighbour's mean parameters; :mod:`blrppl.symbolic` derives it from the
model's own code once, and every step evaluates it with a few einsums. The
site parameter is then literally ``jax.grad`` of it with respect to the
neighbour's mean parameters: exact, with no sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from blrppl.graph import tape
from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, var_info
from blrppl.graph.nodes import FactorGraph
from blrppl.symbolic.canonical import Unsupported
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import (
    POINT,
    VarInfo,
    contract_fixed_reads,
    expected_value,
    point_stats,
    stats_needed,
)
from blrppl.symbolic.terms import NonConjugate


def exact_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    param_examples: Mapping[str, Any],
    observation_plate: Any = None,
) -> FactorEstimator:
    """Build the exact estimator of one factor, or raise :class:`NonConjugate`.

    Args:
      graph: the traced model.
      factor: the factor's name.
      qs: variable name -> :class:`~blrppl.families.layout.VariableQ`.
      examples: latent values in q's space (for shapes, and the fixed values
        of latents the factor does not touch).
      param_examples: point-estimate name -> value (``numpyro.param`` sites
        and sites estimated by the delta method are symbolic points).
      observation_plate: a subsampled plate the factor sits in; the analysis
        then keeps its observations apart so that ``estimate(..., batch=idx)``
        reads a minibatch (the unscaled minibatch sum).
    """
    node = graph.factors[factor]
    neighbours = tuple(node.neighbours)
    points = tuple(p for p in node.param_neighbours if p in param_examples)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    fixed = {k: v for k, v in examples.items() if k not in neighbours}
    log_factor = factor_log_density(graph, factor, transforms, fixed, observation_plate=observation_plate, per_site=True)
    infos = {v: var_info(qs[v]) for v in neighbours}
    for p in points:
        infos[p] = VarInfo(POINT, tuple(jax.numpy.shape(param_examples[p])), 0)

    def symbolic(values, data=None):
        latent = {k: values[k] for k in neighbours}
        params = {k: values[k] for k in points}
        return log_factor(latent, params, data)

    example_values = {v: examples[v] for v in neighbours}
    example_values.update({p: param_examples[p] for p in points})
    try:
        # While a plan is recorded, the data are inputs of the analysis (blrppl.graph.tape).
        terms = analyse(symbolic, example_values, infos, data=tape.data_inputs(graph.data.arrays, lambda: graph.held_data))
    except Unsupported as error:
        raise NonConjugate(neighbours[0] if neighbours else None, str(error)) from None
    needed = {p: stats_needed(terms.terms, p) for p in points}

    def points_layout(params):
        return {p: point_stats(params[p], needed[p]) for p in points}

    def estimate(rng_key, mean, params, arrays, batch=None):
        del rng_key  # Exact: no randomness.
        analysis = arrays.factors[factor]
        layout = {v: qs[v].to_value_layout(mean[v]) for v in neighbours}
        point_layout = points_layout(params)

        def expected(layout):
            return expected_value(analysis, {**layout, **point_layout}, batch)

        value, grads = jax.value_and_grad(expected)(layout)
        return value, {v: qs[v].from_value_layout(grads[v]) for v in neighbours}

    # E_q[log f] is affine in μ when no term reads two latent statistics: its terms that read
    # none are then c_f = E_q[log f] - <λ̃_f, μ>, constant in q.
    affine = all(sum(r.var not in points for r in t.reads) <= 1 for t in terms.terms)

    def constant(params, arrays):
        analysis = arrays.factors[factor]
        kept = tuple(t for t in analysis.terms if all(r.var in points for r in t.reads))
        point_layout = points_layout(params)
        return expected_value(dataclasses.replace(analysis, terms=kept), point_layout)

    def at_points(mean, arrays):
        layout = {v: qs[v].to_value_layout(mean[v]) for v in neighbours}
        reduced = contract_fixed_reads(arrays.factors[factor], layout, points)
        return lambda params: expected_value(reduced, points_layout(params))

    return FactorEstimator(
        factor, neighbours, Method(exact=neighbours), estimate, terms, terms,
        constant=constant if affine else None, at_points=at_points,
    )
