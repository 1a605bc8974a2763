"""Per-edge conjugacy verdicts, from the symbolic exact estimator.

An edge (factor, variable) is conjugate when the factor's expected log density
is affine in the variable's sufficient statistics, whatever the values of the
factor's other neighbours; the reason says why not otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from blrppl.estimators.exact import exact_estimator
from blrppl.graph.nodes import Edge, FactorGraph
from blrppl.symbolic.terms import NonConjugate


def record_verdicts(graph, name, qs, examples, init_params, error) -> None:
    """Fill the factor's edges: the failing variable with its reason, and the rest.

    The other neighbours are re-analysed with the failing variables held at
    fixed values: an edge is conjugate when the factor is affine in that
    variable's statistics whatever the others are.
    """
    node = graph.factors[name]
    failing = {error.var: error.reason}
    while True:
        remaining = [v for v in node.neighbours if v not in failing]
        if not remaining:
            break
        sub_qs = {v: qs[v] for v in remaining}
        sub_graph_factor = dataclasses.replace(node, neighbours=tuple(remaining))
        factors = dict(graph.factors)
        factors[name] = sub_graph_factor
        sub_graph = dataclasses.replace(graph, factors=factors)
        try:
            exact_estimator(sub_graph, name, {**qs, **sub_qs}, examples, init_params)
            break
        except NonConjugate as again:
            if again.var in failing or again.var is None:
                failing.update({v: again.reason for v in remaining})
                break
            failing[again.var] = again.reason
    for v in node.neighbours:
        if v in failing:
            reason = failing[v]
            transform = qs[v].transform if v in qs else None
            if transform is not None and "operation" in reason:
                reason += (
                    f" (the q of {v!r} is a Gaussian on the unconstrained space, and its "
                    f"{type(transform).__name__} to the site's support enters the factor)"
                )
            node.edges[v] = Edge(False, reason)
        else:
            node.edges[v] = Edge(True, "exact site parameter (given the other neighbours)")


def annotate(graph: FactorGraph) -> FactorGraph:
    """Fill every edge of ``graph`` with its conjugacy verdict and reason (in place)."""
    from blrppl.blr.variational import variable_q
    from blrppl.engines.base import _param_examples
    from blrppl.errors import ModelError
    from blrppl.estimators.base import example_latents, q_space_examples

    qs, missing = {}, {}
    for name, node in graph.variables.items():
        try:
            qs[name] = variable_q(node, graph.plates)
        except ModelError as error:
            missing[name] = str(error)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples(
        {k: v for k, v in example_latents(graph).items() if k in qs}, transforms
    )
    init_params, _ = _param_examples(graph)
    for name, node in graph.factors.items():
        absent = [v for v in node.neighbours if v in missing]
        if absent:
            for v in node.neighbours:
                node.edges[v] = Edge(None, f"not analysed: {missing[absent[0]]}")
            continue
        try:
            exact_estimator(graph, name, qs, examples, init_params)
        except NonConjugate as error:
            record_verdicts(graph, name, qs, examples, init_params, error)
            continue
        for v in node.neighbours:
            node.edges[v] = Edge(True, "exact site parameter")
    return graph
