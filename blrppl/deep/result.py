"""The result of a diagonal-Gaussian fit: q per site, draws, a guide, ArviZ."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import Predictive

from blrppl.compile_mode import probe, structure_of
from blrppl.deep.flat import FlatModel
from blrppl.deep.rules import DiagonalState, Rule
from blrppl.errors import ModelError
from blrppl.posterior import TransformedGaussian, is_identity

MAX_DRAWN_NUMBERS = 1 << 27
"""The most numbers (1 GiB of float64) that :meth:`DiagonalResult.sample` draws for one deterministic site."""


class DiagonalResult:
    """q(u) = N(m, diag(s)^-1) on the unconstrained space, shown site by site.

    m and s are the averages of the iterates over the run's last part
    (``average``), or the last iterate.

    Attributes:
      elbo: one entry per step: the one-sample minibatch estimate -ℓ̄(u) + H(q)
        of the ELBO of q before that step (at u = m for the delta-method rows,
        where it is not an ELBO but the Laplace objective).
      state: the :class:`~blrppl.deep.rules.DiagonalState`; pass it back as
        ``init_state`` to go on.
      rule: the Table 1 row (``"ivon"``, ``"vogn"``, ``"ogn"``, ``"rmsprop"``, ``"adam"``).
      flags: doubts about the fit, in words (empty when none).
    """

    def __init__(self, flat: FlatModel, rule: Rule, state: DiagonalState, elbo: jax.Array, flags: tuple):
        self.flat = flat
        self.rule = rule.name
        self.state = state
        self.elbo = elbo
        self.flags = flags
        self.mode = "global"
        self.params: dict = {}
        self.site_params: dict = {}

    @property
    def trustworthy(self) -> bool:
        """False when a flag says the estimate may be wrong."""
        return not self.flags

    def _site_moments(self) -> tuple[dict, dict, dict]:
        """Site -> m, s and 1 / sqrt(s), from the averaged state by one compiled program (eagerly,
        each of its operations compiled a program of its own: 1.4 s for ``posterior``)."""

        def moments(state):
            m, s = (self.flat.unravel(a) for a in state.averaged())
            return m, s, {name: 1.0 / jnp.sqrt(value) for name, value in s.items()}

        return probe(moments)(self.state)

    @property
    def natural_params(self) -> dict:
        """Site -> (s ⊙ m, -s / 2): q's natural parameters on the unconstrained space."""
        m, s, _ = self._site_moments()
        return {name: (s[name] * m[name], -0.5 * s[name]) for name in m}

    @property
    def posterior(self) -> dict:
        """Site -> q's marginal in the site's support (``.mean``, ``.variance`` included)."""
        m, _, scales = self._site_moments()
        out = {}
        for site in self.flat.sites:
            loc, scale = m[site.name], scales[site.name]
            # s > 0 holds by construction (the rules keep it positive): no argument checks to run.
            base = dist.Normal(loc, scale, validate_args=False).to_event(len(site.unconstrained_shape))
            if is_identity(site.transform):
                out[site.name] = base
            else:
                out[site.name] = TransformedGaussian(base, site.transform, loc, scale)
        return out

    def sample(self, rng_key: jax.Array, num_samples: int) -> dict:
        """Latent and deterministic sites -> (num_samples, *shape) draws from q.

        Deterministic sites inside the subsampled plate are computed on all N of its
        rows, not on one minibatch (the model runs with the plate's indices 0..N-1).
        One compiled program (:func:`~blrppl.compile_mode.probe`, once per structure and
        number of draws): run eagerly, each of its operations and of the model's compiled a
        program of its own (46 of them, 4-5 s, for a 5-coefficient regression).
        """
        deterministic = self._deterministic_sites()
        for name, shape in deterministic.items():
            size = num_samples * math.prod(shape)
            if size > MAX_DRAWN_NUMBERS:
                raise ModelError(
                    f"site {name!r}: {num_samples} draws of this deterministic site (shape {tuple(shape)} per draw, "
                    f"on all rows of its plate) would hold {size:,} numbers; draw fewer (num_samples=...), or "
                    "compute it on the rows you need with numpyro.infer.Predictive and result.guide()."
                )
        flat, model = self.flat, self._on_all_rows()

        def draw(rng_key, state, arrays):
            mean, precision = state.averaged()
            noise = jax.random.normal(rng_key, (num_samples,) + mean.shape, mean.dtype)
            u = mean + noise / jnp.sqrt(precision)
            latents = jax.vmap(lambda v: flat.constrain(v)[0])(u)
            if deterministic:
                args, kwargs = flat.data.rebuild(arrays)
                extra = Predictive(model, posterior_samples=latents, return_sites=list(deterministic))(
                    jax.random.fold_in(rng_key, 1), *args, **kwargs
                )
                latents.update(extra)
            return latents

        return probe(draw)(rng_key, self.state, tuple(flat.data.arrays))

    def _on_all_rows(self) -> Callable:
        """The model with its subsampled plate's indices fixed to all N rows (else the model)."""
        sub = self.flat.subsample
        if sub.name is None or sub.batch_size == sub.size:
            return self.flat.model
        model = numpyro.handlers.substitute(self.flat.model, data={sub.name: jnp.arange(sub.size)})

        def on_all_rows(*args: Any, **kwargs: Any) -> Any:
            with warnings.catch_warnings():  # numpyro warns that N indices are not subsample_size M
                warnings.filterwarnings("ignore", message="subsample_size does not match", category=UserWarning)
                return model(*args, **kwargs)

        return on_all_rows

    def _deterministic_sites(self) -> dict:
        """The model's deterministic sites and their shapes on all rows, read from an abstract
        run (nothing compiled)."""
        model = self._on_all_rows()

        def shapes(arrays):
            args, kwargs = self.flat.data.rebuild(arrays)
            trace = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(*args, **kwargs)
            return {name: jnp.shape(site["value"]) for name, site in trace.items() if site["type"] == "deterministic"}

        return structure_of(shapes, tuple(self.flat.data.arrays))

    def guide(self) -> Callable:
        """A NumPyro guide drawing every latent site from q (for ``Predictive``)."""
        posterior = self.posterior

        def guide(*args: Any, **kwargs: Any) -> None:
            for name, q in posterior.items():
                numpyro.sample(name, q)

        return guide

    def to_arviz(self, rng_key: Optional[jax.Array] = None, num_samples: int = 1000) -> Any:
        """``arviz.InferenceData`` with one chain of ``num_samples`` draws from q."""
        import arviz as az

        if rng_key is None:
            rng_key = jax.random.key(0)
        draws = self.sample(rng_key, num_samples)
        posterior = {name: jax.device_get(value)[None] for name, value in draws.items()}
        return az.from_dict(posterior=posterior)
