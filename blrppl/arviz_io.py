"""``to_arviz``: a fitted q as ``arviz.InferenceData`` (through ``az.from_dict``).

Groups: ``posterior`` (draws from q, one chain per restart, plate names as
dims, deterministic sites included), ``observed_data``, ``log_likelihood``
(pointwise, per observed site, so ``az.loo`` and ``az.waic`` work),
``sample_stats`` (the final ELBO of each chain; the best fit's trace is in
``attrs["elbo_trace"]``) and, when asked, ``posterior_predictive``.
``idata.to_netcdf(path)`` saves it (ArviZ's h5netcdf engine).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.graph.replay import replay


def import_arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def _dims(name: str, shape: tuple, plates: tuple, graph: Any) -> tuple[list, dict]:
    """Dimension names of a site's value: plate names where a plate sits, else name_dim_i."""
    dims = [f"{name}_dim_{i}" for i in range(len(shape))]
    coords = {}
    for plate_name in plates:
        plate = graph.plates.get(plate_name)
        if plate is None:
            continue
        axis = len(shape) + plate.dim - _event_ndim(name, shape, graph)
        if 0 <= axis < len(shape) and shape[axis] == plate.subsample_size:
            dims[axis] = plate_name
            coords[plate_name] = np.arange(shape[axis])
    return dims, coords


def _event_ndim(name: str, shape: tuple, graph: Any) -> int:
    node = graph.variables.get(name)
    if node is not None:
        return len(node.event_shape)
    factor = graph.factors.get(name)
    if factor is not None and factor.distribution is not None:
        return len(factor.distribution.event_shape)
    return 0


def log_likelihood(result: Any, samples: dict) -> dict:
    """Pointwise log likelihood of every observed site, one row per draw."""
    graph = result.graph
    observed = [f for f, node in graph.factors.items() if node.kind == "likelihood"]
    latents = {v: samples[v] for v in graph.variables}

    def pointwise(values):
        sites = replay(graph, values, result.state.params)
        out = {}
        for name in observed:
            site = sites[name]
            log_prob = site.fn.log_prob(site.value)
            if site.mask is not None:
                log_prob = jnp.where(site.mask, log_prob, 0.0)
            out[name] = log_prob
        return out

    return jax.vmap(pointwise)(latents)


def to_arviz(
    result: Any,
    rng_key: Optional[jax.Array] = None,
    num_samples: int = 1000,
    *,
    posterior_predictive: bool = False,
) -> Any:
    """Build ``arviz.InferenceData`` from a fitted result (see the module docstring).

    Args:
      result: a fitted :class:`~blrppl.results.BLRResult`.
      rng_key: a JAX PRNG key for the draws (default ``key(0)``).
      num_samples: draws per chain.
      posterior_predictive: add a ``posterior_predictive`` group: one draw
        of every observed site per posterior draw, from NumPyro's
        ``Predictive`` with the posterior draws substituted.

    Returns:
      ``arviz.InferenceData`` with one chain per restart (restarts that
      diverged left out; 1 without restarts) and ``draw`` = ``num_samples``.
    """
    az = import_arviz()
    if rng_key is None:
        rng_key = jax.random.key(0)
    graph = result.graph
    restarts = range(result.num_restarts)
    if result.restarts is not None:
        restarts = [c for c in restarts if bool(result.restarts.finite[c])]
    chains = [result.restart(c) for c in restarts]
    per_chain = []
    for c, fit in enumerate(chains):
        key = rng_key if len(chains) == 1 else jax.random.fold_in(rng_key, c)
        sample_key, predictive_key = jax.random.split(key)
        samples = fit.sample(sample_key, num_samples)
        log_lik = log_likelihood(fit, samples)
        predicted = predictive(fit, predictive_key, samples) if posterior_predictive else {}
        per_chain.append((samples, log_lik, predicted))

    def stack(i):
        names = per_chain[0][i]
        return {n: np.stack([np.asarray(chain[i][n]) for chain in per_chain]) for n in names}

    posterior, log_lik, predicted = stack(0), stack(1), stack(2)
    dims, coords = {}, {}
    for name, value in posterior.items():
        site_dims, site_coords = _dims(name, value.shape[2:], _site_plates(graph, name), graph)
        dims[name] = site_dims
        coords.update(site_coords)
    observed = {}
    for name, node in graph.factors.items():
        if node.kind == "likelihood" and node.value is not None:
            value = np.asarray(node.value)
            observed[name] = value
            site_dims, site_coords = _dims(name, value.shape, node.plates, graph)
            dims[name] = site_dims
            coords.update(site_coords)
    finals = np.asarray([float(fit.elbo[-1]) for fit in chains])
    sample_stats = {"elbo": finals[:, None] * np.ones((len(chains), num_samples))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_dict(
            posterior=posterior,
            posterior_predictive=predicted or None,
            log_likelihood=log_lik,
            observed_data=observed,
            sample_stats=sample_stats,
            coords=coords,
            dims=dims,
        )
    idata.attrs["elbo_trace"] = np.asarray(result.elbo).tolist()
    if result.restarts is not None:
        idata.attrs["best_restart"] = int(result.restarts.best)
    return idata


def predictive(result: Any, rng_key: jax.Array, samples: dict) -> dict:
    """Draws of every observed site given posterior draws (NumPyro ``Predictive``).

    The model runs with the draws substituted and its observed sites
    released (their ``obs`` dropped), so each posterior draw gets one
    replicated data set, shaped like the observations.
    """
    from numpyro.infer import Predictive

    graph = result.graph
    observed = [f for f, node in graph.factors.items() if node.kind == "likelihood" and node.value is not None]
    model = _released(graph.model, frozenset(observed))
    draws = {k: v for k, v in samples.items() if k not in observed}
    params = {k: jnp.broadcast_to(v, (_num_draws(samples),) + jnp.shape(v)) for k, v in result.state.params.items()}
    out = Predictive(model, posterior_samples={**draws, **params}, return_sites=observed)(
        rng_key, *graph.model_args, **graph.model_kwargs
    )
    return {k: out[k] for k in observed if k in out}


def _num_draws(samples: dict) -> int:
    return int(jnp.shape(next(iter(samples.values())))[0])


def _released(model: Any, sites: frozenset) -> Any:
    """``model`` with the observed ``sites`` sampled instead of conditioned on."""
    from numpyro.primitives import Messenger

    class _Release(Messenger):
        def process_message(self, msg):
            if msg["type"] == "sample" and msg["name"] in sites and msg["is_observed"]:
                msg["value"] = None
                msg["is_observed"] = False

    def released(*args: Any, **kwargs: Any) -> Any:
        with _Release():
            return model(*args, **kwargs)

    return released


def _site_plates(graph: Any, name: str) -> tuple:
    if name in graph.variables:
        return graph.variables[name].plates
    if name in graph.deterministics:
        return graph.deterministics[name].plates
    if name in graph.factors:
        return graph.factors[name].plates
    return ()
