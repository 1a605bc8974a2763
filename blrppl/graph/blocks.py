"""Joint Gaussian blocks over several sites (``blocks=[("mu", "tau", "theta")]``).

A block is one variable whose q is a full-covariance Gaussian over the
concatenated unconstrained values of its sites (each mapped by numpyro's
``biject_to`` of its support; log-Jacobians are added to each site's own prior
factor). :class:`BlockTransform` packs and unpacks the flat vector;
:func:`as_blocks` rewrites a traced graph so that factors point at blocks.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from blrppl.errors import ModelError
from blrppl.graph.nodes import Edge, FactorGraph, VariableNode


@dataclasses.dataclass(frozen=True, eq=False)
class BlockTransform:
    """Flat unconstrained vector <-> the block's site values (constrained)."""

    nodes: tuple  # VariableNodes of the member sites

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def pieces(self):
        """Per member: ``(node, transform, unconstrained shape, offset, size)`` in the flat vector."""
        offset = 0
        for node in self.nodes:
            transform = node.transform if node.transform is not None else biject_to(constraints.real)
            shape = tuple(transform.inverse_shape(tuple(node.shape)))
            size = math.prod(shape)
            yield node, transform, shape, offset, size
            offset += size

    @property
    def size(self) -> int:
        return sum(size for *_, size in self.pieces())

    def inverse_shape(self, shape: Any) -> tuple[int, ...]:
        del shape
        return (self.size,)

    def unconstrained(self, flat: Any) -> dict:
        """Flat vector -> site name -> unconstrained value (leading sample dims kept)."""
        lead = jnp.shape(flat)[:-1]
        return {
            node.name: jnp.reshape(flat[..., offset : offset + size], lead + shape)
            for node, _, shape, offset, size in self.pieces()
        }

    def __call__(self, flat: Any) -> dict:
        """Flat vector -> site name -> value in the site's support."""
        parts = self.unconstrained(flat)
        return {node.name: transform(parts[node.name]) for node, transform, *_ in self.pieces()}

    def log_abs_det_jacobian_site(self, flat: Any, site: str) -> Any:
        """log |det J| of one member's transform at the flat vector."""
        parts = self.unconstrained(flat)
        for node, transform, *_ in self.pieces():
            if node.name == site:
                u = parts[site]
                return jnp.sum(transform.log_abs_det_jacobian(u, transform(u)))
        raise KeyError(site)

    def inv(self, values: Mapping[str, Any]) -> Any:
        """Site values (constrained) -> the flat unconstrained vector."""
        flat = [jnp.ravel(transform.inv(jnp.asarray(values[node.name]))) for node, transform, *_ in self.pieces()]
        return jnp.concatenate(flat)


def block_name(sites: Sequence[str]) -> str:
    """The name of a block variable: its sites joined by '+'."""
    return "+".join(sites)


def as_blocks(graph: FactorGraph, blocks: Sequence[Sequence[str]]) -> FactorGraph:
    """Replace the named sites by joint block variables (see the module docstring)."""
    if not blocks:
        return graph
    variables = dict(graph.variables)
    seen: set = set()
    renames: dict = {}
    for block in blocks:
        sites = tuple(block)
        if len(sites) < 1:
            raise ModelError("site '?': an empty block in blocks=[...]; list the sites of each block.")
        nodes = []
        for site in sites:
            node = variables.get(site)
            if node is None:
                raise ModelError(
                    f"site {site!r}: blocks names a site that is not a latent variable of the model; "
                    f"use some of {sorted(graph.variables)}."
                )
            if site in seen:
                raise ModelError(f"site {site!r}: the site is in two blocks; put it in one.")
            if node.discrete or node.chain is not None:
                raise ModelError(
                    f"site {site!r}: only continuous, non-chain sites can join a Gaussian block; "
                    "remove it from blocks."
                )
            seen.add(site)
            nodes.append(_as_unconstrained(node))
        name = block_name(sites)
        transform = BlockTransform(tuple(nodes))
        for site in sites:
            variables.pop(site)
            renames[site] = name
        variables[name] = VariableNode(
            name=name,
            family="MultivariateNormal",
            shape=(transform.size,),
            batch_shape=(),
            event_shape=(transform.size,),
            plates=(),
            support=constraints.real_vector,
            transform=transform,
            prior=None,
            discrete=False,
            members=tuple(nodes),
        )
    factors = {}
    for fname, factor in graph.factors.items():
        neighbours = tuple(dict.fromkeys(renames.get(v, v) for v in factor.neighbours))
        if neighbours == factor.neighbours:
            factors[fname] = factor
            continue
        edges = {v: factor.edges.get(v, Edge()) for v in neighbours}
        members = factor.block_members + tuple(v for v in factor.neighbours if v in renames)
        factors[fname] = dataclasses.replace(factor, neighbours=neighbours, edges=edges, block_members=members)
    return dataclasses.replace(graph, variables=variables, factors=factors)


def _as_unconstrained(node: VariableNode) -> VariableNode:
    """The member node with its transform to the support (identity on reals)."""
    if node.transform is not None:
        return node
    return dataclasses.replace(node, transform=biject_to(node.support))
