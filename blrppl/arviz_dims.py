"""Dimension names of a model's sites for ArviZ.

Every axis of a site's value gets a name (the draws' ``chain`` and ``draw``
axes come first and are not named here):

- an axis a ``numpyro.plate`` indexes: the plate's name (``"J"``, ``"N"``);
- the time axis of a latent chain (a ``scan``, ``GaussianRandomWalk`` or
  ``GaussianStateSpace``) and of the observations of a chain without a plate
  over time: ``"time"`` (``"<site>_time"`` where ``"time"`` is taken by a
  plate or another chain of a different length); a chain's state axes are
  ``"<site>_state"`` (``"<site>_state_<k>"`` for several);
- any other axis (a vector site's event, an ``expand`` without a plate):
  ``"<site>_event"`` (``"<site>_event_<k>"`` for several);
- a ``numpyro.param`` value's axes: ``"<param>_dim_<k>"``.

Users rename any of them with ``to_arviz(dims={site: [...]}, coords=...)``,
as in ``arviz.from_numpyro``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np


class DimNamer:
    """Names the axes of a traced graph's sites (see the module docstring)."""

    def __init__(self, graph: Any):
        self.graph = graph
        self.time: dict[str, tuple[str, int]] = {}  # stacked chain site -> (time dim name, its length)
        self.chain_sites: dict[str, tuple[Any, str]] = {}  # site -> (chain info, variable)
        taken = {p.name: p.subsample_size for p in graph.plates.values()}
        for v, node in graph.variables.items():
            chain = node.chain
            if chain is None:
                continue
            stacked = chain.sites[-1]
            length = chain.length - (1 if len(chain.sites) > 1 else 0)
            name = "time" if taken.get("time", length) == length else f"{stacked}_time"
            taken.setdefault(name, length)
            self.time[stacked] = (name, length)
            for site in chain.sites:
                self.chain_sites[site] = (chain, v)

    def dims(self, name: str, shape: tuple) -> tuple[list[str], dict]:
        """``(dims, coords)`` of a site's value of shape ``shape`` (without chain and draw)."""
        graph = self.graph
        ndim = len(shape)
        dims: list[Optional[str]] = [None] * ndim
        coords: dict = {}
        plates, event_ndim = self._plates_and_event(name)
        for plate_name in plates:
            plate = graph.plates.get(plate_name)
            if plate is None:
                continue
            axis = ndim - event_ndim + plate.dim
            if 0 <= axis < ndim and shape[axis] == plate.subsample_size and dims[axis] is None:
                dims[axis] = plate_name
        self._name_time(name, shape, dims)
        self._name_states(name, dims)
        rest = [i for i, d in enumerate(dims) if d is None]
        for k, i in enumerate(rest):
            dims[i] = f"{name}_event" if len(rest) == 1 else f"{name}_event_{k}"
        for axis, dim in enumerate(dims):
            coords.setdefault(dim, np.arange(shape[axis]))
        return list(dims), coords

    def param_dims(self, name: str, shape: tuple) -> tuple[list[str], dict]:
        """``(dims, coords)`` of a ``numpyro.param`` value."""
        dims = [f"{name}_dim_{k}" for k in range(len(shape))]
        return dims, {d: np.arange(n) for d, n in zip(dims, shape)}

    def _plates_and_event(self, name: str) -> tuple[tuple, int]:
        graph = self.graph
        factor = graph.factor_of(name)
        if factor is not None:
            event = factor.distribution.event_shape if factor.distribution is not None else ()
            return factor.plates, len(event)
        if name in graph.deterministics:
            return graph.deterministics[name].plates, 0
        node = graph.variables.get(name)
        if node is not None:
            return node.plates, len(node.event_shape)
        return (), 0

    def _name_time(self, name: str, shape: tuple, dims: list) -> None:
        """The time axis of a chain's stacked site, or of observations of a chain."""
        if name in self.time:
            chain, _ = self.chain_sites[name]
            time_name, _ = self.time[name]
            axis = chain.time_axis
            if axis < len(dims) and dims[axis] is None:
                dims[axis] = time_name
            return
        factor = self.graph.factors.get(name)
        if factor is None or not factor.observed or not shape or dims[0] is not None:
            return
        for v in factor.neighbours:
            chain = self.graph.variables[v].chain if v in self.graph.variables else None
            if chain is None:
                continue
            time_name, length = self.time[chain.sites[-1]]
            if shape[0] == length:
                dims[0] = time_name
                return

    def _name_states(self, name: str, dims: list) -> None:
        """The state axes of a chain's sites (after time for the stacked site)."""
        if name not in self.chain_sites:
            return
        chain, _ = self.chain_sites[name]
        free = [i for i, d in enumerate(dims) if d is None]
        state = free[-len(chain.state_shape) :] if chain.state_shape else []
        for k, i in enumerate(state):
            dims[i] = f"{name}_state" if len(state) == 1 else f"{name}_state_{k}"
