"""Nodes of a traced factor graph: static metadata, kept apart from arrays.

A :class:`FactorGraph` is bipartite: latent variables (one per latent sample
site, or one per latent chain) and factors (one per sample site: the prior of
a latent, the likelihood of an observation, or a ``numpyro.factor`` term).
Nodes are frozen dataclasses; engines close over them (they are static).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import numpy as np

from blrppl.graph.data import split_model_data


@dataclasses.dataclass(frozen=True)
class Plate:
    """A ``numpyro.plate``: its full size N and the batch size M it draws.

    ``scale`` is N / M, the factor by which a minibatch's log density is
    rescaled (1 without subsampling). ``dim`` is numpyro's (negative) batch
    dimension of the plate.
    """

    name: str
    size: int
    subsample_size: int
    dim: int

    @property
    def scale(self) -> float:
        return self.size / self.subsample_size

    @property
    def subsampled(self) -> bool:
        return self.subsample_size < self.size


@dataclasses.dataclass(frozen=True)
class Edge:
    """The (factor, variable) edge's conjugacy verdict and its reason.

    ``conjugate`` is ``None`` until the exact estimator has analysed the
    factor; then ``True`` (an exact site parameter exists) or ``False`` with a
    ``reason`` a user can read (``"jnp.exp of 'beta' is not a sufficient
    statistic of its Normal q"``).
    """

    conjugate: Optional[bool] = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class ChainInfo:
    """Time-series structure of a chain variable.

    ``sites`` are the numpyro sites joined into the chain, in order (an
    initial-state site, then the site holding the stacked states; or, for a
    Python loop, one site per time step). ``length`` is the number of time
    steps T (initial state included), ``state_shape`` the shape of one state
    (``()`` for scalar, ``(d,)`` for vectors), ``batch_shape`` the shape of
    independent sequences side by side (plates: ``(N,)`` for N sequences),
    and ``time_axis`` the axis of the stacked site value that indexes time.
    ``kind`` names how the chain was written: ``"GaussianRandomWalk"``,
    ``"GaussianStateSpace"``, ``"scan"`` or ``"markov"`` (a Python loop, under
    ``numpyro.markov`` or not).

    The chain variable's value is ``batch_shape + (length,) + state_shape``
    (sequences first, then time): :func:`blrppl.graph.replay.split_latents`
    moves time back to ``time_axis`` of each site.
    """

    sites: tuple[str, ...]
    length: int
    state_shape: tuple[int, ...]
    time_axis: int
    kind: str
    batch_shape: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        """The chain variable's value shape: batch, time, state."""
        return tuple(self.batch_shape) + (self.length,) + tuple(self.state_shape)


@dataclasses.dataclass(frozen=True)
class VariableNode:
    """A latent variable: one latent sample site, or one chain of them.

    Attributes:
        name: the site name (for a chain: the site holding the stacked states).
        family: the q family's name (``"Normal"``, ``"MultivariateNormal"``,
            ``"Gamma"``, ``"InverseGamma"``, ``"Beta"``, ``"Dirichlet"``,
            ``"Categorical"``, ``"Bernoulli"``, ``"Wishart"``,
            ``"ChainGaussian"``, ``"ChainCategorical"``).
        shape: the site value's shape (batch + event) in its own support.
        batch_shape: the prior's batch shape (plates and independent dims).
        event_shape: the prior's event shape.
        plates: names of the plates the site sits in, outermost first.
        support: the prior's support (a numpyro constraint).
        transform: for a Gaussian q on an unconstrained space, the numpyro
            transform from that space to ``support`` (``biject_to``); else None.
        prior: the prior distribution as traced (numpyro Distribution).
        discrete: True for a discrete site (finite support).
        chain: time-series structure for chain variables, else None.
        observed_mask: for the ``y_unobserved`` latent of an ``obs_mask`` site,
            the boolean mask of observed positions (those positions carry no
            q); else None.
        members: for a joint block (``blocks=[...]``), the variable nodes of
            the sites it joins, in order; else empty.
    """

    name: str
    family: str
    shape: tuple[int, ...]
    batch_shape: tuple[int, ...]
    event_shape: tuple[int, ...]
    plates: tuple[str, ...]
    support: Any
    transform: Any
    prior: Any
    discrete: bool
    chain: Optional[ChainInfo] = None
    observed_mask: Optional[np.ndarray] = None
    members: tuple = ()  # a joint block: the VariableNodes of the sites it joins


@dataclasses.dataclass(frozen=True)
class FactorNode:
    """A factor: one sample site's log density, vectorised over its plates.

    Attributes:
        name: the site name (a ``numpyro.factor`` term keeps its own name).
        kind: ``"prior"`` (the prior of a latent site), ``"likelihood"`` (an
            observed site) or ``"factor"`` (a ``numpyro.factor`` term).
        distribution: the site's numpyro distribution as traced.
        observed: True for an observed site.
        value: the observed value (numpy array), None for latent sites.
        neighbours: latent variables (VariableNode names) the factor's value
            and distribution arguments depend on, in trace order.
        param_neighbours: ``numpyro.param`` sites it depends on.
        plates: plate names, outermost first.
        scale: the site's log-density scale (``handlers.scale`` times the
            N / M of subsampled plates), or None for 1.
        mask: the site's mask (from ``.mask()`` or ``obs_mask``), or None.
        edges: variable name -> :class:`Edge` (the conjugacy slot).
        sites: for the steps of a Python-loop chain joined into one factor
            (one factor per kind of step, as a ``scan`` gives), the numpyro
            sites whose log densities it sums, in order; empty for a factor of
            one site. The factor is named after its first site; then
            ``distribution`` is the first site's, and ``value`` and ``mask``
            stack the sites' along a new leading (time) axis.
        block_members: for a factor of joint blocks (:func:`blrppl.graph.blocks.as_blocks`),
            the member sites among its neighbours before they were joined, in trace order
            (the coordinates of a block it reads); empty otherwise.
    """

    name: str
    kind: str
    distribution: Any
    observed: bool
    value: Any
    neighbours: tuple[str, ...]
    param_neighbours: tuple[str, ...]
    plates: tuple[str, ...]
    scale: Any
    mask: Any
    edges: dict[str, Edge]
    sites: tuple[str, ...] = ()
    block_members: tuple[str, ...] = ()

    @property
    def site_names(self) -> tuple[str, ...]:
        """The numpyro sites whose log densities make the factor."""
        return self.sites or (self.name,)


@dataclasses.dataclass(frozen=True)
class ParamNode:
    """A ``numpyro.param`` site: its initial value and constraint."""

    name: str
    shape: tuple[int, ...]
    constraint: Any
    init_value: Any


@dataclasses.dataclass(frozen=True)
class DeterministicNode:
    """A ``numpyro.deterministic`` site, recorded so results can report it."""

    name: str
    shape: tuple[int, ...]
    plates: tuple[str, ...]
    neighbours: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FactorGraph:
    """A NumPyro model as a bipartite factor graph (see ``blrppl.trace``).

    ``site_values`` holds every sample site's value in the tracing run
    (latents at a fixed point of their support, observations as given).
    """

    variables: dict[str, VariableNode]
    factors: dict[str, FactorNode]
    params: dict[str, ParamNode]
    deterministics: dict[str, DeterministicNode]
    plates: dict[str, Plate]
    model: Callable
    model_args: tuple
    model_kwargs: dict
    site_values: dict = dataclasses.field(default_factory=dict, repr=False)

    def factor_of(self, site: str) -> Optional[FactorNode]:
        """The factor holding a sample site's log density (a joined loop factor holds several)."""
        node = self.factors.get(site)
        if node is not None and site in node.site_names:
            return node
        return next((f for f in self.factors.values() if site in f.sites), None)

    @functools.cached_property
    def data(self) -> Any:
        """The model's arguments as :class:`~blrppl.graph.replay.ModelData` (the graph is frozen:
        split once)."""
        return split_model_data(self.model_args, self.model_kwargs)

    @functools.cached_property
    def held_data(self) -> tuple[int, ...]:
        """Positions in ``data.arrays`` of the arrays the model needs as concrete values
        (:func:`blrppl.graph.concrete.held_data`)."""
        from blrppl.graph.concrete import held_data

        return held_data(self)

    def with_factors(self, factors: dict) -> "FactorGraph":
        """A copy with other factor nodes: the same model and data, so what was learnt about
        the data (``data``, ``held_data``: runs of the model) is carried over."""
        new = dataclasses.replace(self, factors=factors)
        for name in ("data", "held_data"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def to_networkx(self) -> Any:
        """The graph as a bipartite ``networkx.Graph`` (see :mod:`blrppl.graph.networkx`)."""
        from blrppl.graph.networkx import to_networkx

        return to_networkx(self)

    def draw(self, ax: Any = None, **kwargs: Any) -> Any:
        """Draw the graph with matplotlib (graphviz layout when installed); returns the Axes."""
        from blrppl.graph.networkx import draw

        return draw(self, ax, **kwargs)
