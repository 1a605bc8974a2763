"""Tracing NumPyro models into factor graphs (the only place handlers appear).

``trace(model, *args, **kwargs)`` returns a :class:`FactorGraph`; engines call
``build_graph`` (the same, with per-site family overrides) and ``replay`` (the
model re-run at given latent values) to evaluate factors.
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
from blrppl.graph.trace import build_graph, trace

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
    "trace",
]
