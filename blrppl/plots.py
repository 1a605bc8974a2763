"""The figures ``python -m blrppl fit --out DIR`` writes, each chosen by what the model's sites are.

- ``elbo.png``: the ELBO after each step (top) and its relative change per
  step on a log scale (bottom), with the ``tol`` line: convergence shows as
  the change falling to the line, however flat the ELBO looks.
- ``posterior.png``: densities of scalar sites and small vectors (one curve
  per entry), from draws of q.
- ``forest.png``: sites with a plate (eight schools' ``theta``, a mixture's
  component means) or many entries: each entry's mean with its 50% and 90%
  intervals; past 40 entries, sorted by their means (a caterpillar plot).
- ``chains.png``: latent chains over time: the mean with 50% and 90% bands
  per state component, with the observations over it when they follow the
  chain (else in a panel above); a discrete chain (an HMM) shows each
  state's probability over time.
- ``mixture.png``: a mixture (a Categorical assignment per observation):
  the data's histogram with each component's density, weighted by its share
  of the observations, and their sum.

Only the figures that apply to the model are written.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any, Optional

import numpy as np

#: Vectors up to this many entries (and without a plate) get densities.
SMALL = 8
#: Forest plots past this many entries become sorted caterpillar plots.
FOREST = 40
#: Posterior draws used to draw a mixture's component densities.
MIXTURE_DRAWS = 100


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A Gaussian kernel density estimate (Scott's bandwidth)."""
    x = np.asarray(x, dtype=float)
    sd = x.std()
    if not np.isfinite(sd) or sd == 0.0:
        return np.zeros_like(grid)
    bandwidth = 1.06 * sd * x.size ** (-0.2)
    z = (grid[:, None] - x[None, :]) / bandwidth
    return np.exp(-0.5 * z**2).sum(1) / (x.size * bandwidth * math.sqrt(2.0 * math.pi))


def plot_elbo(
    elbo: np.ndarray, path: pathlib.Path, tol: Optional[float] = None, monte_carlo: bool = False
) -> pathlib.Path:
    """``elbo.png``: ``elbo`` is ``(chains, steps)`` (NaN after a chain stopped).

    The bottom panel is the relative change ``|ELBO_t - ELBO_(t-1)| / |ELBO_t|``,
    the quantity ``tol`` bounds for fits with exact or deterministic site
    parameters (:func:`blrppl.blr.driver.run`). For Monte Carlo fits
    (``monte_carlo``) ``tol`` bounds the averaged q's movement instead, so no
    ``tol`` line is drawn.
    """
    plt = _pyplot()
    elbo = np.atleast_2d(np.asarray(elbo, dtype=float))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    steps = np.arange(1, elbo.shape[1] + 1)
    for c, trace in enumerate(elbo):
        keep = np.isfinite(trace)
        style = dict(lw=1.5, marker="o" if keep.sum() < 30 else None, ms=3)
        top.plot(steps[keep], trace[keep], **style, label=f"chain {c}" if len(elbo) > 1 else None)
        kept = trace[keep]
        change = np.abs(np.diff(kept)) / np.maximum(np.abs(kept[1:]), 1e-300)
        if change.size:
            bottom.semilogy(steps[keep][1:], np.maximum(change, 1e-16), **style)
    finite = elbo[np.isfinite(elbo)]
    if finite.size > 3:  # zoom on where the ELBO ends up, not the first steps' drop
        last, spread = finite.max(), np.percentile(finite, 90) - np.percentile(finite, 10)
        top.set_ylim(np.percentile(finite, 10) - 0.1 * spread - 1e-9, last + 0.1 * spread + 1e-9)
    top.set_ylabel("ELBO")
    top.set_title("ELBO after each step (higher is better)")
    if len(elbo) > 1:
        top.legend(fontsize=7)
    if tol is not None and not monte_carlo:
        bottom.axhline(tol, color="k", ls="--", lw=1, label=f"tol = {tol:g}")
        bottom.legend(fontsize=7)
    elif monte_carlo:
        bottom.set_title("Monte Carlo fit: tol bounds the averaged q's movement, not this change", fontsize=8)
    if elbo.shape[1] < 2:
        bottom.text(0.5, 0.5, "one step: nothing to converge", ha="center", va="center", transform=bottom.transAxes)
    bottom.set_ylabel("|ELBO change| / |ELBO|")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class Sites:
    """The posterior's sites sorted into the kinds of figure (see the module docstring)."""

    def __init__(self, result: Any, posterior: Any):
        from blrppl.arviz_dims import DimNamer

        graph = result.graph
        namer = DimNamer(graph)
        self.small, self.forest, self.chains, self.mixtures = [], [], [], []
        for name, array in posterior.items():
            value = np.asarray(array)
            draws = value.reshape((-1,) + value.shape[2:])
            discrete = np.issubdtype(draws.dtype, np.integer) or draws.dtype == bool
            dims = array.dims[2:]
            if name in namer.time:
                self.chains.append((name, draws, discrete))
            elif discrete:
                observed = _mixture_observation(graph, name)
                if observed is not None:
                    self.mixtures.append((name, draws, observed))
            elif any(d in graph.plates for d in dims) or draws[0].size > SMALL:
                self.forest.append((name, draws, dims))
            else:
                self.small.append((name, draws))


