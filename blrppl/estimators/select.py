"""Choosing each factor's estimator, and the per-edge conjugacy verdicts.

A factor gets exact site parameters where its expected log density is affine in
its neighbours' sufficient statistics (the symbolic estimator succeeds);
otherwise, depending on the options, the exact part of a hybrid factor plus an
estimated part, a fully estimated factor, or a :class:`~blrppl.ModelError`
naming the edge and why it is not conjugate. The verdicts are a value
(factor -> variable -> :class:`~blrppl.graph.nodes.Edge`) returned with the
estimators; nothing here writes into the graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Optional, Union

from blrppl.errors import ModelError
from blrppl.estimators.base import ESTIMATORS, FactorEstimator
from blrppl.estimators.block_hybrid import block_hybrid_estimator
from blrppl.estimators.conditional_enumeration import conditionally_exact_estimator
from blrppl.estimators.enumeration import is_enumerable
from blrppl.estimators.exact import exact_estimator
from blrppl.estimators.hybrid import hybrid_estimator
from blrppl.estimators.minibatch import fixed_subsample, on_rows
from blrppl.estimators.nonconjugate import nonconjugate_estimator
from blrppl.graph.nodes import Edge, FactorGraph
from blrppl.symbolic.terms import NonConjugate

Verdicts = dict
"""factor name -> {variable name -> :class:`~blrppl.graph.nodes.Edge`}."""


class EstimatorOptions(NamedTuple):
    """How factors get their site parameters (the estimator part of a preset).

    Attributes:
      choice: ``"exact"`` (exact where conjugate, ``fallback`` elsewhere),
        ``"auto"``, ``"delta"``, ``"mc"``, ``"quadrature"``, or a dict
        ``{factor: one of these}`` (other factors ``"exact"``).
      fallback: the estimator for non-conjugate factors when the choice is
        ``"exact"`` (None: non-conjugate factors are an error).
      exact_only: every factor must have exact site parameters.
      forced: every factor uses this estimator, conjugate or not (Laplace's
        delta method).
      num_samples: Monte Carlo draws per step.
    """

    choice: Union[str, Mapping[str, str]] = "exact"
    fallback: Optional[str] = None
    exact_only: bool = False
    forced: Optional[str] = None
    num_samples: int = 16


def _choice(options: EstimatorOptions, factor: str) -> str:
    if isinstance(options.choice, Mapping):
        return options.choice.get(factor, "exact")
    return options.choice


def factor_verdicts(graph: FactorGraph, name: str, qs, examples, params, error: NonConjugate) -> dict:
    """The edges of a non-conjugate factor: which neighbours fail, and why.

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
        factors = dict(graph.factors)
        factors[name] = dataclasses.replace(node, neighbours=tuple(remaining))
        sub_graph = graph.with_factors(factors)
        try:
            exact_estimator(sub_graph, name, qs, examples, params)
            break
        except NonConjugate as again:
            if again.var in failing or again.var is None:
                failing.update({v: again.reason for v in remaining})
                break
            failing[again.var] = again.reason
    edges = {}
    for v in node.neighbours:
        if v in failing:
            reason = failing[v]
            transform = qs[v].transform if v in qs else None
            if transform is not None and ("operation" in reason or "exp(" in reason):
                reason += (
                    f" (the q of {v!r} is a Gaussian on the unconstrained space, and its "
                    f"{type(transform).__name__} to the site's support enters the factor)"
                )
            edges[v] = Edge(False, reason)
        else:
            edges[v] = Edge(True, "exact site parameter (given the other neighbours)")
    return edges


def exact_verdicts(graph: FactorGraph, name: str) -> dict:
    """Every edge of a factor with exact site parameters."""
    return {v: Edge(True, "exact site parameter") for v in graph.factors[name].neighbours}


def graph_verdicts(graph: FactorGraph, qs: Mapping[str, Any], missing: Mapping[str, str], examples, params) -> Verdicts:
    """The conjugacy verdict of every edge of ``graph`` (what ``blrppl.trace`` reports).

    Args:
      qs: variable -> its q, for the variables that have one.
      missing: variable -> why it has no q (its edges are reported as not analysed).
      examples: latent values in q's space; params: point-estimate values.
    """
    verdicts: Verdicts = {}
    for name, node in graph.factors.items():
        absent = [v for v in node.neighbours if v in missing]
        if absent:
            verdicts[name] = {v: Edge(None, f"not analysed: {missing[absent[0]]}") for v in node.neighbours}
            continue
        try:
            exact_estimator(graph, name, qs, examples, params)
        except NonConjugate as error:
            verdicts[name] = factor_verdicts(graph, name, qs, examples, params, error)
            continue
        verdicts[name] = exact_verdicts(graph, name)
    return verdicts


