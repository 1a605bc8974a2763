"""Latent sites estimated by the delta method (``point_estimates=[...]``).

EM's point estimates (Khan & Rue, Sec. 5.2): q(θ) = N(θ | θ_t, I) with a fixed
covariance, so only the location moves and the constant entropy drops out of
the bound. A latent sample site listed in ``point_estimates`` leaves the set
of q variables and joins the ``numpyro.param`` sites: the factors that touch it
(its own prior included, so the M-step is a MAP step) read its value, and the
M-step maximises their expected log density over it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp

from blrppl.errors import ModelError
from blrppl.graph.nodes import FactorGraph, ParamNode


def as_point_estimates(graph: FactorGraph, sites: Sequence[str]) -> FactorGraph:
    """Move latent ``sites`` from the graph's variables to its point estimates."""
    if not sites:
        return graph
    variables = dict(graph.variables)
    params = dict(graph.params)
    for site in sites:
        node = variables.pop(site, None)
        if node is None:
            raise ModelError(
                f"site {site!r}: point_estimates names a site that is not a latent variable of the "
                f"model; use one of {sorted(graph.variables)}."
            )
        if node.chain is not None or node.discrete:
            raise ModelError(
                f"site {site!r}: only continuous, non-chain latent sites can be point estimates; "
                "remove it from point_estimates."
            )
        init = node.prior.mean if node.transform is None else None
        if init is None or not bool(jnp.all(jnp.isfinite(jnp.asarray(init)))):
            init = node.transform(jnp.zeros(node.transform.inverse_shape(node.shape)))
        params[site] = ParamNode(site, tuple(node.shape), node.support, jnp.broadcast_to(jnp.asarray(init), node.shape))
    factors = {}
    for name, factor in graph.factors.items():
        moved = tuple(v for v in factor.neighbours if v in sites)
        if not moved:
            factors[name] = factor
            continue
        factors[name] = dataclasses.replace(
            factor,
            neighbours=tuple(v for v in factor.neighbours if v not in sites),
            param_neighbours=factor.param_neighbours + moved,
            edges={v: e for v, e in factor.edges.items() if v not in sites},
        )
    return dataclasses.replace(graph, variables=variables, factors=factors, params=params)
