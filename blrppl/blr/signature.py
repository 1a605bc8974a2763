"""What a compiled fit closes over: the plan's signature, and the data it holds as constants.

Plans with equal signatures share one compiled algorithm (``Engine.build``), so
the signature names everything static in a plan: q's families, shapes and
transforms, the estimators and the structure of their arrays, and the data's
shapes, or their content where compiled code holds them as constants (a model
that needs concrete data values while it runs: :func:`held_data`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import numpy as np

from blrppl.estimators.base import example_latents
from blrppl.graph.data import DATA_ERRORS, content_digest
from blrppl.graph.nodes import FactorGraph
from blrppl.graph.replay import replay

if TYPE_CHECKING:
    from blrppl.blr.plan import Plan


def held_data(graph: FactorGraph, params: Mapping[str, Any]) -> tuple[int, ...]:
    """The positions of the model's arrays that must stay concrete while it runs (``()``: none).

    The model runs with every array abstract (as compiled code passes them); where
    that fails, with each array abstract alone: those that fail alone are held, and
    the others are checked abstract together (else every array is held).
    """
    data = graph.data
    if not data.arrays:
        return ()
    values = {}
    for v, value in example_latents(graph).items():
        if isinstance(value, dict):  # a joint block: its member sites
            values.update(value)
        else:
            values[v] = value

    def traceable(positions: Sequence[int]) -> bool:
        def run(abstract):
            arrays = list(data.arrays)
            for i, array in zip(positions, abstract):
                arrays[i] = array
            sites = replay(graph, values, params, data=arrays)
            return [site.value for site in sites.values()]

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jax.eval_shape(run, [data.arrays[i] for i in positions])
        except DATA_ERRORS:
            return False
        return True

    everything = tuple(range(len(data.arrays)))
    if traceable(everything):
        return ()
    held = tuple(i for i in everything if not traceable((i,)))
    rest = tuple(i for i in everything if i not in held)
    return held if rest and traceable(rest) else everything


def plan_signature(plan: Plan) -> tuple:
    """Everything a compiled fit closes over, as a hashable value (see :class:`Plan`)."""
    graph = plan.graph
    variables = tuple(
        (v, q.family.name, q.shape, q.num_batch, q.num_categories, q.joint, content_digest(q.transform)) for v, q in plan.qs.items()
    )
    factors = tuple(
        (est.factor, est.neighbours, est.method, _structure(est.arrays)) for est in plan.estimators + plan.start_estimators
    )
    nodes = tuple(
        (n.name, n.kind, n.plates, n.param_neighbours, type(n.distribution).__name__) for n in graph.factors.values()
    )
    data = graph.data
    closed = plan.data_static or any(est.closed_data for est in plan.estimators)
    data_key = content_digest(data.arrays) if closed else data.signature
    if plan.held_data and not closed:
        data_key = (data_key, content_digest([data.arrays[i] for i in plan.held_data]))
    params = tuple((k, _structure(v), content_digest(plan.param_transforms[k])) for k, v in plan.init_params.items())
    subsample = None
    if plan.subsample is not None:
        s = plan.subsample
        subsample = (s.plate, tuple(sorted(s.local_axes.items())), tuple(sorted(s.plate_factors)))
    return (
        id(getattr(graph.model, "__wrapped__", graph.model)),
        variables,
        factors,
        nodes,
        tuple(graph.deterministics),
        tuple(sorted(plan.imputed)),
        tuple((v, content_digest(m)) for v, m in sorted(plan.orphans.items())),
        data_key,
        params,
        subsample,
        _structure(plan.arrays.starts),
    )


def _structure(tree: Any) -> tuple:
    """A tree's structure (compared by value, static index arrays included) and leaf shapes."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((tuple(np.shape(x)), str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)) for x in leaves))
