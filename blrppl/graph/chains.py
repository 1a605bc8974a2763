"""Recognising latent chains: one chain variable instead of T unrelated nodes.

Three ways of writing a latent time series are recognised:

* ``dist.GaussianRandomWalk`` and ``dist.GaussianStateSpace`` sites: the chain
  is the site's event (time is the first event dimension).
* a latent site inside a ``numpyro.contrib.control_flow.scan`` body whose
  distribution arguments depend on the site's own value (through the scan's
  carry): ``x_t ~ p(x_t | x_{t-1})``. Time is axis 0 of the stacked site. A
  real-valued one becomes a ``"ChainGaussian"``, a finite discrete one a
  ``"ChainCategorical"``.
* such a scan chain is joined with its initial state when exactly one latent
  site sampled before the scan feeds the scan's initial carry, has the shape
  of one state and the same kind of support (real for Gaussian chains,
  finite discrete for discrete ones).

Chains written as Python loops under ``numpyro.markov`` stay one node per
time step.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import numpyro.distributions as dist

from blrppl.graph.families import FamilyChoice, base_distribution
from blrppl.graph.nodes import ChainInfo

_GAUSSIAN = ("Normal", "MultivariateNormal")
_DISCRETE = ("Categorical", "Bernoulli")


def _chain_family(choice: FamilyChoice) -> str | None:
    if choice.transform is None and choice.family in _GAUSSIAN:
        return "ChainGaussian"
    if choice.family in _DISCRETE:
        return "ChainCategorical"
    return None


def distribution_chain(site: Mapping[str, Any]) -> ChainInfo | None:
    """ChainInfo of a ``GaussianRandomWalk`` / ``GaussianStateSpace`` site, else None."""
    fn = site["fn"]
    base = base_distribution(fn)
    if not isinstance(base, (dist.GaussianRandomWalk, dist.GaussianStateSpace)):
        return None
    event_shape = tuple(fn.event_shape)
    return ChainInfo(
        sites=(site["name"],),
        length=int(event_shape[0]),
        state_shape=event_shape[1:],
        time_axis=len(fn.batch_shape),
        kind=type(base).__name__,
    )


def scan_chains(
    trace: Mapping[str, Mapping[str, Any]],
    latents: Sequence[str],
    choices: Mapping[str, FamilyChoice],
    dist_deps: Mapping[str, frozenset],
    dist_scans: Mapping[str, frozenset],
    scan_init: Mapping[Any, frozenset],
) -> dict[str, tuple[ChainInfo, str]]:
    """Latent chains written with ``scan``: stacked site -> (ChainInfo, chain family).

    Args:
        trace: the model's numpyro trace.
        latents: latent sample site names, in trace order.
        choices: each latent site's default (or overridden) family.
        dist_deps: site -> latent sites its distribution arguments depend on.
        dist_scans: site -> top-level scan tags its distribution arguments pass through.
        scan_init: scan tag -> latent (and param) names its initial carry depends on.
    """
    order = {name: i for i, name in enumerate(latents)}
    chains: dict[str, tuple[ChainInfo, str]] = {}
    taken: set[str] = set()
    for name in latents:
        site = trace[name]
        if "_scan_current_index" not in site.get("infer", {}):
            continue
        family = _chain_family(choices[name])
        if family is None or name not in dist_deps[name]:
            continue
        shape = tuple(np.shape(site["value"]))
        state_shape = shape[1:]
        candidates = set()
        for tag in dist_scans[name]:
            candidates |= set(scan_init.get(tag, ()))
        candidates = [
            c
            for c in sorted(candidates & set(order), key=order.get)
            if c != name
            and c not in taken
            and order[c] < order[name]
            and "_scan_current_index" not in trace[c].get("infer", {})
            and tuple(np.shape(trace[c]["value"])) == state_shape
            and _chain_family(choices[c]) == family
            and name not in dist_deps[c]
        ]
        sites = (name,)
        if len(candidates) == 1:
            sites = (candidates[0], name)
            taken.add(candidates[0])
        chains[name] = (
            ChainInfo(
                sites=sites,
                length=shape[0] + len(sites) - 1,
                state_shape=state_shape,
                time_axis=0,
                kind="scan",
            ),
            family,
        )
    return chains


def discrete_loop_chain(graph: Any) -> tuple[str, ...] | None:
    """Three or more discrete latent sites linked by their priors, else None.

    ``z_t ~ Categorical(trans[z_{t-1}])`` written as a Python loop (under
    ``numpyro.markov`` or not) gives one node per time step; those are not
    joined into a chain. Returns the sites of the longest such path found,
    first to last, so that engines can say what to do instead.
    """
    discrete = {
        name
        for name, node in graph.variables.items()
        if node.family in _DISCRETE and node.chain is None and not node.members
    }
    parents = {}
    for name in discrete:
        factor = graph.factors.get(name)
        if factor is not None and factor.kind == "prior":
            parents[name] = [v for v in factor.neighbours if v != name and v in discrete]
    best: tuple[str, ...] = ()
    for name in parents:
        path = [name]
        while parents.get(path[-1]) and parents[path[-1]][0] not in path:
            path.append(parents[path[-1]][0])
        if len(path) > len(best):
            best = tuple(reversed(path))
    return best if len(best) >= 3 else None
