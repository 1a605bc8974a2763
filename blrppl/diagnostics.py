"""Is the fit any good? Pareto-smoothed importance sampling of q against the model.

For draws x_s ~ q, the importance ratios r_s = p(x_s, y) / q(x_s) have a
heavy right tail when q misses mass the posterior has. PSIS (Vehtari et al.
2024) fits a generalised Pareto distribution to the largest ratios; its shape
k measures how bad the tail is, and Yao et al. (2018, "Yes, but did it
work?: Evaluating variational inference") use it to judge a variational fit:

    k < 0.5           q is close to the posterior; importance-sampling
                      estimates from q converge fast
    0.5 <= k < k_S    usable, with care (slow convergence)
    k >= k_S          q misses the posterior: trust its means and variances
                      little (variances are usually too small)

where k_S = min(1 - 1 / log10(S), 0.7) is Vehtari et al.'s (2024, Sec. 3.2.4,
Eq. 13) sample-size dependent threshold for S draws (0.67 for S = 1000, 0.5 for
S = 100): above it, PSIS estimates from S draws are unreliable. The verdict
is taken on k rounded to two decimals, as printed, so the label always
agrees with the number shown.

Two cases PSIS cannot judge, and which are reported for what they are:

* **Exact q.** For an exact q (conjugate Bayes) the log ratio is the
  constant log p(y), and what varies is floating-point rounding: a lattice of
  a few values a few ulps apart. A generalised Pareto fit to that lattice is
  meaningless (ArviZ's ``psislw`` returns anything from -4 to +inf on it:
  the largest 20% of the ratios are mostly ties with the cut-off, so the
  exceedances it fits are mostly zeros). When the log ratios are constant up
  to rounding (their spread is within ``ROUNDING * eps`` of the magnitudes
  summed to form them), k is -inf, the verdict is ``"exact"`` and ESS = S.
* **Collapsed q.** A q whose spread has collapsed far below the prior's
  (``COLLAPSE``, compared per element by standard deviation in the site's
  own space; see :func:`collapsed_sites`) is listed in
  :attr:`ParetoK.collapsed`. If it has collapsed below floating-point
  resolution its draws are all equal, the log ratios are constant and would
  look exact; a point mass misses the whole posterior, so k is then +inf
  ("bad"), which is the truth: p / q is unbounded.

k is a tail shape, blind to scale: a Gaussian q that matches a skewed
posterior's bulk closely (log weights with a standard deviation of 0.1,
ESS 97% of S) still has k near 1 when the posterior's tails are heavier
than a Gaussian's, because the few largest weights, from q's far tail,
keep growing. That is the truth about importance sampling from q (the
weights' variance is infinite and the ESS estimate means little), not a
verdict on q's means; the report says so. A Gaussian fitted to a logistic
regression's posterior moments shows it (k about 1 at S = 4000), where the
narrower Laplace q centred at the mode gets k about 0.4.

Both densities are evaluated in the space q lives in: a Gaussian q on the
unconstrained space of a site's support is compared with the model's
density pushed to that space (log |det J| of the transform added), every
other q with the model's density on the support itself. The model's log
joint comes from NumPyro (``numpyro.infer.util.log_density``) at the drawn
latent values and the fitted point estimates, so masks, ``handlers.scale``
and ``numpyro.factor`` terms count as NumPyro counts them.

References:
  Yao, Vehtari, Simpson & Gelman (2018), ICML. Vehtari, Simpson, Gelman, Yao
  & Gabry (2024), "Pareto smoothed importance sampling", JMLR 25(72).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions.distribution import validation_enabled
from numpyro.infer.util import log_density

from blrppl.draws import compiled_family_draws, compiled_for, model_data
from blrppl.graph.replay import split_latents
from blrppl.compile_mode import full_precision, jit_for

#: k below this: q is good (Yao et al. 2018).
GOOD = 0.5
#: k at or above this (or above the sample-size threshold, if lower): q is unreliable.
BAD = 0.7
#: Log ratios whose spread is at most ``ROUNDING * eps * (sum of the magnitudes of
#: the terms of log p(x, y) and log q(x))`` are constant up to rounding. Summing n
#: terms in floating point errs by up to about log2(n) * eps * sum |terms|
#: (pairwise summation); 256 covers that with room for the log densities' own error.
ROUNDING = 256.0
#: A site whose q has a standard deviation below this fraction of its prior's
#: (in some element) has collapsed: 12 orders of magnitude in variance, which no
#: realistic amount of data explains.
COLLAPSE = 1e-6


def bad_threshold(num_samples: int) -> float:
    """The k threshold for S draws: min(1 - 1/log10 S, 0.7) (Vehtari et al. 2024, Eq. 13)."""
    if num_samples <= 1:
        return -math.inf
    return min(1.0 - 1.0 / math.log10(num_samples), BAD)


class ParetoK(NamedTuple):
    """The PSIS diagnostic of a fitted q.

    Attributes:
      k: the Pareto shape estimate (``float(diagnostic)`` gives it); -inf
        when the importance ratios are constant up to rounding (q is the
        exact posterior), +inf when q has collapsed to a point or no draw
        has a finite ratio.
      ess: the effective sample size of the Pareto-smoothed importance
        weights, between 1 and ``num_samples`` (0 when no ratio is finite).
      num_samples: the number of draws from q.
      collapsed: latent sites whose q has collapsed far below the prior's
        spread (see the module docstring); empty when none has.
      spread: max - min of the finite log ratios (how far from constant
        they are).
      rounding: the spread rounding alone can cause in them (``ROUNDING``
        times the dtype's eps times the magnitude of the terms summed).
    """

    k: float
    ess: float
    num_samples: int
    collapsed: tuple[str, ...] = ()
    spread: float = math.nan
    rounding: float = math.nan

    def __float__(self) -> float:
        return float(self.k)

    @property
    def threshold(self) -> float:
        """The k at and above which q is judged bad for this many draws."""
        return bad_threshold(self.num_samples)

    @property
    def verdict(self) -> str:
        """``"exact"`` (k = -inf), ``"good"``, ``"ok"`` or ``"bad"``.

        Judged on k as printed (two decimals) against 0.5 and
        :attr:`threshold` printed the same way, so the label agrees with
        the number shown.
        """
        if self.k == -math.inf:
            return "exact"
        if not self.k < math.inf:  # +inf or NaN: nothing to trust
            return "bad"
        shown = float(f"{self.k:.2f}")
        if shown >= float(f"{self.threshold:.2f}"):
            return "bad"
        return "good" if shown < GOOD else "ok"

    def __str__(self) -> str:
        verdict = self.verdict
        if verdict == "exact":
            text = (
                f"Pareto k -inf: exact (log weights constant up to rounding: spread "
                f"{self.spread:.1g} <= {self.rounding:.1g} over {self.num_samples} draws; "
                "q is the posterior as far as the arithmetic can tell)"
            )
        else:
            shown = f"{self.k:.2f}" if math.isfinite(self.k) else str(self.k)
            text = f"Pareto k {shown} ({verdict}"
            if verdict == "bad":
                text += f": k >= {self.threshold:.2f} for {self.num_samples} draws"
            text += ")"
        text += f", ESS {self.ess:.0f} of {self.num_samples}"
        if verdict == "bad" and self.ess > 0:
            # Vehtari et al. (2024, Sec. 3): with k this large the weights'
            # variance is infinite and the ESS estimate means little.
            text += " (not reliable at this k)"
        if self.collapsed:
            names = ", ".join(repr(n) for n in self.collapsed)
            text += (
                f"; q collapsed for {names} (spread below {COLLAPSE:g} of the prior's: "
                "a point mass misses the posterior, whatever k says)"
            )
        return text


@full_precision  # as the results' methods that call it: one program for both
def log_importance_ratios(result: Any, rng_key: jax.Array, num_samples: int = 1000) -> jax.Array:
    """log p(x_s, y) - log q(x_s) for ``num_samples`` draws x_s ~ q, shape ``(num_samples,)``.

    Densities are taken in q's own space (see the module docstring).
    """
    return _importance_draws(result, rng_key, num_samples)[0]


def _importance_draws(
    result: Any, rng_key: jax.Array, num_samples: int
) -> tuple[jax.Array, jax.Array, dict]:
    """Log ratios, the magnitude of the terms summed into each, and the draws by site.

    Returns ``(log_ratio, magnitude, sites)``: ``(S,)`` log ratios, ``(S,)``
    sums of the absolute values of every term of log p(x, y), log q(x) and
    log |det J| (the scale of their rounding error), and numpyro latent
    site name -> ``(S, *site_shape)`` values in the site's support.
    """
    plan = result.plan
    natural = result.natural_params
    draws = compiled_family_draws(plan, num_samples)(rng_key, natural)
    # One compiled function per plan signature (the data are arguments): run eagerly,
    # each of the model's operations would compile on its own (seconds for a mixture
    # on CPU), and a refit on new data compiles nothing.
    run = compiled_for(plan, ("log_ratio",), lambda: jit_for(plan.arrays, importance_ratios(plan)), by_signature=True)
    return run(draws, natural, dict(result.state.params), model_data(plan))


def importance_ratios(plan: Any, with_magnitude: bool = True):
    """``(draws, natural, params, data) -> (log_ratio, magnitude, sites)`` over a leading axis of
    draws; ``data``: the model's array arguments (None: the traced ones, as constants);
    ``with_magnitude``: False leaves the magnitude of the model's terms out (q's are kept)."""
    dtype = jnp.result_type(float)

    def log_ratio(draw: dict, natural: dict, params: dict, data: Any) -> tuple:
        log_q = jnp.zeros((), dtype)
        magnitude = jnp.zeros((), dtype)
        for v, q in plan.qs.items():
            terms = q.family.to_numpyro(natural[v]).log_prob(draw[v])
            log_q = log_q + jnp.sum(terms)
            magnitude = magnitude + jnp.sum(jnp.abs(terms))
        log_joint, size, sites = log_joint_in_q_space(plan, draw, params, data, with_magnitude=with_magnitude)
        return log_joint - log_q, magnitude + size, sites

    def log_ratios(draws: dict, natural: dict, params: dict, data: Any) -> tuple:
        # numpyro's argument checks evaluate the model's constant parameters eagerly, each
        # operation a program of its own (40 compilations, 0.9 s, for a Gaussian process):
        # draws from q are in the support by construction, so the checks are left out.
        with validation_enabled(False):
            return jax.vmap(log_ratio, in_axes=(0, None, None, None))(draws, natural, params, data)

    return log_ratios


def log_joint_in_q_space(plan: Any, point: dict, params: dict, data: Any, *, with_magnitude: bool = True) -> tuple:
    """log p(x, y) + log |det J| at a point of q's own spaces (variable -> a value in its family's
    layout: a draw, or q's mean), the density whose ratio to q's PSIS and linear response read.

    Returns ``(log_joint, magnitude, sites)``: the log density, the sum of the absolute values of
    its terms (the scale of its rounding error) and numpyro latent site name -> value.
    ``data``: the model's array arguments (None: the traced ones, as constants);
    ``with_magnitude``: False leaves the magnitude of the model's terms out (zero: nothing traced).
    """
    graph = plan.graph
    dtype = jnp.result_type(float)
    log_det = jnp.zeros((), dtype)
    magnitude = jnp.zeros((), dtype)
    values = {}
    for v, q in plan.qs.items():
        u = point[v]
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
        jacobian = q.transform.log_abs_det_jacobian(u, x)
        log_det = log_det + jnp.sum(jacobian)
        magnitude = magnitude + jnp.sum(jnp.abs(jacobian))
        values[v] = x
    substituted = split_latents(graph, values)
    sites = dict(substituted)
    substituted.update(params)
    model_args, model_kwargs = (graph.model_args, graph.model_kwargs) if data is None else graph.data.rebuild(data)
    log_joint, model_trace = log_density(graph.model, model_args, model_kwargs, substituted)
    for site in model_trace.values() if with_magnitude else ():
        if site["type"] != "sample":
            continue
        terms = jnp.abs(site["fn"].log_prob(site["value"]))
        if site.get("mask") is not None:
            terms = jnp.where(site["mask"], terms, 0.0)
        if site.get("scale") is not None:
            terms = terms * jnp.abs(site["scale"])
        magnitude = magnitude + jnp.sum(terms)
    return log_joint + log_det, magnitude, sites


def collapsed_sites(result: Any, q_sites: dict) -> tuple[str, ...]:
    """Latent sites whose q spread is below ``COLLAPSE`` times the prior's, in some element.

    The spread of q is the standard deviation of its draws (``q_sites``:
    site name -> ``(S, *shape)`` values in the site's support); the prior's
    is its standard deviation, or for a prior without a finite variance
    (HalfCauchy) its interquartile range / 1.349, of the site's prior as
    traced (its distribution at the trace's placeholder values of its
    parents, which sets the scale the data have to shrink). Discrete sites
    are skipped (a categorical q may legitimately be certain), and so are
    sites whose prior has neither or another shape (latent chains written
    with ``scan``).
    """
    priors = {}
    for node in result.plan.graph.variables.values():
        for member in node.members or (node,):
            if not member.discrete and member.prior is not None:
                priors[member.name] = member.prior
    out = []
    for name, prior in priors.items():
        if name not in q_sites:
            continue
        q_spread = np.std(np.asarray(q_sites[name], dtype=np.float64), axis=0)
        prior_spread = _prior_spread(prior, q_spread.shape)
        if prior_spread is None:
            continue
        reference = np.isfinite(prior_spread) & (prior_spread > 0)
        if np.any(q_spread[reference] < COLLAPSE * prior_spread[reference]):
            out.append(name)
    return tuple(out)


def _prior_spread(prior: Any, shape: tuple) -> Any:
    """The prior's standard deviation (or IQR / 1.349) broadcast to ``shape``, or None."""
    for spread in (
        lambda: np.sqrt(np.asarray(prior.variance, dtype=np.float64)),
        lambda: np.asarray(prior.icdf(0.75) - prior.icdf(0.25), dtype=np.float64) / 1.349,
    ):
        try:
            value = spread()
        except Exception:  # numpyro implements neither for some distributions
            continue
        if np.all(np.isfinite(value)):
            try:
                return np.broadcast_to(value, shape)
            except ValueError:  # the prior's shape is not the site's (a scan chain)
                return None
    return None


def pareto_k(result: Any, rng_key: jax.Array, num_samples: int = 1000) -> ParetoK:
    """PSIS Pareto-k and ESS of q against the model (see the module docstring).

    Args:
      result: a fitted :class:`~blrppl.results.BLRResult` (with restarts, the
        best restart; ``result.restart(c)`` for another).
      rng_key: a JAX PRNG key for the draws from q.
      num_samples: the number of draws (PSIS wants a few hundred or more).

    Returns:
      A :class:`ParetoK`: ``str()`` of it is a one-line report whose label
      agrees with the k it prints.

    Example:
      >>> diagnostic = result.pareto_k(jax.random.key(1))  # doctest: +SKIP
      >>> diagnostic.verdict in ("exact", "good")  # doctest: +SKIP
    """
    log_ratio, magnitude, q_sites = _importance_draws(result, rng_key, num_samples)
    return pareto_k_of_ratios(log_ratio, magnitude, collapsed_sites(result, q_sites))


def pareto_k_of_ratios(log_ratio: jax.Array, magnitude: jax.Array, collapsed: tuple = ()) -> ParetoK:
    """PSIS k and ESS of given log importance ratios (``(S,)``; NaN counts as a zero ratio).

    ``magnitude`` is the scale of each ratio's rounding error (see
    :func:`pareto_k`); ``collapsed`` names sites whose q has collapsed.
    """
    from blrppl.arviz_io import import_arviz

    num_samples = int(np.shape(log_ratio)[0])
    eps = float(jnp.finfo(jnp.asarray(log_ratio).dtype).eps)
    log_ratio = np.asarray(log_ratio, dtype=np.float64)
    log_ratio = np.where(np.isnan(log_ratio), -np.inf, log_ratio)
    finite = np.isfinite(log_ratio)
    if not finite.any():
        return ParetoK(math.inf, 0.0, num_samples, collapsed)
    spread = float(np.ptp(log_ratio[finite]))
    scale = np.asarray(magnitude, np.float64)[finite]
    scale = float(np.median(scale)) if np.isfinite(scale).all() else 0.0
    rounding = ROUNDING * eps * scale
    if finite.all() and spread <= rounding:
        if collapsed:  # the draws are one point: p / q is unbounded
            return ParetoK(math.inf, float(num_samples), num_samples, collapsed, spread, rounding)
        return ParetoK(-math.inf, float(num_samples), num_samples, (), spread, rounding)
    az = import_arviz()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ warns about large k; k is the answer here
        smoothed, k = az.psislw(log_ratio.copy())
    weights = np.exp(smoothed - np.max(smoothed))
    weights /= weights.sum()
    ess = float(1.0 / np.sum(weights**2))
    return ParetoK(float(k), ess, num_samples, collapsed, spread, rounding)
