"""Leave-one-out for a likelihood on linear predictors with Gaussian q: the method ``glm``.

The factor's estimator integrates each η_i = a_i·θ + o_i by Gauss-Hermite
(Khan & Lin 2017): with g_i = E_q[ℓ_i'(η_i)] and h_i = -E_q[ℓ_i''(η_i)],
observation i's site parameter in a Gaussian block b of θ (Bonnet and Price,
Khan & Rue Eqs. 10-11) is rank one along a_ib:

    λ̃_i = (a_ib (g_i + h_i s_ib),  -h_i a_ib a_ibᵀ / 2),   s_ib = a_ib·m_b.

Removing it changes q only along a_ib (Sherman-Morrison): η_ib = a_ib·θ_b
goes from N(s_ib, u_ib) under q to

    N(s_ib - g_i u_ib / (1 - h_i u_ib),  u_ib / (1 - h_i u_ib))

under q_{-i}, every other direction unchanged. Summing the blocks (mean-field
blocks are independent; a block of independent Normal elements counts each
element as a block) gives η_i's cavity; log p(y_i | y_-i) is the Gauss-Hermite
integral of exp(ℓ_i) over it, KL(q || q_{-i}) the sum of the blocks' 1-d KLs,
and the tail index of q_{-i}/q under q is max_b h_i u_ib exactly (the ratio of
two Gaussians N(s', u') / N(s, u) has k = 1 - u / u').
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from blrppl.draws import compiled_for
from blrppl.estimators.base import q_space_examples
from blrppl.graph.concrete import example_latents
from blrppl.estimators.glm import PREDICTOR_POINTS
from blrppl.estimators.nonconjugate import glm_linear_predictor
from blrppl.estimators.quadrature import hermite_rule, predictor_expectations
from blrppl.families.mvn import MVNStats
from blrppl.influence import GLM_POINTS, Influence, natural_and_mean


def linear_predictor(plan: Any, factor: str) -> Optional[tuple]:
    """``(predictor, names, slices)`` of a GLM factor in its Gaussian neighbours, or None.

    The same analysis as the factor's estimator (:mod:`blrppl.estimators.linear_predictor`):
    the factor's per-observation log density as a function of its
    neighbours' values, split into ℓ(A z + o).
    """
    graph, qs = plan.graph, plan.qs
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples(example_latents(graph), transforms)
    fixed = {k: v for k, v in examples.items() if k not in graph.factors[factor].neighbours}
    found = glm_linear_predictor(graph, factor, qs, examples, transforms, fixed)
    return None if found is None else found[:3]


def _directions(design: Any, names: tuple, slices: tuple, mean: dict) -> list:
    """Per block: (s, u) of its part of η under q, each ``(N,)``."""
    out = []
    for v, sl in zip(names, slices):
        a, stats = design[:, sl], mean[v]
        if isinstance(stats, MVNStats):
            m = stats.x
            cov = stats.xxT - jnp.outer(m, m)
            out.append((a @ m, jnp.sum((a @ cov) * a, axis=1)))
        else:  # independent Normal elements: each element is a block
            m = jnp.ravel(stats.x)
            var = jnp.ravel(stats.x_sq) - m * m
            out.extend((a[:, j] * m[j], a[:, j] ** 2 * var[j]) for j in range(m.shape[0]))
    return out


def glm_influence(result: Any, factor: str, plate: Any) -> Optional[Influence]:
    """:class:`~blrppl.influence.Influence` of a GLM factor (module docstring), or None if it is not one."""
    plan = result.plan
    run = compiled_for(plan, ("glm", factor, plate.name), lambda: _build(plan, factor, plate))
    if run is None:
        return None
    _, mean = natural_and_mean(result)
    loo_lpd, lpd, kl, diagnostic = (np.asarray(x, dtype=np.float64) for x in run(mean))
    return Influence(factor, plate.name, loo_lpd, lpd, kl, diagnostic, "glm", 0)


def _build(plan: Any, factor: str, plate: Any) -> Optional[Any]:
    """The compiled pass ``mean -> (loo_lpd, lpd, kl, k)``, or None for a factor that is not a GLM."""
    found = linear_predictor(plan, factor)
    if found is None:
        return None
    predictor, names, slices = found
    design, offset = jnp.asarray(predictor.design), jnp.asarray(predictor.offset)
    if design.shape[0] != plate.size:
        return None  # several elements per plate position: not one predictor per observation

    def log_lik(eta):
        return predictor.log_likelihood(eta, None)

    nodes, weights = hermite_rule(PREDICTOR_POINTS)  # the fit's own rule: the fit's site parameters

    def run(mean):
        blocks = _directions(design, names, slices, mean)
        s = offset + sum(b[0] for b in blocks)
        u = sum(b[1] for b in blocks)
        _, g, second = predictor_expectations(log_lik, s, u, nodes, weights)
        h = -second
        cavity_s, cavity_u, kl, k = offset, 0.0, 0.0, 0.0
        for s_b, u_b in blocks:
            shrink = 1.0 - h * u_b
            u_new = u_b / shrink
            s_new = s_b - g * u_b / shrink
            cavity_s, cavity_u = cavity_s + s_new, cavity_u + u_new
            kl = kl + 0.5 * (jnp.log(u_new / u_b) + (u_b + (s_b - s_new) ** 2) / u_new - 1.0)
            k = jnp.maximum(k, h * u_b)  # the tail index of N(s', u') / N(s, u) under N(s, u)
        valid = (cavity_u > 0) & jnp.isfinite(cavity_s)
        loo_lpd = _predictive(log_lik, cavity_s, jnp.where(valid, cavity_u, 1.0))
        return jnp.where(valid, loo_lpd, jnp.nan), _predictive(log_lik, s, u), kl, jnp.where(valid, k, jnp.inf)

    return jax.jit(run)


def _predictive(log_lik: Any, mean: Any, var: Any) -> Any:
    """log ∫ exp(ℓ_i(η)) N(η | mean_i, var_i) dη per observation, by Gauss-Hermite."""
    nodes, weights = hermite_rule(GLM_POINTS)
    t = jnp.asarray(nodes[:, 0], mean.dtype)[:, None]
    values = log_lik(mean + jnp.sqrt(var) * t)  # (K, N)
    return logsumexp(values + jnp.log(jnp.asarray(weights, mean.dtype))[:, None], axis=0)
