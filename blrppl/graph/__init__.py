"""Tracing NumPyro models into factor graphs (the only place handlers appear).

``build_graph(model, args, kwargs)`` returns a :class:`FactorGraph` (the
user-facing ``blrppl.trace`` adds each edge's conjugacy verdict); ``replay``
re-runs the model at given latent values to evaluate factors.
"""

from blrppl.graph.nodes import (
    ChainInfo,
    DeterministicNode,
    Edge,
    FactorGraph,
    FactorNode,
    ParamNode,
    Plate,
    VariableNode,
)
from blrppl.graph.replay import ReplayedSite, replay
from blrppl.graph.trace import build_graph

__all__ = [
    "ChainInfo",
    "DeterministicNode",
    "Edge",
    "FactorGraph",
    "FactorNode",
    "ParamNode",
    "Plate",
    "ReplayedSite",
    "VariableNode",
    "build_graph",
    "replay",
]
