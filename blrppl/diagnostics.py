"""Is the fit any good? Pareto-smoothed importance sampling of q against the model.

For draws x_s ~ q, the importance ratios r_s = p(x_s, y) / q(x_s) have a
heavy right tail when q misses mass the posterior has. PSIS (Vehtari et al.
2024) fits a generalised Pareto distribution to the largest ratios; its shape
k measures how bad the tail is, and Yao et al. (2018, "Yes, but did it
work?: Evaluating variational inference") use it to judge a variational fit:

    k < 0.5          q is close to the posterior; importance-sampling
                     estimates from q converge fast
    0.5 <= k < 0.7   usable, with care (slow convergence)
    k >= 0.7         q misses the posterior: trust its means and variances
                     little (variances are usually too small)

(Vehtari et al. 2024 refine the 0.7 cut to min(1 - 1 / log10(S), 0.7) for S
draws; with S >= 1000 it is 0.67-0.7.)

Both densities are evaluated in the space q lives in: a Gaussian q on the
unconstrained space of a site's support is compared with the model's
density pushed to that space (log |det J| of the transform added), every
other q with the model's density on the support itself. The model's log
joint comes from NumPyro (``numpyro.infer.util.log_density``) at the drawn
latent values and the fitted point estimates, so masks, ``handlers.scale``
and ``numpyro.factor`` terms count as NumPyro counts them. For an exact q
(conjugate Bayes) the log ratio is the constant log p(y); PSIS cannot fit a
tail to constant ratios, and k is then reported as -inf.

References:
  Yao, Vehtari, Simpson & Gelman (2018), ICML. Vehtari, Simpson, Gelman, Yao
  & Gabry (2024), "Pareto smoothed importance sampling", JMLR 25.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import log_density

from blrppl.graph.replay import split_latents

#: k below this: q is good (Yao et al. 2018).
GOOD = 0.5
#: k at or above this: q is unreliable.
BAD = 0.7


class ParetoK(NamedTuple):
    """The PSIS diagnostic of a fitted q.

    Attributes:
      k: the Pareto shape estimate (``float(diagnostic)`` gives it); -inf
        when the importance ratios are constant (q is the exact posterior).
      ess: the effective sample size of the Pareto-smoothed importance
        weights, between 1 and ``num_samples``.
      num_samples: the number of draws from q.
    """

    k: float
    ess: float
    num_samples: int

    def __float__(self) -> float:
        return float(self.k)

    @property
    def verdict(self) -> str:
        """``"good"`` (k < 0.5), ``"ok"`` (k < 0.7) or ``"bad"``."""
        if self.k < GOOD:
            return "good"
        return "ok" if self.k < BAD else "bad"

    def __str__(self) -> str:
        return f"Pareto k {self.k:.3g} ({self.verdict}), ESS {self.ess:.0f} of {self.num_samples}"


def log_importance_ratios(result: Any, rng_key: jax.Array, num_samples: int = 1000) -> jax.Array:
    """log p(x_s, y) - log q(x_s) for ``num_samples`` draws x_s ~ q, shape ``(num_samples,)``.

    Densities are taken in q's own space (see the module docstring).
    """
    plan, state = result.plan, result.state
    natural = result.natural_params
    graph = plan.graph
    keys = jax.random.split(rng_key, max(len(plan.qs), 1))
    draws = {
        v: q.family.sample(key, natural[v], (num_samples,))
        for key, (v, q) in zip(keys, plan.qs.items())
    }
    params = dict(state.params)

    def log_ratio(draw):
        log_q = jnp.zeros((), jnp.result_type(float))
        log_det = jnp.zeros((), jnp.result_type(float))
        values = {}
        for v, q in plan.qs.items():
            u = draw[v]
            log_q = log_q + jnp.sum(q.family.to_numpyro(natural[v]).log_prob(u))
            if q.joint:
                values.update(q.transform(u))
                for site in q.transform.sites:
                    log_det = log_det + q.transform.log_abs_det_jacobian_site(u, site)
                continue
            u = q.value_from_family(u)
            if q.transform is None:
                values[v] = u
                continue
            x = q.transform(u)
            log_det = log_det + jnp.sum(q.transform.log_abs_det_jacobian(u, x))
            values[v] = x
        data = split_latents(graph, values)
        data.update(params)
        log_joint, _ = log_density(graph.model, graph.model_args, graph.model_kwargs, data)
        return log_joint + log_det - log_q

    # One compiled function: run eagerly, each of the model's operations
    # would compile on its own (seconds for a mixture on CPU).
    return jax.jit(jax.vmap(log_ratio))(draws)


def pareto_k(result: Any, rng_key: jax.Array, num_samples: int = 1000) -> ParetoK:
    """PSIS Pareto-k and ESS of q against the model (see the module docstring).

    Args:
      result: a fitted :class:`~blrppl.results.BLRResult` (with restarts, the
        best restart; ``result.restart(c)`` for another).
      rng_key: a JAX PRNG key for the draws from q.
      num_samples: the number of draws (PSIS wants a few hundred or more).

    Returns:
      A :class:`ParetoK`.

    Example:
      >>> diagnostic = result.pareto_k(jax.random.key(1))  # doctest: +SKIP
      >>> diagnostic.k < 0.7  # doctest: +SKIP
    """
    from blrppl.arviz_io import import_arviz

    az = import_arviz()
    log_ratio = np.asarray(log_importance_ratios(result, rng_key, num_samples), dtype=np.float64)
    log_ratio = np.where(np.isnan(log_ratio), -np.inf, log_ratio)
    finite = log_ratio[np.isfinite(log_ratio)]
    if finite.size == 0:
        return ParetoK(math.inf, 0.0, num_samples)
    spread = finite.max() - finite.min()
    if finite.size == log_ratio.size and spread <= 1e-12 * max(1.0, float(np.abs(finite).max())):
        return ParetoK(-math.inf, float(num_samples), num_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ warns about large k; k is the answer here
        smoothed, k = az.psislw(log_ratio.copy())
    weights = np.exp(smoothed - np.max(smoothed))
    weights /= weights.sum()
    ess = float(1.0 / np.sum(weights**2))
    return ParetoK(float(k), ess, num_samples)
