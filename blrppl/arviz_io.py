"""``to_arviz``: a fitted q as ``arviz.InferenceData``.

Groups:

- ``posterior``: independent draws from q shaped like the model's sites (a
  chain cut into its initial state and stacked states), deterministic sites
  included, one ArviZ chain per restart kept (see below);
- ``log_likelihood``: the pointwise log density of every observed site at
  each draw (``az.loo``, ``az.waic``, ``az.compare``), computed in chunks of
  draws so that its intermediates stay small; ``log_likelihood_thinning=k``
  keeps every k-th draw (the output is draws x observations), and
  ``log_likelihood=False`` leaves the group out (large data sets);
- ``observed_data``: the observations;
- ``constant_data``: the fitted ``numpyro.param`` values (EM's point
  estimates), when the model has any;
- ``sample_stats``: ``elbo`` with dims ``(chain, step)``, the ELBO after each
  step of each chain's fit (NaN after a restart stopped early);
- ``posterior_predictive`` (``posterior_predictive=True``): one replicate of
  every observed site per draw.

Dimension names come from :mod:`blrppl.arviz_dims` (plate names, ``time``
for chains); ``coords=`` and ``dims=`` override them as in
``az.from_numpyro``.

Restarts as chains: draws from q are independent, so ArviZ chains carry
information only when they come from different fits. ``restarts="same"``
(the default) makes one chain per restart that reached the best restart's
optimum (KL(q_c || q_best) <= 1 nat): r-hat then checks that they agree,
and a mixture's relabelled optima (label switching, equally good) are left
out instead of averaged into a meaningless summary. ``"all"`` keeps every
finite restart (r-hat > 1.01 then flags restarts in different optima);
``"best"`` keeps the best restart only.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.arviz_dims import DimNamer
from blrppl.draws import compiled_for, draw, model_data
from blrppl.graph.replay import replay
from blrppl.compile_mode import jit_for

#: Elements (draws x observations) a chunk of the log-likelihood computation holds.
CHUNK_ELEMENTS = 1 << 22
#: The largest pointwise log likelihood ``to_arviz`` builds (draws x observations x item size).
MAX_LOG_LIKELIHOOD_BYTES = 4 * 2**30
#: Restarts within this KL (nats) of the best restart's q count as the same optimum.
SAME_OPTIMUM_KL = 1.0
RESTARTS = ("same", "all", "best")


def import_arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def observed_values(graph: Any) -> dict[str, np.ndarray]:
    """Observed site -> its data, for every likelihood factor (each site of a joined loop factor)."""
    out = {}
    for name, node in graph.factors.items():
        if node.kind != "likelihood" or node.value is None:
            continue
        if node.sites:
            out.update({site: np.asarray(node.value[t]) for t, site in enumerate(node.sites)})
        else:
            out[name] = np.asarray(node.value)
    return out


def observed_factors(graph: Any) -> list[str]:
    """The observed sites with data (the likelihood factors' sites)."""
    return list(observed_values(graph))


def pointwise_log_likelihood(result: Any, latents: Mapping[str, Any], chunk_elements: int = CHUNK_ELEMENTS) -> dict:
    """Pointwise log likelihood of every observed site, one row per draw.

    Args:
      result: the fit.
      latents: draws in the layout :func:`~blrppl.draws.Draws.latents`
        (variables, chains joined), each with a leading axis of draws.
      chunk_elements: the draws of one chunk times the observations stay
        below this, so that the model's intermediates stay small.
    """
    graph = result.graph
    observed = observed_factors(graph)
    size = sum(int(np.size(v)) for v in observed_values(graph).values())
    num_draws = int(np.shape(jax.tree.leaves(latents)[0])[0]) if latents else 1
    batch = int(max(1, min(num_draws, chunk_elements // max(size, 1))))

    def build():
        def pointwise(values, params, data):
            sites = replay(graph, values, params, data=data)
            out = {}
            for name in observed:
                site = sites[name]
                log_prob = site.fn.log_prob(site.value)
                if site.mask is not None:
                    log_prob = jnp.where(site.mask, log_prob, 0.0)
                out[name] = log_prob
            return out

        def run(latents, params, data):
            if not latents:  # no latent variables: one "draw" of the fixed model
                return jax.tree.map(lambda x: x[None], pointwise({}, params, data))
            return jax.lax.map(lambda values: pointwise(values, params, data), latents, batch_size=batch)

        return jit_for(result.plan.arrays, run)

    run = compiled_for(result.plan, ("log_likelihood", batch), build, by_signature=True)
    return run(dict(latents), dict(result.state.params), model_data(result.plan))


def _check_log_likelihood_size(graph: Any, num_draws: int) -> None:
    """Refuse, with the remedy, a pointwise log likelihood larger than :data:`MAX_LOG_LIKELIHOOD_BYTES`."""
    size = sum(int(np.size(v)) for v in observed_values(graph).values())
    nbytes = num_draws * size * np.dtype(jnp.result_type(float)).itemsize
    if nbytes > MAX_LOG_LIKELIHOOD_BYTES:
        raise ValueError(
            f"the pointwise log likelihood would hold {num_draws} draws x {size} observations "
            f"({nbytes / 2**30:.1f} GiB); pass log_likelihood_thinning=k to keep every k-th draw, "
            "fewer num_samples, or log_likelihood=False."
        )


@jax.jit
def _two_keys(key: jax.Array) -> tuple:
    """``jax.random.split(key)``'s two keys, as one program (unpacking the array compiles an unstack)."""
    keys = jax.random.split(key)
    return keys[0], keys[1]


def same_optimum(result: Any) -> list[int]:
    """Restarts whose q is within :data:`SAME_OPTIMUM_KL` of the best restart's q."""
    r = result.restarts
    stacked = r.state.natural if r.state.average is None else r.state.average
    kls = np.asarray(_restart_kls(result.plan)(dict(stacked), r.best))
    finite = np.asarray(r.finite)  # read once: indexing a device array compiles a slice
    return [c for c in range(result.num_restarts) if bool(finite[c]) and (c == r.best or kls[c] <= SAME_OPTIMUM_KL)]


def _restart_kls(plan: Any) -> Callable:
    """``(stacked λ, best) -> KL(q_c || q_best)`` summed over variables, for every restart c,
    in one compiled call (eagerly, each KL's operations would compile one by one)."""
    from blrppl.draws import compiled_for
    from blrppl.families.base import kl_divergence

    def kls(stacked, best):
        total = 0.0
        for v, q in plan.qs.items():
            other = jax.tree.map(lambda a: a[best], stacked[v])
            # lax.map, not vmap: a batched LAPACK call (a Wishart's Cholesky) can deadlock jaxlib 0.10
            total = total + jax.lax.map(lambda lam: jnp.sum(kl_divergence(q.family, lam, other)), stacked[v])
        return total

    return compiled_for(plan, ("restart_kls",), lambda: jit_for(plan.arrays, kls))


def chains_of(result: Any, restarts: str) -> list[int]:
    """The restarts that become ArviZ chains (see the module docstring)."""
    if restarts not in RESTARTS:
        raise ValueError(f"restarts must be one of {RESTARTS}, got {restarts!r}.")
    if result.restarts is None:
        return [0]
    if restarts == "best":
        return [int(result.restarts.best)]
    if restarts == "all":
        return [c for c in range(result.num_restarts) if bool(result.restarts.finite[c])]
    return same_optimum(result)


def to_arviz(
    result: Any,
    rng_key: Optional[jax.Array] = None,
    num_samples: int = 1000,
    *,
    coords: Optional[Mapping[str, Any]] = None,
    dims: Optional[Mapping[str, Any]] = None,
    log_likelihood: bool = True,
    log_likelihood_thinning: int = 1,
    posterior_predictive: bool = False,
    restarts: str = "same",
) -> Any:
    """Build ``arviz.InferenceData`` from a fitted result (see the module docstring).

    Args:
      result: a fitted :class:`~blrppl.results.BLRResult`.
      rng_key: a JAX PRNG key for the draws (default ``key(0)``).
      num_samples: draws per chain.
      coords: dimension name -> coordinate values (as ``az.from_numpyro``).
      dims: site name -> its dimension names (after ``chain`` and ``draw``).
      log_likelihood: build the ``log_likelihood`` group.
      log_likelihood_thinning: keep every k-th draw in it.
      posterior_predictive: add a ``posterior_predictive`` group.
      restarts: ``"same"``, ``"all"`` or ``"best"`` (module docstring).

    Returns:
      ``arviz.InferenceData``.
    """
    import xarray as xr

    az = import_arviz()
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples}.")
    if int(log_likelihood_thinning) != log_likelihood_thinning or log_likelihood_thinning < 1:
        raise ValueError(f"log_likelihood_thinning must be a positive integer, got {log_likelihood_thinning}.")
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    graph = result.graph
    chains = chains_of(result, restarts)
    if log_likelihood:
        _check_log_likelihood_size(graph, len(chains) * -(-num_samples // int(log_likelihood_thinning)))
    fits = [result.restart(c) for c in chains]
    thinned = np.arange(0, num_samples, int(log_likelihood_thinning))
    posterior, log_lik, predicted = [], [], []
    for c, fit in enumerate(fits):
        key = rng_key if len(fits) == 1 else jax.random.fold_in(rng_key, c)
        sample_key, predictive_key = _two_keys(key)
        draws = draw(fit, sample_key, num_samples)
        posterior.append(jax.tree.map(np.asarray, draws.sites))
        if log_likelihood:  # every draw by default; thinned on the host (eager gathers compile)
            latents = draws.latents if len(thinned) == num_samples else jax.tree.map(lambda x: np.asarray(x)[thinned], draws.latents)
            log_lik.append(jax.tree.map(np.asarray, pointwise_log_likelihood(fit, latents)))
        if posterior_predictive:
            predicted.append(jax.tree.map(np.asarray, predictive(fit, predictive_key, draws.sites)))
        del draws

    namer = DimNamer(graph)
    all_dims, all_coords = {}, {}

    def name_axes(name: str, shape: tuple, param: bool = False) -> None:
        site_dims, site_coords = namer.param_dims(name, shape) if param else namer.dims(name, shape)
        if dims is not None and name in dims:
            site_dims = list(dims[name])
            if len(site_dims) != len(shape):
                raise ValueError(
                    f"site {name!r}: dims gives {len(site_dims)} names {site_dims} for a value of shape {shape}; "
                    "give one name per axis after chain and draw."
                )
            site_coords = {d: np.arange(n) for d, n in zip(site_dims, shape)}
        all_dims[name] = site_dims
        for d, values in site_coords.items():
            all_coords.setdefault(d, values)

    def stack(per_chain: list) -> dict:
        if not per_chain:
            return {}
        if len(per_chain) == 1:  # a view, not a copy (a log likelihood may be large)
            return {n: v[None] for n, v in per_chain[0].items()}
        return {n: np.stack([chain[n] for chain in per_chain]) for n in per_chain[0]}

    posterior, log_lik, predicted = stack(posterior), stack(log_lik), stack(predicted)
    for name, value in posterior.items():
        name_axes(name, value.shape[2:])
    observed = {}
    for name, value in observed_values(graph).items():
        observed[name] = value
        name_axes(name, observed[name].shape)
    params = {k: np.asarray(v) for k, v in result.state.params.items()}
    for name, value in params.items():
        name_axes(name, value.shape, param=True)
    all_coords.update(coords or {})
    def coords_of(values: dict, lead: int = 0) -> dict:
        return {d: all_coords[d] for n, v in values.items() for d in all_dims[n][: np.ndim(v) - lead]}

    def dataset(values: dict, draw_coords: Any = None) -> Any:
        # A log likelihood has the observation's batch axes only (its event is summed).
        variables = {n: (("chain", "draw", *all_dims[n][: v.ndim - 2]), v) for n, v in values.items()}
        ds_coords = {"chain": np.asarray(chains), "draw": np.arange(num_samples) if draw_coords is None else draw_coords}
        return xr.Dataset(variables, coords={**ds_coords, **coords_of(values, 2)})

    groups = {"posterior": dataset(posterior)}
    if log_likelihood:
        groups["log_likelihood"] = dataset(log_lik, thinned)
    if predicted:
        groups["posterior_predictive"] = dataset(predicted)
    if observed:
        groups["observed_data"] = xr.Dataset(
            {n: (tuple(all_dims[n]), v) for n, v in observed.items()}, coords=coords_of(observed)
        )
    if params:
        groups["constant_data"] = xr.Dataset(
            {n: (tuple(all_dims[n]), v) for n, v in params.items()},
            coords=coords_of(params),
            attrs={"description": "numpyro.param sites: fitted point estimates (EM's M-step)"},
        )
    groups["sample_stats"] = _elbo_stats(fits, chains)
    attrs = {"inference_library": "blrppl", "engine_mode": result.mode}
    if result.restarts is not None:
        attrs["best_restart"] = int(result.restarts.best)
        attrs["restarts"] = restarts
    for group in groups.values():
        group.attrs.update(attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.InferenceData(**groups)
    idata.attrs.update(attrs)
    return idata


def _elbo_stats(fits: list, chains: list) -> Any:
    """``sample_stats``: each chain's ELBO trace in its own ``step`` dimension."""
    import xarray as xr

    length = max(len(fit.elbo) for fit in fits)
    elbo = np.full((len(fits), length), np.nan)
    for c, fit in enumerate(fits):
        elbo[c, : len(fit.elbo)] = np.asarray(fit.elbo)
    return xr.Dataset(
        {"elbo": (("chain", "step"), elbo)},
        coords={"chain": np.asarray(chains), "step": np.arange(1, length + 1)},
        attrs={"description": "elbo[c, t - 1]: the ELBO of chain c's q after step t"},
    )


def predictive(result: Any, rng_key: jax.Array, samples: dict) -> dict:
    """Draws of every observed site given posterior draws (NumPyro ``Predictive``).

    The model runs with the draws substituted and its observed sites
    released (their ``obs`` dropped), so each posterior draw gets one
    replicated data set, shaped like the observations.
    """
    from numpyro.infer import Predictive

    graph = result.graph
    observed = observed_factors(graph)
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
