"""A :class:`~blrppl.graph.nodes.FactorGraph` as a networkx graph, and a picture of it.

:func:`to_networkx` returns a bipartite ``networkx.Graph``. Node keys are
``("variable", name)`` and ``("factor", name)``; every node has the
attributes ``kind`` (``"variable"`` or ``"factor"``), ``name`` (the site
name) and ``bipartite`` (0 for variables, 1 for factors, networkx's
convention), plus:

* variables: ``family``, ``shape``, ``plates``, ``observed`` (always False),
  ``discrete``, ``chain`` (the chain's sites, or None);
* factors: ``factor_kind`` (``"prior"``, ``"likelihood"``, ``"factor"``),
  ``distribution`` (class name), ``shape`` (the site's value shape),
  ``plates``, ``observed``, ``params`` (``numpyro.param`` neighbours).

Edges join a factor to the latent variables it depends on and carry the
conjugacy slot: ``conjugate`` (None until analysed, then a bool) and
``reason``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import networkx as nx
import numpy as np

if TYPE_CHECKING:
    from blrppl.graph.nodes import FactorGraph


def to_networkx(graph: "FactorGraph") -> nx.Graph:
    """The factor graph as a bipartite ``networkx.Graph`` (see the module docstring)."""
    g = nx.Graph()
    for name, v in graph.variables.items():
        g.add_node(
            ("variable", name),
            kind="variable",
            name=name,
            bipartite=0,
            family=v.family,
            shape=tuple(v.shape),
            plates=tuple(v.plates),
            observed=False,
            discrete=v.discrete,
            chain=None if v.chain is None else tuple(v.chain.sites),
        )
    for name, f in graph.factors.items():
        g.add_node(
            ("factor", name),
            kind="factor",
            name=name,
            bipartite=1,
            factor_kind=f.kind,
            distribution=type(f.distribution).__name__,
            shape=tuple(f.distribution.shape()),
            plates=tuple(f.plates),
            observed=f.observed,
            params=tuple(f.param_neighbours),
        )
        for var in f.neighbours:
            edge = f.edges.get(var)
            g.add_edge(
                ("factor", name),
                ("variable", var),
                conjugate=None if edge is None else edge.conjugate,
                reason="" if edge is None else edge.reason,
            )
    return g


def _layout(g: nx.Graph) -> dict:
    """Graphviz's ``dot`` layout when pygraphviz or pydot is installed, else a bipartite one."""
    for module in ("nx_agraph", "nx_pydot"):
        try:
            return getattr(nx, module).graphviz_layout(g, prog="dot")
        except Exception:  # graphviz or its Python binding is not installed
            continue
    variables = [n for n, d in g.nodes(data=True) if d["kind"] == "variable"]
    if not variables:
        return nx.circular_layout(g)
    return nx.bipartite_layout(g, variables, align="horizontal")


def draw(graph: "FactorGraph", ax: Optional[Any] = None, *, with_labels: bool = True) -> Any:
    """Draw the factor graph with matplotlib: variables as circles, factors as squares.

    Latent variables are white circles labelled ``name`` and family; factors
    are small squares, filled grey for observed sites. Graphviz lays the graph
    out when installed (``pygraphviz`` or ``pydot``).

    Args:
        graph: a traced factor graph.
        ax: a matplotlib Axes to draw on; a new figure when None.
        with_labels: label the nodes.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    g = to_networkx(graph)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 1.2 * max(len(g), 2) ** 0.5 * 2, 4))
    pos = _layout(g)
    variables = [n for n, d in g.nodes(data=True) if d["kind"] == "variable"]
    observed = [n for n, d in g.nodes(data=True) if d["kind"] == "factor" and d["observed"]]
    latent_factors = [
        n for n, d in g.nodes(data=True) if d["kind"] == "factor" and not d["observed"]
    ]
    nx.draw_networkx_edges(g, pos, ax=ax, edge_color="0.4")
    nx.draw_networkx_nodes(
        g,
        pos,
        nodelist=variables,
        node_shape="o",
        node_color="white",
        edgecolors="black",
        node_size=1400,
        ax=ax,
    )
    for nodes, colour in ((latent_factors, "white"), (observed, "0.6")):
        nx.draw_networkx_nodes(
            g,
            pos,
            nodelist=nodes,
            node_shape="s",
            node_color=colour,
            edgecolors="black",
            node_size=250,
            ax=ax,
        )
    if with_labels:
        labels = {
            n: f"{d['name']}\n{d['family']}"
            for n, d in g.nodes(data=True)
            if d["kind"] == "variable"
        }
        nx.draw_networkx_labels(g, pos, labels=labels, font_size=7, ax=ax)
        factor_pos = {
            n: np.asarray(pos[n]) + np.array([0.0, -0.06 * _span(pos)])
            for n in g
            if n[0] == "factor"
        }
        factor_labels = {n: d["name"] for n, d in g.nodes(data=True) if d["kind"] == "factor"}
        nx.draw_networkx_labels(g, factor_pos, labels=factor_labels, font_size=7, ax=ax)
    ax.set_axis_off()
    return ax


def _span(pos: dict) -> float:
    coords = np.asarray(list(pos.values()), dtype=float)
    if coords.size == 0:
        return 1.0
    extent = float(np.ptp(coords[:, 1]))
    return extent if extent > 0 else 1.0
