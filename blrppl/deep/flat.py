"""A NumPyro model as one loss over a flat unconstrained vector (Khan & Rue, Sec. 4).

The deep-learning rows of Table 1 treat the whole model as one loss of its
parameters θ: here θ is every continuous latent site, pushed to the
unconstrained space of its support and raveled into one vector u, and

    ℓ̄(u) = -[ (N / M) Σ_{i ∈ batch} log p(y_i | θ) + log p(θ) + log |J(u)| ]

is the minibatch estimate of the negative log joint (NumPyro's own plate
scaling gives the N / M; the log-Jacobian makes it a density of u). The
per-observation terms ℓ_i are kept apart for Gauss-Newton curvature
(Eq. 45). Data enter as arguments (``ModelData.arrays``), so one compiled fit
serves every data set of the same shapes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.util import log_density

from blrppl.errors import ModelError
from blrppl.graph.data import DATA_ERRORS, ModelData, split_model_data
from blrppl.graph.replay import placeholder


class LatentSite(NamedTuple):
    """One latent site: its shape, its unconstrained shape and its bijection."""

    name: str
    shape: tuple
    unconstrained_shape: tuple
    transform: Any  # numpyro transform from the unconstrained space to the support

    @property
    def size(self) -> int:
        return math.prod(self.unconstrained_shape)


class Subsample(NamedTuple):
    """The subsampled plate: name, size N and minibatch size M (M = N without one)."""

    name: Optional[str]
    size: int
    batch_size: int
    dim: int


class FlatModel(NamedTuple):
    """A model's latents as one vector u, with its loss and per-observation terms.

    Attributes:
      sites: the latent sites in trace order (offsets follow this order).
      subsample: the plate whose rows are the observations (N of them).
      data: the model's arguments, arrays apart (``split_model_data``).
      model: the NumPyro model.
      constant: the model needs concrete data values (``np.unique(x)``), so
        its data are constants of the compiled code, not arguments.
    """

    sites: tuple
    subsample: Subsample
    data: ModelData
    model: Callable
    constant: bool = False

    @property
    def dim(self) -> int:
        """The length of u."""
        return sum(s.size for s in self.sites)

    def unravel(self, u: jax.Array) -> dict:
        """u -> {site: unconstrained value}."""
        out, offset = {}, 0
        for s in self.sites:
            out[s.name] = jnp.reshape(u[offset : offset + s.size], s.unconstrained_shape)
            offset += s.size
        return out

    def ravel(self, values: dict) -> jax.Array:
        """{site: unconstrained value} -> u."""
        return jnp.concatenate([jnp.reshape(values[s.name], (-1,)) for s in self.sites])

    def constrain(self, u: jax.Array) -> tuple[dict, jax.Array]:
        """Site values in their supports, and log |det J| of the map from u."""
        values, log_jac = {}, 0.0
        for s, v in zip(self.sites, self.unravel(u).values()):
            x = s.transform(v)
            log_jac = log_jac + jnp.sum(s.transform.log_abs_det_jacobian(v, x))
            values[s.name] = x
        return values, log_jac

    def _trace(self, u: jax.Array, rows: Optional[jax.Array], arrays: tuple) -> tuple:
        values, log_jac = self.constrain(u)
        if rows is not None:
            values[self.subsample.name] = rows
        args, kwargs = self.data.rebuild(None if self.constant else arrays)
        log_joint, trace = log_density(self.model, args, kwargs, values)
        return log_joint + log_jac, trace

    def loss(self, u: jax.Array, rows: Optional[jax.Array], arrays: tuple) -> jax.Array:
        """ℓ̄(u): minus the (minibatch, N/M-scaled) log joint density of u."""
        return -self._trace(u, rows, arrays)[0]

    def split_loss(self, u: jax.Array, rows: Optional[jax.Array], arrays: tuple) -> tuple[jax.Array, jax.Array]:
        """(ℓ_i(u) for the batch's M observations, unscaled; the rest R(u)), ℓ̄ = (N/M) Σ ℓ_i + R.

        The rest R holds the priors, the log-Jacobian and observed sites
        outside the observation plate.
        """
        total, trace = self._trace(u, rows, arrays)
        per_row = jnp.zeros(self.subsample.batch_size)
        scaled = 0.0
        for site in trace.values():
            if site["type"] != "sample" or not site["is_observed"] or not self._in_plate(site):
                continue
            lp = site["fn"].log_prob(site["value"])
            if site.get("mask") is not None:
                lp = jnp.where(site["mask"], lp, 0.0)
            axis = jnp.ndim(lp) + self.subsample.dim
            lp = jnp.moveaxis(jnp.broadcast_to(lp, jnp.shape(lp)), axis, 0)
            lp = jnp.reshape(lp, (lp.shape[0], -1)).sum(-1)
            per_row = per_row - lp
            scaled = scaled + (site["scale"] if site["scale"] is not None else 1.0) * jnp.sum(lp)
        rest = -(total - scaled)
        return per_row, rest

    def _in_plate(self, site: dict) -> bool:
        return any(f.name == self.subsample.name for f in site["cond_indep_stack"])


def flat_model(model: Callable, model_args: tuple, model_kwargs: dict, engine_name: str) -> FlatModel:
    """Trace ``model`` once and lay its latents out as one vector.

    Raises:
      ModelError: for discrete latents, ``numpyro.param`` sites, plate-local
        latents under minibatches, or more than one subsampled plate.
    """
    # Latents at a point of their support and the first M rows of a subsampled plate: the layout
    # needs shapes and supports only, and a draw from each prior compiled its sampler eagerly
    # (a Gamma's: 1 s of a first call).
    placed = handlers.substitute(model, substitute_fn=_placeholders)
    trace = handlers.trace(handlers.seed(placed, 0)).get_trace(*model_args, **model_kwargs)
    sites = []
    for name, site in trace.items():
        if site["type"] == "param":
            raise ModelError(
                f"site {name!r}: {engine_name} fits a Gaussian over latent sample sites and does not estimate "
                "numpyro.param sites; give it a prior (numpyro.sample) or use EM."
            )
        if site["type"] != "sample" or site["is_observed"] or site["infer"].get("is_auxiliary"):
            continue
        fn = site["fn"]
        if fn.support.is_discrete:
            raise ModelError(
                f"site {name!r}: {engine_name} needs continuous latents, and {name!r} is discrete; "
                "marginalise it in the model or use NonConjugateVI, which enumerates discrete q."
            )
        transform = dist.biject_to(fn.support)
        value = jnp.asarray(site["value"])
        unconstrained = transform.inv(value)
        sites.append(LatentSite(name, tuple(jnp.shape(value)), tuple(jnp.shape(unconstrained)), transform))
    if not sites:
        raise ModelError(f"the model has no latent sample sites for {engine_name} to fit.")
    subsample = _observation_plate(trace, sites, engine_name)
    flat = FlatModel(tuple(sites), subsample, split_model_data(model_args, model_kwargs), model)
    rows = None if subsample.batch_size == subsample.size else jnp.arange(subsample.batch_size)
    try:
        jax.eval_shape(lambda arrays: flat.loss(jnp.zeros(flat.dim), rows, arrays), flat.data.arrays)
    except DATA_ERRORS:  # the model reads its data's values (np.unique(dept)): data stay constants
        flat = flat._replace(constant=True)
    return flat


def _placeholders(msg: dict) -> Any:
    """A latent's placeholder value (a point of its support) and a plate's first rows, else None."""
    if msg["type"] == "sample" and not msg["is_observed"] and msg["value"] is None:
        return placeholder(msg)
    if msg["type"] == "plate" and msg["value"] is None:
        return jnp.arange(msg["args"][1])
    return None


def _observation_plate(trace: dict, sites: list, engine_name: str) -> Subsample:
    """The subsampled plate, else the outermost plate of the observed sites, else none."""
    plates = [s for s in trace.values() if s["type"] == "plate" and s["args"][1] not in (None, s["args"][0])]
    if len(plates) > 1:
        names = ", ".join(repr(p["name"]) for p in plates)
        raise ModelError(
            f"sites {names}: {engine_name} draws minibatches from one subsampled plate, and the model has "
            f"{len(plates)}; subsample one plate."
        )
    observed = [s for s in trace.values() if s["type"] == "sample" and s["is_observed"]]
    if plates:
        plate = plates[0]
        frames = {f.name: f for s in observed for f in s["cond_indep_stack"]}
        if plate["name"] not in frames:
            raise ModelError(
                f"site {plate['name']!r}: the subsampled plate holds no observed site; subsample the plate "
                "of the observations."
            )
        local = [s.name for s in sites if any(f.name == plate["name"] for f in trace[s.name]["cond_indep_stack"])]
        if local:
            raise ModelError(
                f"site {local[0]!r}: a latent inside the subsampled plate {plate['name']!r} is not supported by "
                f"{engine_name} (each minibatch would rescale every row's prior); fit the full data, or use "
                "SVI(estimator='auto') for plate-local latents."
            )
        frame = frames[plate["name"]]
        return Subsample(plate["name"], int(plate["args"][0]), int(plate["args"][1]), int(frame.dim))
    for site in observed:
        if site["cond_indep_stack"]:
            frame = site["cond_indep_stack"][-1]  # outermost plate
            return Subsample(frame.name, int(frame.size), int(frame.size), int(frame.dim))
    size = int(sum(np.size(s["value"]) for s in observed)) or 1
    return Subsample(None, size, size, -1)
