"""Leave-one-out from exact (conjugate) site parameters: the methods ``exact``, ``conjugate``, ``importance``.

Observation i's site parameter λ̃_i (for each q block v the factor touches)
is the gradient of the factor's expected log density at observation i alone,
with respect to μ_v: the factor's symbolic analysis with the plate's label
kept (:func:`~blrppl.estimators.exact.exact_estimator` with an
``observation_plate``, as minibatches read it), evaluated on each
observation. Because log f_i is affine in each block's sufficient
statistics, c_i = E_q[log f_i] - Σ_v <λ̃_iv, μ_v> is its constant, and for a
factor on one block

    log ∫ f_i q_{-i} = c_i + A(λ) - A(λ - λ̃_i),   log ∫ f_i q = c_i + A(λ + λ̃_i) - A(λ),
    KL(q || q_{-i}) = A(λ - λ̃_i) - A(λ) + <λ̃_i, μ>.

See :mod:`blrppl.influence` for the methods and their diagnostics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.choosing import posterior_in_family
from blrppl.draws import compiled_family_draws, compiled_for, to_support
from blrppl.estimators.base import q_space_examples
from blrppl.graph.concrete import example_latents
from blrppl.estimators.exact import exact_estimator
from blrppl.influence import CHUNK, Influence, inner_sum, natural_and_mean


def per_observation_estimator(plan: Any, factor: str, plate: Any) -> Any:
    """The exact estimator of ``factor`` keeping ``plate``'s observations apart (``batch=`` reads them)."""
    graph, qs = plan.graph, plan.qs
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples(example_latents(graph), transforms)
    return exact_estimator(graph, factor, qs, examples, plan.init_params, observation_plate=plate)


def _statistics(q: Any, draws: Any) -> Any:
    """T(x) of draws in the family's space (a categorical needs its number of categories)."""
    if q.num_categories:
        return q.family.sufficient_stats(draws, num_categories=q.num_categories)
    return q.family.sufficient_stats(draws)


def _coupled(estimator: Any) -> bool:
    """Whether one term reads two independent positions of one block (not affine per block)."""
    for term in estimator.analysis.terms:
        reads = [read.var for read in term.reads]
        if len(reads) != len(set(reads)):
            return True
    return False


def _compiled_pass(plan: Any, factor: str, plate: Any, num_samples: int) -> tuple:
    """``(estimator, method, run)``: the per-observation pass of ``factor``, compiled once per plan.

    ``run(natural, mean, params, arrays, stats)`` returns, per observation,
    the closed-form leave-one-out and full-data log predictive densities,
    KL(q || q_-i) and (with ``stats``, T at draws from q) log q_-i / q at the
    draws, up to a constant: one evaluation of the factor's site parameters
    per observation, vectorised over chunks of observations. A second
    ``loo()`` of the same fit compiles nothing.
    """
    build = lambda: _build_pass(plan, factor, plate, num_samples)  # noqa: E731
    return compiled_for(plan, ("influence", factor, plate.name, num_samples), build)


def _build_pass(plan: Any, factor: str, plate: Any, num_samples: int) -> tuple:
    qs = plan.qs
    estimator = per_observation_estimator(plan, factor, plate)
    neighbours = estimator.neighbours
    single = len(neighbours) == 1 and not _coupled(estimator)
    in_family = posterior_in_family(plan)[0] is not None and not plan.init_params
    method = "exact" if single and in_family else "conjugate" if single else "importance"

    def run(natural, mean, params, arrays, stats):
        def one(i):
            value, sites = estimator.estimate(None, mean, params, arrays, batch=i[None])
            c, loo, lpd, kl = value, 0.0, 0.0, 0.0
            log_ratio = jnp.zeros((num_samples if stats else 1,))
            for v in neighbours:
                family, lam, site = qs[v].family, natural[v], sites[v]
                inner_mu = inner_sum(family, site, mean[v])
                a0 = jnp.sum(family.log_normalizer(lam))
                a_minus = jnp.sum(family.log_normalizer(jax.tree.map(jnp.subtract, lam, site)))
                a_plus = jnp.sum(family.log_normalizer(jax.tree.map(jnp.add, lam, site)))
                c = c - inner_mu
                loo, lpd = loo + a0 - a_minus, lpd + a_plus - a0
                kl = kl + a_minus - a0 + inner_mu  # Bregman divergence of A: KL(q || q_-i)
                if stats:  # log q_-i / q at the draws, up to a constant: -<λ̃_i, T(θ_s)>
                    log_ratio = log_ratio - jax.vmap(lambda t: inner_sum(family, site, t))(stats[v])
            return c + loo, c + lpd, kl, log_ratio

        return jax.lax.map(one, jnp.arange(plate.size), batch_size=min(CHUNK, plate.size))

    return estimator, method, jax.jit(run)


def exact_influence(result: Any, factor: str, plate: Any, rng_key: jax.Array, num_samples: int) -> Influence:
    """:class:`~blrppl.influence.Influence` of a factor with exact site parameters."""
    plan = result.plan
    qs = plan.qs
    estimator, method, run = _compiled_pass(plan, factor, plate, num_samples)
    arrays = plan.arrays._replace(factors={**plan.arrays.factors, factor: estimator.arrays})
    natural, mean = natural_and_mean(result)
    draws, stats = None, {}
    if method != "exact":
        draws = compiled_family_draws(plan, num_samples)(rng_key, natural)
        stats = {v: _statistics(qs[v], draws[v]) for v in estimator.neighbours}
    out = run(natural, mean, dict(result.state.params), arrays, stats)
    loo_lpd, lpd, kl, log_ratio = (np.asarray(x, dtype=np.float64) for x in out)
    diagnostic = np.zeros(plate.size)
    if method != "exact":
        from blrppl.arviz_io import import_arviz

        smoothed, diagnostic = _psis(import_arviz(), log_ratio)
        if method == "importance":
            log_lik = _pointwise(result, factor, plate, to_support(plan, draws))  # (S, N) at the same draws
            loo_lpd = _logsumexp(smoothed + log_lik.T, axis=1)
            lpd = _logsumexp(log_lik, axis=0) - np.log(num_samples)
    return Influence(factor, plate.name, loo_lpd, lpd, kl, np.asarray(diagnostic, dtype=float), method,
                     0 if method == "exact" else num_samples)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.squeeze(top, axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def _psis(az: Any, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pareto-smoothed, normalised log weights ``(N, S)`` and k ``(N,)`` from log ratios ``(N, S)``."""
    import warnings

    log_ratio = log_ratio - log_ratio.max(axis=1, keepdims=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k is the answer, not a warning
        smoothed, k = az.psislw(log_ratio.copy())
    constant = np.ptp(log_ratio, axis=1) <= 1e-12
    return smoothed, np.where(constant, -np.inf, k)


def _pointwise(result: Any, factor: str, plate: Any, latents: dict) -> np.ndarray:
    """log p(y_i | θ_s) per draw and observation, ``(S, N)`` (other axes of the site summed)."""
    from blrppl.arviz_io import pointwise_log_likelihood

    log_lik = np.asarray(pointwise_log_likelihood(result, latents)[factor], dtype=np.float64)
    axis = log_lik.ndim + plate.dim  # the plate's dim counts from the right of the batch shape
    log_lik = np.moveaxis(log_lik, axis, 1)
    return log_lik.reshape(log_lik.shape[0], log_lik.shape[1], -1).sum(axis=2)
