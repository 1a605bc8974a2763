"""Plates of a traced model: names, full sizes, minibatch sizes, batch dims.

numpyro records a plate twice. The plate's own site (type ``"plate"``) holds
the full size N and the minibatch size M in ``args = (N, M)`` and the drawn
indices as its value; every site inside the plate carries a
``CondIndepStackFrame(name, dim, size=M)`` in its ``cond_indep_stack``,
innermost plate first. A subsampled site's log density is scaled by N / M.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from blrppl.graph.nodes import Plate


def site_plates(site: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the plates a site sits in, outermost first."""
    return tuple(frame.name for frame in reversed(site.get("cond_indep_stack", ())))


def collect_plates(trace: Mapping[str, Mapping[str, Any]]) -> dict[str, Plate]:
    """Every plate some site of ``trace`` sits in, by name, in order of first use.

    Plates declared inside a ``scan`` body have no plate site in the outer
    trace; they are recorded from their frames (no subsampling there).
    """
    declared = {name: site for name, site in trace.items() if site["type"] == "plate"}
    plates: dict[str, Plate] = {}
    for site in trace.values():
        for frame in reversed(site.get("cond_indep_stack", ())):
            if frame.name in plates:
                continue
            size = subsample_size = int(frame.size)
            plate_site = declared.get(frame.name)
            if plate_site is not None:
                size = int(plate_site["args"][0])
                subsample_size = int(np.shape(plate_site["value"])[0])
            plates[frame.name] = Plate(
                name=frame.name, size=size, subsample_size=subsample_size, dim=int(frame.dim)
            )
    return plates


def subsample_indices(trace: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Plate name -> the minibatch indices drawn, for subsampled plates only."""
    return {
        name: site["value"]
        for name, site in trace.items()
        if site["type"] == "plate"
        and site["args"][1] is not None
        and site["args"][1] != site["args"][0]
    }
