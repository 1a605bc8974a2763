"""The result of a fit: q, the ELBO trace, point estimates, samples and a guide."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from blrppl.blr.state import BLRState
from blrppl.graph.replay import replay, split_latents
from blrppl.posterior import block_marginals, q_distribution


class BLRResult(NamedTuple):
    """What ``engine.run`` returns.

    Attributes:
      plan: the traced graph, each variable's q and each factor's estimator.
      state: the final engine state; pass it back as ``init_state`` to resume.
      elbo: the ELBO of q after each step run, shape ``(num_steps,)`` (fewer
        when ``tol`` stopped the run early).
      mode: ``"global"`` or ``"local"``.
    """

    plan: Any
    state: BLRState
    elbo: jax.Array
    mode: str

    @property
    def graph(self):
        """The traced :class:`~blrppl.graph.nodes.FactorGraph`."""
        return self.plan.graph

    @property
    def natural_params(self) -> dict:
        """Variable name -> natural parameters of its q."""
        return dict(self.state.natural)

    @property
    def site_params(self) -> dict:
        """Local mode: factor name -> {variable -> site parameter}; global mode: {}."""
        return dict(self.state.site_params) if self.mode == "local" else {}

    @property
    def params(self) -> dict:
        """``numpyro.param`` name -> fitted value in its constrained space."""
        return dict(self.state.params)

    @property
    def posterior(self) -> dict:
        """Latent site name -> the fitted q marginal as a numpyro Distribution.

        A joint block contributes one marginal per site it joins.
        """
        out = {}
        for v, q in self.plan.qs.items():
            if getattr(q.transform, "sites", None) is not None:
                out.update(block_marginals(q, self.state.natural[v]))
            else:
                out[v] = q_distribution(q, self.state.natural[v])
        return out

    def sample(self, rng_key: jax.Array, num_samples: int) -> dict:
        """Joint draws from q: latent and deterministic site -> ``(num_samples, *shape)``."""
        keys = jax.random.split(rng_key, len(self.plan.qs))
        latents = {}
        for key, (v, q) in zip(keys, self.plan.qs.items()):
            draws = q.family.sample(key, self.state.natural[v], (num_samples,))
            if q.kind != "categorical" and q.family.event_ndim == 1 and len(q.block_shape) != 1:
                draws = jnp.reshape(draws, (num_samples,) + q.shape)
            if getattr(q.transform, "sites", None) is not None:
                latents.update(q.transform(draws))
                continue
            latents[v] = draws if q.transform is None else q.transform(draws)
        graph = self.graph
        names = list(graph.deterministics)
        sites = jax.vmap(lambda values: split_latents(graph, values))(latents)
        if not names:
            return {**sites, **latents}

        def deterministic(values):
            sites = replay(graph, values, self.state.params, deterministic=True)
            return {n: sites[n].value for n in names if n in sites}

        dets = jax.vmap(deterministic)(latents)
        return {**sites, **latents, **dets}

    def to_arviz(self, rng_key: jax.Array | None = None, num_samples: int = 1000):
        """The fit as ``arviz.InferenceData``: posterior draws, log likelihood, ELBO."""
        from blrppl.arviz_io import to_arviz

        return to_arviz(self, rng_key, num_samples)

    def guide(self) -> Callable:
        """A NumPyro guide drawing every latent site from q (for ``Predictive``)."""
        posterior = self.posterior
        graph = self.graph
        blocks = {v: q for v, q in self.plan.qs.items() if getattr(q.transform, "sites", None) is not None}
        joint = {v: q.family.to_numpyro(self.state.natural[v]) for v, q in blocks.items()}
        members = {site for q in blocks.values() for site in q.transform.sites}

        def guide(*args: Any, **kwargs: Any) -> None:
            del args, kwargs
            for v, q in blocks.items():
                flat = numpyro.sample(f"_blrppl_{v}", joint[v], infer={"is_auxiliary": True})
                for site, value in q.transform(flat).items():
                    numpyro.sample(site, dist.Delta(value, event_dim=jnp.ndim(value)))
            for v, d in posterior.items():
                if v in members:
                    continue
                chain = graph.variables[v].chain
                if chain is None or len(chain.sites) == 1:
                    numpyro.sample(v, d)
                    continue
                value = numpyro.sample(f"_blrppl_{v}", d, infer={"is_auxiliary": True})
                for site, part in split_latents(graph, {v: value}).items():
                    numpyro.sample(site, dist.Delta(part, event_dim=jnp.ndim(part)))

        return guide
