"""to_networkx and draw."""

import jax.numpy as jnp
import matplotlib.pyplot as plt
import networkx as nx
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.graph.nodes import Edge


def _model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def test_to_networkx_keys_attributes_and_edges():
    fg = blrppl.trace(_model, jnp.zeros(4))
    fg.factors["y"].edges["mu"] = Edge(conjugate=True, reason="Normal likelihood in the mean")
    g = fg.to_networkx()
    assert nx.is_bipartite(g)
    assert set(g.nodes) == {
        ("variable", "mu"),
        ("variable", "tau"),
        ("factor", "mu"),
        ("factor", "tau"),
        ("factor", "y"),
    }
    mu = g.nodes[("variable", "mu")]
    assert (mu["kind"], mu["name"], mu["family"], mu["shape"], mu["plates"], mu["observed"]) == (
        "variable",
        "mu",
        "Normal",
        (),
        (),
        False,
    )
    y = g.nodes[("factor", "y")]
    assert (y["kind"], y["name"], y["observed"], y["plates"], y["shape"], y["factor_kind"]) == (
        "factor",
        "y",
        True,
        ("N",),
        (4,),
        "likelihood",
    )
    assert {n for n, d in g.nodes(data=True) if d["bipartite"] == 0} == {
        ("variable", "mu"),
        ("variable", "tau"),
    }
    edge = g.edges[("factor", "y"), ("variable", "mu")]
    assert edge == {"conjugate": True, "reason": "Normal likelihood in the mean"}
    assert g.edges[("factor", "y"), ("variable", "tau")]["conjugate"] is True  # filled by trace
    assert g.degree[("factor", "y")] == 2


def test_draw_returns_axes():
    fg = blrppl.trace(_model, jnp.zeros(4))
    ax = fg.draw()
    assert ax.figure is not None
    fig, ax2 = plt.subplots()
    assert fg.draw(ax2, with_labels=False) is ax2
    plt.close("all")
