"""Recognising latent chains: one chain variable instead of T unrelated nodes.

Four ways of writing a latent time series are recognised:

* ``dist.GaussianRandomWalk`` and ``dist.GaussianStateSpace`` sites: the chain
  is the site's event (time is the first event dimension); a batch shape (a
  plate of random walks) is a batch of independent chains.
* a latent site inside a ``numpyro.contrib.control_flow.scan`` body whose
  distribution arguments depend on the site's own value (through the scan's
  carry): ``x_t ~ p(x_t | x_{t-1})``. Time is axis 0 of the stacked site. A
  real-valued one becomes a ``"ChainGaussian"``, a finite discrete one a
  ``"ChainCategorical"``.
* such a scan chain is joined with its initial state when exactly one latent
  site sampled before the scan feeds the scan's initial carry, has the shape
  of one step and the same kind of support (real for Gaussian chains,
  finite discrete for discrete ones).
* three or more latent sites of one shape written one per step (a Python
  loop, under ``numpyro.markov`` or not), each site's distribution depending
  on the previous one and no other site of the chain: the sites are joined
  into one chain (``kind="markov"``), named after its first site.

The axes of one step split into a batch of independent sequences and one
state: a discrete chain's steps are scalar states, so all its step axes are
sequences (states of shape (N,) or (N, 1) per step: N sequences); a Gaussian
chain's sequences are the step axes up to its innermost plate, the rest is
the state vector.
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
        batch_shape=tuple(fn.batch_shape),
    )


def step_axes(site: Mapping[str, Any], family: str, step_shape: tuple, step_batch_ndim: int) -> tuple:
    """Split the shape of one step into (sequences, state) (module docstring).

    Args:
        site: the numpyro trace entry (for its plates).
        family: ``"ChainGaussian"`` or ``"ChainCategorical"``.
        step_shape: the shape of one step's value.
        step_batch_ndim: how many of its axes are the step distribution's batch axes.
    """
    step_shape = tuple(step_shape)
    if family == "ChainCategorical":
        return step_shape, ()
    axes = [
        step_batch_ndim + frame.dim
        for frame in site.get("cond_indep_stack", ())
        if frame.dim is not None and -frame.dim <= step_batch_ndim
    ]
    num = max(axes) + 1 if axes else 0
    return step_shape[:num], step_shape[num:]


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
        step_shape = shape[1:]
        batch, state = step_axes(site, family, step_shape, len(site["fn"].batch_shape) - 1)
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
            and tuple(np.shape(trace[c]["value"])) == step_shape
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
                state_shape=state,
                time_axis=0,
                kind="scan",
                batch_shape=batch,
            ),
            family,
        )
    return chains


MIN_LOOP_LENGTH = 3
"""Python-loop chains are joined from this many steps on (two linked sites stay apart)."""


def markov_chains(
    trace: Mapping[str, Mapping[str, Any]],
    latents: Sequence[str],
    choices: Mapping[str, FamilyChoice],
    dist_deps: Mapping[str, frozenset],
    taken: frozenset = frozenset(),
) -> dict[str, tuple[ChainInfo, str]]:
    """Chains written one site per step (a Python loop): first site -> (ChainInfo, chain family).

    A site's *parent* is the one latent of the same shape and chain family its
    distribution depends on, once sites that several others depend on (a
    shared drift or level: globals, not steps) are set aside. A site with one
    child links to it; maximal paths of :data:`MIN_LOOP_LENGTH` or more linked
    sites become chains.

    Args:
        trace: the model's numpyro trace.
        latents: latent sample site names, in trace order.
        choices: each latent site's default (or overridden) family.
        dist_deps: site -> latent sites its distribution arguments depend on.
        taken: sites already in other chains (scan chains).
    """
    order = {name: i for i, name in enumerate(latents)}
    family = {}
    for name in latents:
        site = trace[name]
        if name in taken or "_scan_current_index" in site.get("infer", {}):
            continue
        if distribution_chain(site) is not None:
            continue
        fam = _chain_family(choices[name])
        if fam is not None:
            family[name] = fam
    shape = {n: tuple(np.shape(trace[n]["value"])) for n in family}
    parents = {
        n: [
            p
            for p in dist_deps[n]
            if p in family and p != n and order[p] < order[n] and family[p] == family[n] and shape[p] == shape[n]
        ]
        for n in family
    }
    children: dict[str, list[str]] = {n: [] for n in family}
    for n, ps in parents.items():
        for p in ps:
            children[p].append(n)
    shared = {p for p, cs in children.items() if len(cs) > 1}
    link = {}
    for n, ps in parents.items():
        ps = [p for p in ps if p not in shared]
        if len(ps) == 1:
            link[n] = ps[0]
    after = {p: n for n, p in link.items()}
    chains: dict[str, tuple[ChainInfo, str]] = {}
    for head in sorted(family, key=order.get):
        if head in link or head not in after:
            continue
        path = [head]
        while path[-1] in after:
            path.append(after[path[-1]])
        if len(path) < MIN_LOOP_LENGTH:
            continue
        site = trace[head]
        batch, state = step_axes(site, family[head], shape[head], len(site["fn"].batch_shape))
        info = ChainInfo(
            sites=tuple(path),
            length=len(path),
            state_shape=state,
            time_axis=len(batch),
            kind="markov",
            batch_shape=batch,
        )
        chains[head] = (info, family[head])
    return chains


def discrete_loop_chain(graph: Any) -> tuple[str, ...] | None:
    """Three or more discrete latent sites linked by their priors and left unjoined, else None.

    :func:`markov_chains` joins the loops it recognises; what is left (a step
    with two children, steps of different shapes) keeps one node per time
    step. Returns the sites of the longest such path found, first to last,
    so that engines can say what to do instead.
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
    return best if len(best) >= MIN_LOOP_LENGTH else None
