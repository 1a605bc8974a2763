"""Simulation-based calibration of an engine on a model (Talts et al. 2018).

Draw parameters and data from the prior predictive, fit every simulated data
set in one batched run (:meth:`Engine.run_batched`), and rank each true
parameter among draws from its fitted q. Where q is the exact posterior, every
rank is uniform on ``0..num_draws``; an approximate engine shows its
miscalibration there (a U shape: q too narrow; a hump: too wide; a slope: a
biased mean), honestly.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer import Predictive

from blrppl.errors import ModelError


class Calibration(NamedTuple):
    """Ranks of the true parameters among draws from q, one per simulated data set.

    Attributes:
      ranks: site -> integer ranks in ``0..num_draws``, shape ``(B - len(failed), *site_shape)``.
      num_draws: draws from q per data set.
      batch: the fits (a :class:`~blrppl.results.BatchResult`).
      failed: the data sets whose fit failed (diverged, or an improper posterior:
        ``batch.failed``), left out of ``ranks``: their q is no answer to rank
        against. Many of them say the engine breaks on this model's prior
        predictive, which the ranks of the others cannot show.
      unranked: latent sites of the model that q gives no draws of (warned): not calibrated.
    """

    ranks: dict
    num_draws: int
    batch: Any
    failed: tuple = ()
    unranked: tuple = ()

    def chi_square(self, num_bins: int = 10) -> dict:
        """Per site: the p-value of a chi-square test that the ranks are uniform.

        The ranks of each scalar component of a site are binned into
        ``num_bins`` equal bins (``num_draws + 1`` must be a multiple) and
        tested apart; a site with k components reports ``min(1, k * min p)``
        (Bonferroni), valid however its components' ranks depend on each
        other (a regression's correlated coefficients: summing their
        statistics as independent would make the p-value too small). A small
        p-value says q is miscalibrated.
        """
        if (self.num_draws + 1) % num_bins:
            raise ValueError(f"num_draws + 1 = {self.num_draws + 1} is not a multiple of num_bins = {num_bins}.")
        out = {}
        for site, ranks in self.ranks.items():
            flat = np.asarray(ranks).reshape(ranks.shape[0], -1)
            pvalues = []
            for column in flat.T:
                counts = np.bincount(column * num_bins // (self.num_draws + 1), minlength=num_bins)
                expected = len(column) / num_bins
                stat = float(np.sum((counts - expected) ** 2) / expected)
                pvalues.append(float(jax.scipy.special.gammaincc((num_bins - 1) / 2.0, stat / 2.0)))
            out[site] = min(1.0, len(pvalues) * min(pvalues))
        return out

    def plot(self, path: Optional[str] = None, num_bins: int = 10) -> Any:
        """Histograms of the ranks per site (pooled over components), with the uniform band.

        Returns the matplotlib figure; saves it to ``path`` when given.
        """
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sites = list(self.ranks)
        fig, axes = plt.subplots(1, len(sites), figsize=(3.2 * len(sites), 2.6), squeeze=False)
        for ax, site in zip(axes[0], sites):
            ranks = np.asarray(self.ranks[site]).ravel()
            ax.hist(ranks, bins=num_bins, range=(0, self.num_draws + 1), color="C0", alpha=0.8)
            expected = len(ranks) / num_bins
            sd = np.sqrt(expected * (1 - 1 / num_bins))
            ax.axhspan(expected - 2 * sd, expected + 2 * sd, color="0.8", zorder=0)
            ax.set_title(site)
            ax.set_xlabel("rank")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=100)
        return fig


def simulation_based_calibration(
    engine: Any,
    rng_key: jax.Array,
    num_datasets: int,
    *model_args: Any,
    observed: Union[Sequence[str], Mapping[str, str]],
    num_steps: int = 500,
    num_draws: int = 99,
    tol: Optional[float] = 1e-8,
    **model_kwargs: Any,
) -> Calibration:
    """Calibrate ``engine`` on its model: prior predictive data, one batched fit, ranks.

    Args:
      engine: a blrppl engine (its model is simulated from and fitted).
      rng_key: a JAX PRNG key.
      num_datasets: how many data sets to simulate and fit.
      *model_args, **model_kwargs: the model's arguments (covariates, sizes);
        those named in ``observed`` are simulated.
      observed: the keyword arguments that hold observed sites of the same
        name (``observed=("y",)`` for ``numpyro.sample("y", ..., obs=y)``), or a
        mapping from keyword argument to site (``{"y": "obs"}`` for
        ``numpyro.sample("obs", ..., obs=y)``): each is set to None to simulate
        its site, then to the simulated values to fit.
      num_steps, tol: for each fit.
      num_draws: draws from each q to rank the true value among.

    Returns:
      A :class:`Calibration`.
    """
    if int(num_datasets) != num_datasets or num_datasets < 1:
        raise ValueError(f"num_datasets must be a positive integer, got {num_datasets}.")
    sim_key, fit_key, draw_key = jax.random.split(rng_key, 3)
    sites = dict(observed) if isinstance(observed, Mapping) else {name: name for name in _names(observed)}
    _check_observed_arguments(engine.model, model_args, sites)
    simulate_kwargs = {**model_kwargs, **{argument: None for argument in sites}}
    try:
        prior = Predictive(engine.model, num_samples=int(num_datasets))(sim_key, *model_args, **simulate_kwargs)
    except TypeError as error:  # the model's own call refused its arguments
        raise ModelError(
            f"the model could not be called with the arguments given and {sorted(sites)} set to None to simulate "
            f"({error}); pass the model's arguments as for engine.run, the observed ones by keyword."
        ) from error
    missing = [site for site in sites.values() if site not in prior]
    if missing:
        raise ModelError(
            f"site {missing[0]!r}: observed names a sample site that the model does not have; name the keyword "
            "arguments whose values are observed sites of the same name, or map each to its site "
            "(observed={'y': 'obs'} for numpyro.sample('obs', ..., obs=y))."
        )
    batched_args = jax.tree.map(lambda a: _broadcast(a, num_datasets), model_args)
    batched_kwargs = {k: _broadcast(v, num_datasets) for k, v in model_kwargs.items() if k not in sites}
    batched_kwargs.update({argument: np.asarray(prior[site]) for argument, site in sites.items()})
    batch = engine.run_batched(fit_key, num_steps, *batched_args, tol=tol, **batched_kwargs)
    variables = batch[0].plan.graph.variables.values()  # a joint block's sites are its members'
    latents = [m.name for node in variables for m in (node.members or (node,)) if m.name in prior]
    # Latent sites that q holds inside another's block (a chain's initial state) are ranked from
    # q's draws too; any left unranked is said, never skipped silently.
    example = batch[0].sample(draw_key, 1)
    model_latents = _latent_sites(engine.model, model_args, model_kwargs, sites, prior)
    latents += [site for site in model_latents if site not in latents and site in example]
    unranked = tuple(site for site in model_latents if site not in latents)
    if unranked:
        warnings.warn(f"simulation-based calibration cannot rank the latent sites {list(unranked)}: q gives no draws of "
                      "them.", stacklevel=2)
    if not latents:  # nothing to rank: no calibration, not a pass
        raise ModelError(
            f"site {next(iter(sites.values()))!r}: no latent of the fitted model is a sample site of its prior "
            "predictive, so there is nothing to rank; check that the model samples its parameters by name."
        )
    failed = tuple(int(i) for i in np.flatnonzero(batch.failed))
    if len(failed) == num_datasets:
        raise ModelError(
            f"every one of the {num_datasets} fits failed; the first says: {batch[0].flags[0]}"
        )
    ranks = {site: [] for site in latents}
    for i, result in enumerate(batch):
        if i in failed:
            continue
        draws = result.sample(jax.random.fold_in(draw_key, i), num_draws)
        for site in latents:
            truth = jnp.asarray(prior[site][i])
            ranks[site].append(np.asarray(jnp.sum(draws[site] < truth, axis=0)))
    return Calibration({s: np.stack(r) for s, r in ranks.items()}, num_draws, batch, failed, unranked)


def _check_observed_arguments(model: Any, model_args: tuple, sites: Mapping[str, str]) -> None:
    """Each observed name is a keyword argument of the model, not also given by position."""
    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):  # a callable without a signature: its own call says
        return
    parameters = signature.parameters
    open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for argument in sites:
        if argument not in parameters and not open_keywords:
            raise ModelError(
                f"site {sites[argument]!r}: observed names the keyword argument {argument!r}, which the model does not "
                f"take (its arguments: {list(parameters)}); name the arguments that hold observed values."
            )
    try:
        bound = signature.bind_partial(*model_args).arguments
    except TypeError:
        return
    for argument in sites:
        if argument in bound:
            raise ModelError(
                f"site {sites[argument]!r}: the observed argument {argument!r} is also given by position; pass the "
                "model's other arguments by position and leave the observed ones out (they are simulated)."
            )


def _latent_sites(model: Any, model_args: tuple, model_kwargs: dict, sites: Mapping[str, str], prior: dict) -> list:
    """The model's latent sample sites (not observed), from one trace at data set 0's values."""
    data = {argument: np.asarray(prior[site][0]) for argument, site in sites.items()}
    try:
        trace = handlers.trace(handlers.seed(model, 0)).get_trace(*model_args, **{**model_kwargs, **data})
    except Exception:  # noqa: BLE001 - the fit traced it already; without a trace, the plan's latents stand
        return []
    return [name for name, site in trace.items() if site["type"] == "sample" and not site["is_observed"]]


def _names(observed: Union[str, Sequence[str]]) -> tuple:
    return (observed,) if isinstance(observed, str) else tuple(observed)


def _broadcast(value: Any, size: int) -> Any:
    if isinstance(value, (np.ndarray, jax.Array)):
        return np.broadcast_to(np.asarray(value), (size,) + np.shape(value))
    return value