def choose_estimator(
    graph: FactorGraph,
    name: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    params: Mapping[str, Any],
    options: EstimatorOptions,
    plate: Any = None,
    subsample: Any = None,
) -> tuple[FactorEstimator, dict]:
    """One factor's estimator and the verdicts of its edges.

    ``plate``: the full-size plate of the exact analysis of a factor in a
    subsampled plate; ``subsample``: that plate with its minibatch size
    (N, M), which estimated factors read minibatches of (stochastic VI).

    Raises:
      ModelError: for a non-conjugate factor where only exact site parameters
        are allowed, naming the edge, the reason and the engines that fit it.
    """
    node = graph.factors[name]
    choice = _choice(options, name)
    explicit = isinstance(options.choice, Mapping) and name in options.choice
    unknown = {v: Edge() for v in node.neighbours}
    if options.forced is not None:
        estimator = nonconjugate_estimator(
            graph, name, qs, examples, options.forced, options.num_samples, "Laplace", subsample
        )
        return estimator, unknown
    if explicit and choice in ESTIMATORS + ("auto",) and not options.exact_only:
        estimator = nonconjugate_estimator(
            graph, name, qs, examples, choice, options.num_samples, "chosen by the user", subsample
        )
        return estimator, unknown
    try:
        return exact_estimator(graph, name, qs, examples, params, plate), exact_verdicts(graph, name)
    except NonConjugate as error:
        edges = factor_verdicts(graph, name, qs, examples, params, error)
        var = error.var
        reason = edges[var].reason if var in edges else error.reason
    uncertain = tuple(v for v in node.neighbours if edges[v].conjugate is False)
    if subsample is None and uncertain and all(is_enumerable(qs[v]) for v in uncertain):
        try:  # conjugate given the discrete neighbours: exact, one analysis per configuration
            return conditionally_exact_estimator(graph, name, qs, examples, uncertain), edges
        except NonConjugate:
            pass
    method = choice if choice != "exact" else options.fallback
    if method is None or options.exact_only:
        engines = (
            "SVI(model, estimator='auto') on minibatches, NonConjugateVI on full data"
            if subsample is not None
            else "NonConjugateVI, or BLR with estimator='mc', 'delta' or 'quadrature'"
        )
        raise ModelError(
            f"site {name!r}: the factor is not conjugate in {var!r} ({reason}); "
            f"use an engine with non-conjugate estimators ({engines}) or rewrite the model with conjugate priors."
        )
    if method in ("auto", "quadrature") and any(qs[v].joint for v in node.neighbours):
        try:  # one large joint block: exact given its few transformed coordinates, Gauss-Hermite in those
            return block_hybrid_estimator(graph, name, qs, examples), edges
        except (NonConjugate, ModelError):
            pass
    # On minibatches a hybrid factor is estimated in every edge (its exact part on a
    # minibatch is not implemented); on full data only the non-conjugate edges are.
    if 0 < len(uncertain) < len(node.neighbours) and subsample is None:
        try:
            estimator = hybrid_estimator(graph, name, qs, examples, params, uncertain, method, options.num_samples)
            return estimator, edges
        except (NonConjugate, ModelError):
            pass  # No exact part survives holding the uncertain neighbours: estimate every edge.
    if params and node.param_neighbours:
        raise ModelError(
            f"site {name!r}: the factor is not conjugate in {var!r} ({reason}) and touches "
            f"point estimates {list(node.param_neighbours)}; EM needs exact expected log factors."
        )
    return nonconjugate_estimator(graph, name, qs, examples, method, options.num_samples, reason, subsample), edges


def with_verdicts(graph: FactorGraph, verdicts: Verdicts) -> FactorGraph:
    """A copy of ``graph`` whose factors carry ``verdicts`` (the graph itself is unchanged)."""
    factors = {
        name: dataclasses.replace(node, edges={**node.edges, **verdicts.get(name, {})})
        for name, node in graph.factors.items()
    }
    return graph.with_factors(factors)


def delta_estimator(
    graph: FactorGraph,
    estimator: FactorEstimator,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    params: Mapping[str, Any],
    num_samples: int,
) -> Optional[FactorEstimator]:
    """The delta-method (Newton) version of an estimated factor, for starting q near the mode.

    Returns None when the factor is exact, or when an estimated neighbour is
    not Gaussian (its site parameters would stay Monte Carlo, too noisy for
    a guarded Newton start). A minibatch factor's start reads a fixed
    subsample of M rows, rescaled to N
    (:func:`~blrppl.estimators.minibatch.on_rows`): never a pass over all rows.
    """
    method = estimator.method
    if not method.estimated or any(not qs[v].family.gaussian for v in method.estimated):
        return None
    if estimator.delta is not None:  # a GLM's: by its linear predictors, one pass over the rows
        return estimator.delta
    name = estimator.factor
    plate = estimator.subsample
    if method.exact:
        try:
            return hybrid_estimator(
                graph, name, qs, examples, params, method.estimated, "delta", num_samples, second_order=False
            )
        except (NonConjugate, ModelError):
            return None
    start = nonconjugate_estimator(graph, name, qs, examples, "delta", num_samples, "start", plate)
    if plate is None:
        return start
    rows = fixed_subsample(plate.size, plate.subsample_size)
    return start._replace(estimate=on_rows(start.estimate, rows, plate.size / len(rows)))
