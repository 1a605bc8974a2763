"""``to_arviz``: a fitted q as ``arviz.InferenceData`` (through ``az.from_dict``).

Groups: ``posterior`` (one chain of draws from q, plate names as dims,
deterministic sites included), ``observed_data``, ``log_likelihood``
(pointwise, per observed site, so ``az.loo`` and ``az.waic`` work) and
``sample_stats`` (the ELBO trace).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.graph.replay import replay


def _import_arviz():
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


def to_arviz(result: Any, rng_key: Optional[jax.Array] = None, num_samples: int = 1000) -> Any:
    """Build ``arviz.InferenceData`` from a fitted result (see the module docstring)."""
    az = _import_arviz()
    if rng_key is None:
        rng_key = jax.random.key(0)
    graph = result.graph
    samples = result.sample(rng_key, num_samples)
    posterior, dims, coords = {}, {}, {}
    for name, value in samples.items():
        value = np.asarray(value)
        posterior[name] = value[None]
        plates = _site_plates(graph, name)
        site_dims, site_coords = _dims(name, value.shape[1:], plates, graph)
        dims[name] = site_dims
        coords.update(site_coords)
    log_lik = {k: np.asarray(v)[None] for k, v in log_likelihood(result, samples).items()}
    observed = {}
    for name, node in graph.factors.items():
        if node.kind == "likelihood" and node.value is not None:
            value = np.asarray(node.value)
            observed[name] = value
            site_dims, site_coords = _dims(name, value.shape, node.plates, graph)
            dims[name] = site_dims
            coords.update(site_coords)
    elbo = np.asarray(result.elbo)
    sample_stats = {"elbo": elbo[None, None, -1] * np.ones((1, num_samples))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_dict(
            posterior=posterior,
            log_likelihood=log_lik,
            observed_data=observed,
            sample_stats=sample_stats,
            coords=coords,
            dims=dims,
        )
    idata.attrs["elbo_trace"] = elbo.tolist()
    return idata


def _site_plates(graph: Any, name: str) -> tuple:
    if name in graph.variables:
        return graph.variables[name].plates
    if name in graph.deterministics:
        return graph.deterministics[name].plates
    if name in graph.factors:
        return graph.factors[name].plates
    return ()