def _mixture_observation(graph: Any, name: str) -> Optional[str]:
    """The observed site a Categorical assignment ``name`` selects components for, if any."""
    node = graph.variables.get(name)
    if node is None or node.chain is not None or not node.plates:
        return None
    for f, factor in graph.factors.items():
        if factor.observed and name in factor.neighbours and set(node.plates) <= set(factor.plates):
            return f
    return None


def plot_densities(sites: list, path: pathlib.Path) -> pathlib.Path:
    """``posterior.png``: one panel per scalar or small-vector site."""
    plt = _pyplot()
    cols = min(3, len(sites))
    rows = -(-len(sites) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False)
    for ax, (name, draws) in zip(axes.flat, sites):
        flat = draws.reshape(draws.shape[0], -1)
        lo, hi = np.percentile(flat, [0.5, 99.5])
        pad = 0.1 * (hi - lo) + 1e-12
        start = lo - pad if flat.min() < 0 else max(lo - pad, 0.0)  # a positive site's density stops at 0
        grid = np.linspace(start, hi + pad, 200)
        for i in range(flat.shape[1]):
            label = f"[{i}]" if flat.shape[1] > 1 else None
            ax.plot(grid, _kde(flat[:, i], grid), lw=1.5, label=label)
        ax.set_title(name)
        ax.set_yticks([])
        if flat.shape[1] > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(sites) :]:
        ax.axis("off")
    fig.suptitle("Posterior densities (draws from q)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_forest(sites: list, path: pathlib.Path) -> pathlib.Path:
    """``forest.png``: means with 50% and 90% intervals per entry."""
    plt = _pyplot()
    sizes = [min(draws[0].size, FOREST) for _, draws, _ in sites]
    heights = [max(1.6, 0.22 * n + 0.8) for n in sizes]
    fig, axes = plt.subplots(len(sites), 1, figsize=(6, sum(heights)), squeeze=False, height_ratios=heights)
    for ax, (name, draws, dims) in zip(axes[:, 0], sites):
        flat = draws.reshape(draws.shape[0], -1)
        q5, q25, q50, q75, q95 = np.percentile(flat, [5, 25, 50, 75, 95], axis=0)
        mean = flat.mean(0)
        labels = [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(*draws.shape[1:])]
        if flat.shape[1] > FOREST:  # caterpillar: entries sorted by mean
            order = np.argsort(mean)
            x = np.arange(flat.shape[1])
            ax.fill_between(x, q5[order], q95[order], alpha=0.25, label="90%")
            ax.fill_between(x, q25[order], q75[order], alpha=0.45, label="50%")
            ax.plot(x, mean[order], "k.", ms=3, label="mean")
            ax.set_xlabel(f"{flat.shape[1]} entries of {name} ({', '.join(dims)}), sorted by mean")
            ax.legend(fontsize=7)
            continue
        y = np.arange(flat.shape[1])[::-1]
        ax.hlines(y, q5, q95, lw=1.2, color="C0")
        ax.hlines(y, q25, q75, lw=3.5, color="C0")
        ax.plot(mean, y, "o", color="k", ms=3.5)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.axvline(float(np.mean(mean)), color="grey", lw=0.8, ls=":")
        ax.set_title(f"{name}: mean, 50% and 90% intervals", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_chains(chains: list, observations: dict, path: pathlib.Path) -> pathlib.Path:
    """``chains.png``: bands over time; ``observations`` maps a chain site to (name, values)."""
    plt = _pyplot()
    panels = []
    for name, draws, discrete in chains:
        obs = observations.get(name)
        if discrete:
            if obs is not None:
                panels.append(("data", name, obs))
            panels.append(("states", name, draws))
            continue
        states = draws.reshape(draws.shape[:2] + (-1,))
        follows = obs is not None and states.shape[2] == 1 and _follows(states[..., 0].mean(0), obs[1])
        if obs is not None and not follows:
            panels.append(("data", name, obs))
        for k in range(min(states.shape[2], 4)):
            panels.append(("band", f"{name}[:, {k}]" if states.shape[2] > 1 else name, (states[..., k], obs if follows else None)))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), squeeze=False, sharex=True)
    for ax, (kind, label, payload) in zip(axes[:, 0], panels):
        if kind == "data":
            obs_name, values = payload
            values = np.asarray(values)
            values = values.reshape(values.shape[0], -1)[:, :4]  # at most four series
            ax.plot(np.arange(values.shape[0]), values, ".", ms=3)
            ax.set_title(f"observed {obs_name}", fontsize=9)
        elif kind == "states":
            batch = int(np.prod(payload.shape[2:]))
            if batch > 1:  # a batch of chains (several sequences): the first one
                payload = payload.reshape(payload.shape[:2] + (batch,))[..., 0]
                label = f"{label} (sequence 0 of {batch})"
            frequency = np.stack([(payload == k).mean(0) for k in range(int(payload.max()) + 1)])
            t, below = np.arange(frequency.shape[1]), np.zeros(frequency.shape[1])
            for k, share in enumerate(frequency):  # steps: a state holds for a whole time step
                ax.fill_between(t, below, below + share, step="mid", color=f"C{k % 10}", label=f"state {k}")
                below = below + share
            ax.set_ylim(0, 1)
            ax.set_title(f"{label}: probability of each state", fontsize=9)
            ax.legend(fontsize=7, loc="upper right")
        else:
            draws, obs = payload
            t = np.arange(draws.shape[1])
            q5, q25, q75, q95 = np.percentile(draws, [5, 25, 75, 95], axis=0)
            ax.fill_between(t, q5, q95, alpha=0.25, color="C0", label="90%")
            ax.fill_between(t, q25, q75, alpha=0.45, color="C0", label="50%")
            ax.plot(t, draws.mean(0), color="C0", lw=1.5, label="mean")
            if obs is not None:
                ax.plot(np.arange(len(obs[1])), obs[1], "k.", ms=3, label=f"observed {obs[0]}")
            ax.set_title(f"{label} over time", fontsize=9)
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("time step")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _follows(mean: np.ndarray, values: Any) -> bool:
    """Whether the observations track the chain (drawn on the same axes) or not (a panel of their own)."""
    values = np.asarray(values, dtype=float).reshape(-1)
    if values.size != mean.size:
        return False
    keep = np.isfinite(values)
    if keep.sum() < 3 or np.std(values[keep]) == 0 or np.std(mean[keep]) == 0:
        return False
    return float(np.corrcoef(mean[keep], values[keep])[0, 1]) > 0.5


