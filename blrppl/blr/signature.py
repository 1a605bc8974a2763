"""What a compiled fit closes over: the plan's signature, and the data it holds as constants.

Plans with equal signatures share one compiled algorithm (``Engine.build``), so
the signature names everything static in a plan: q's families, shapes and
transforms, the estimators and the structure of their arrays, and the data's
shapes, or their content where compiled code holds them as constants (a model
that needs concrete data values while it runs: :mod:`blrppl.graph.concrete`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from blrppl.graph.data import content_digest

if TYPE_CHECKING:
    from blrppl.blr.plan import Plan


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
