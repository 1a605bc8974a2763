"""Each observation's influence and leave-one-out from its site parameter (memory perturbation).

The BLR's q is a sum of site parameters, λ = λ₀ + Σ_i λ̃_i (Khan & Rue,
Eq. 60; at a fixed point, Eq. 5), one per observation i of a plated observed
site. Removing observation i's site from λ,

    λ_{-i} = λ - λ̃_i                     (Nickl et al. 2023, "the memory-perturbation equation")

gives q without i, no refit. Each observation's site parameter comes from
its factor's estimator on that observation alone (the symbolic analysis with
the plate's label kept, as minibatches read it, or the GLM quadrature on its
linear predictor), in one pass over the observations. Per observation:

- ``loo_lpd``: log p(y_i | y_-i) ≈ log ∫ p(y_i | θ) q_{-i}(θ) dθ;
- ``lpd``: log ∫ p(y_i | θ) q(θ) dθ (their difference, summed, is p_loo);
- ``sensitivity``: KL(q || q_{-i}) in nats, how far the posterior moves
  without i (for a GLM this is the memory-perturbation "prediction error
  times prediction variance" in KL form);
- ``diagnostic``: the Pareto tail index k of q_{-i} / q under q: below 0.7
  q_{-i} is a small perturbation of q and the estimate is reliable; near 1
  observation i alone carries its posterior direction.

How ``loo_lpd`` is computed (``method``):

- ``"exact"``: a conjugate factor on one q block in a model whose posterior
  is in q's family (what ``ConjugateBayes`` fits). log f_i(θ) =
  <λ̃_i, T(θ)> + c_i is affine in T, so
  log p(y_i | y_-i) = c_i + A(λ) - A(λ - λ̃_i): equal to refitting without i
  (to rounding). No diagnostic is needed (``diagnostic`` is 0).
- ``"conjugate"``: the same closed form for a conjugate factor on one q
  block of a larger mean-field model; the other blocks are held at q
  (an approximation; ``diagnostic`` from draws).
- ``"importance"``: a conjugate factor on several q blocks: draws θ_s ~ q
  weighted by q_{-i}(θ_s) / q(θ_s) ∝ exp(-<λ̃_i, T(θ_s)>), Pareto-smoothed;
  ``diagnostic`` is the fitted k.
- ``"glm"``: a likelihood on one linear predictor η_i = a_i·θ (logistic,
  Poisson regression) with Gaussian q: the site of i is rank one along a_i,
  so q_{-i} differs from q only in η_i's marginal, the cavity
  N(s_i - g_i u_i / (1 - h_i u_i), u_i / (1 - h_i u_i)) (s_i, u_i: η_i's
  mean and variance under q; g_i, -h_i: E_q[ℓ'], E_q[ℓ'']), integrated by
  Gauss-Hermite; ``diagnostic`` is k = h_i u_i exactly.

Other factors (Monte Carlo site parameters, chains without a plate) raise
``ModelError``; PSIS-LOO (``az.loo(result.to_arviz())``) covers them.
:func:`loo` returns ``arviz.ELPDData``, so ``az.compare`` takes it.

References:
  Nickl, Xu, Tailor, Möllenhoff & Khan (2023), "The memory-perturbation
  equation", NeurIPS. Vehtari, Gelman & Gabry (2017), "Practical Bayesian
  model evaluation using leave-one-out cross-validation and WAIC".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr.elbo import mean_params
from blrppl.errors import ModelError
from blrppl.families.base import family_inner

#: k at or above this: the observation's estimate is unreliable (Vehtari et al.).
GOOD_K = 0.7
#: Gauss-Hermite nodes for a GLM's leave-one-out predictive integral.
GLM_POINTS = 64
#: Observations per chunk of the per-observation pass.
CHUNK = 256


class Influence(NamedTuple):
    """Per-observation leave-one-out and influence of one observed site (module docstring).

    Attributes:
      factor: the observed site.
      plate: the plate whose positions are the observations.
      loo_lpd: ``(N,)`` log p(y_i | y_-i).
      lpd: ``(N,)`` log E_q[p(y_i | θ)].
      sensitivity: ``(N,)`` KL(q || q_{-i}) in nats.
      diagnostic: ``(N,)`` Pareto k of q_{-i} / q (0 where ``method`` is exact).
      method: ``"exact"``, ``"conjugate"``, ``"importance"`` or ``"glm"``.
      num_samples: draws from q used (0 for closed forms).
    """

    factor: str
    plate: str
    loo_lpd: np.ndarray
    lpd: np.ndarray
    sensitivity: np.ndarray
    diagnostic: np.ndarray
    method: str
    num_samples: int

    @property
    def exact(self) -> bool:
        """Whether ``loo_lpd`` equals refitting without each observation."""
        return self.method == "exact"

    @property
    def p_loo(self) -> float:
        """Σ_i (lpd_i - loo_lpd_i): the effective number of parameters."""
        return float(np.sum(self.lpd - self.loo_lpd))


def observations(graph: Any, factor: Optional[str], plate: Optional[str]) -> tuple[str, Any]:
    """The observed site and the plate whose positions are left out, checked."""
    observed = [f for f, n in graph.factors.items() if n.kind == "likelihood" and n.value is not None]
    if factor is None:
        plated = [f for f in observed if graph.factors[f].plates]
        if len(plated) != 1:
            raise ModelError(
                f"site {(plated or observed or ['model'])[0]!r}: leave-one-out needs one plated observed site, "
                f"the model has {plated or 'none'}; pass factor=NAME."
            )
        factor = plated[0]
    if factor not in observed:
        raise ModelError(f"site {factor!r}: not an observed site of the model; use one of {observed}.")
    node = graph.factors[factor]
    if not node.plates:
        raise ModelError(
            f"site {factor!r}: its observations sit in no plate (a time series in a scan?); leave-one-out "
            "from site parameters needs a plate over the observations; use az.loo(result.to_arviz()) instead."
        )
    name = node.plates[0] if plate is None else plate
    if name not in node.plates:
        raise ModelError(f"site {factor!r}: plate {name!r} is not one of its plates {list(node.plates)}.")
    return factor, graph.plates[name]


def influence(
    result: Any, rng_key: Optional[jax.Array] = None, *, factor: Optional[str] = None,
    plate: Optional[str] = None, num_samples: int = 1000,
) -> Influence:
    """Per-observation leave-one-out and influence (see the module docstring).

    Args:
      result: a fitted :class:`~blrppl.results.BLRResult` (with restarts,
        the best one).
      rng_key: for the draws of the ``"conjugate"`` and ``"importance"``
        methods (default ``key(0)``).
      factor: the observed site (default: the model's only plated one).
      plate: the plate of its observations (default: its outermost).
      num_samples: draws from q for those methods.

    Raises:
      ModelError: for a factor whose per-observation site parameters are not
        available (module docstring).
    """
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    plan = result.plan
    factor, plate_node = observations(plan.graph, factor, plate)
    estimator = {e.factor: e for e in plan.estimators}[factor]
    if estimator.method.label == "exact":
        from blrppl.influence_exact import exact_influence

        return exact_influence(result, factor, plate_node, rng_key, num_samples)
    if estimator.method.estimator == "quadrature" and not estimator.method.exact:
        from blrppl.influence_glm import glm_influence

        found = glm_influence(result, factor, plate_node)
        if found is not None:
            return found
    raise ModelError(
        f"site {factor!r}: its site parameters are {estimator.method.label!r} estimates, which have no "
        "per-observation form here (exact conjugate factors and GLM likelihoods on Gaussian q do); "
        "use PSIS-LOO: az.loo(result.to_arviz())."
    )


def loo(result: Any, rng_key: Optional[jax.Array] = None, **options: Any) -> Any:
    """Leave-one-out as ``arviz.ELPDData`` (``az.loo``'s output; ``az.compare`` takes it).

    ``pareto_k`` holds the :class:`Influence` diagnostic (0 where exact),
    ``loo_i`` the per-observation log predictive densities with the plate
    as their dimension. Options as for :func:`influence`.
    """
    from blrppl.arviz_io import import_arviz

    import_arviz()
    import xarray as xr
    from arviz.stats.stats_utils import ELPDData

    inf = influence(result, rng_key, **options)
    n = inf.loo_lpd.shape[0]
    coords = {inf.plate: np.arange(n)}
    loo_i = xr.DataArray(inf.loo_lpd, dims=[inf.plate], coords=coords, name="loo_i")
    pareto_k = xr.DataArray(inf.diagnostic, dims=[inf.plate], coords=coords, name="pareto_k")
    elpd = float(np.sum(inf.loo_lpd))
    se = float(math.sqrt(n * np.var(inf.loo_lpd)))
    warning = bool(not inf.exact and np.any(inf.diagnostic >= GOOD_K))
    return ELPDData(
        data=[elpd, se, inf.p_loo, max(inf.num_samples, 1), n, warning, loo_i, pareto_k, "log", GOOD_K],
        index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "pareto_k", "scale", "good_k"],
    )


def natural_and_mean(result: Any) -> tuple[dict, dict]:
    """q's natural parameters (averaged iterate where the fit averages) and mean parameters."""
    natural = result.natural_params
    return natural, mean_params(result.plan.qs, natural)


def inner_sum(family: Any, natural: Any, stats: Any) -> jax.Array:
    """<λ, T> summed over every batch element."""
    return jnp.sum(family_inner(family, natural, stats))