def chain_observations(graph: Any, chains: list) -> dict:
    """Chain site -> (observed site, values) for observations with one entry per time step."""
    out = {}
    for name, draws, _ in chains:
        length = draws.shape[1]
        for f, factor in graph.factors.items():
            if not factor.observed or factor.value is None:
                continue
            touches = any(
                graph.variables[v].chain is not None and name in graph.variables[v].chain.sites
                for v in factor.neighbours
                if v in graph.variables
            )
            value = np.asarray(factor.value)
            if touches and value.shape[:1] == (length,):
                out[name] = (f, value)
                break
    return out


def plot_mixture(result: Any, name: str, draws: np.ndarray, observed: str, samples: dict, path: pathlib.Path, rng_key: Any) -> Optional[pathlib.Path]:
    """``mixture.png``: the data with each component's density (the model run with ``name`` fixed to k)."""
    import jax

    from blrppl.arviz_io import predictive

    plt = _pyplot()
    y = np.asarray(result.graph.factors[observed].value, dtype=float)
    if y.ndim != 1:
        return None
    num = min(MIXTURE_DRAWS, draws.shape[0])
    subset = {k: np.asarray(v)[:num] for k, v in samples.items()}
    components = int(max(draws.max(), result.plan.qs[name].num_categories - 1)) + 1
    lo, hi = np.percentile(y, [0.5, 99.5])
    pad = 0.15 * (hi - lo)
    grid = np.linspace(lo - pad, hi + pad, 300)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.hist(y, bins=min(60, max(10, y.size // 4)), density=True, color="0.8", label=f"observed {observed}")
    total = np.zeros_like(grid)
    for k in range(components):
        share = float((draws == k).mean())
        fixed = dict(subset, **{name: np.full_like(subset[name], k)})
        replicate = predictive(result, jax.random.fold_in(rng_key, k), fixed)[observed]
        density = share * _kde(np.asarray(replicate).ravel(), grid)
        total += density
        ax.fill_between(grid, density, alpha=0.35, color=f"C{k % 10}", label=f"component {k} ({100 * share:.0f}%)")
    ax.plot(grid, total, "k--", lw=1.2, label="mixture")
    ax.set_title(f"{observed}: component densities (posterior predictive with {name} = k)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_plots(result: Any, idata: Any, out: pathlib.Path, rng_key: Any, tol: Optional[float] = None) -> list:
    """Write every figure that applies to ``result``'s model into ``out``; returns the paths."""
    elbo = idata.sample_stats["elbo"].values
    written = [plot_elbo(elbo, out / "elbo.png", tol, result.converged.monte_carlo)]
    sites = Sites(result, idata.posterior)
    if sites.small:
        written.append(plot_densities(sites.small, out / "posterior.png"))
    if sites.forest:
        written.append(plot_forest(sites.forest, out / "forest.png"))
    if sites.chains:
        observations = chain_observations(result.graph, sites.chains)
        written.append(plot_chains(sites.chains, observations, out / "chains.png"))
    samples = {k: np.asarray(v.values).reshape((-1,) + v.shape[2:]) for k, v in idata.posterior.items()}
    for name, draws, observed in sites.mixtures[:1]:
        path = plot_mixture(result, name, draws, observed, samples, out / "mixture.png", rng_key)
        if path is not None:
            written.append(path)
    return written
