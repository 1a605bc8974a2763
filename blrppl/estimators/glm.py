"""GLM likelihoods on minibatches: Gauss-Hermite on the batch's linear predictors.

A likelihood that touches its Gaussian neighbours only through η = A z + o
(found in the model's own code by
:mod:`~blrppl.estimators.linear_predictor`) needs one-dimensional
expectations only (Khan & Lin 2017). Under mean-field q over the neighbours,
η_n is Gaussian with mean Σ_v A_v m_v + o and variance Σ_v a_nvᵀ Σ_v a_nv;
with E[ℓ'_n], E[ℓ''_n] by quadrature, each neighbour's natural gradient is
Bonnet/Price (Khan & Rue, Eqs. 10-11) with its own Hessian block
A_vᵀ diag(E[ℓ'']) A_v (its diagonal for independent Normal elements).

This module is the subsampled-plate version of the full-data estimator in
:mod:`~blrppl.estimators.predictor` (stochastic VI, Sec. 5.3): the
predictor is found on one minibatch with the plate's indices an *input* of
the analysed code, so each step's design rows and observations come from
re-running the model's own code on the batch's rows (``X[idx]``, ``y[idx]``):
nothing of size N × D is stored, and a step costs O(M D²).

Each observation's site parameter lives on its scalar predictor: two numbers,

    λ̃_n = (E[ℓ'_n] - E[ℓ''_n] m_ηn,  E[ℓ''_n] / 2)      (natural parameters of η_n),

and reaches neighbour v as x-coefficient b_nv = λ̃_n1 + 2 λ̃_n2 r_nv on a_nv and
second-order coefficient c_n = λ̃_n2 on a_nv a_nvᵀ, with r_nv = m_ηn - a_nvᵀ m_v
the rest of the predictor. Local-mode SVI stores (b, c) per observation and
neighbour (O(N) numbers, never O(N D²)) and swaps the minibatch's (Eq. 60;
:class:`ObservationSites`, :mod:`blrppl.blr.incremental`).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, owner
from blrppl.estimators.linear_predictor import LinearPredictor, find_linear_predictor
from blrppl.estimators.minibatch import rows_or_all
from blrppl.estimators.quadrature import hermite_rule, predictor_expectations
from blrppl.families import MVNStats, NormalStats
from blrppl.graph.data import DATA_ERRORS

#: Nodes per linear predictor: one-dimensional, so many are cheap (softplus-type
#: likelihoods reach ~1e-5 relative accuracy with 20, 1e-9 with 50).
PREDICTOR_POINTS = 20


class ObservationSites(NamedTuple):
    """Per-observation two-number sites of a GLM factor (module docstring).

    Attributes:
      fresh: ``(mean, params, arrays, batch) -> {v: (rows, b, c)}``: the
        minibatch's design rows of neighbour v (M, D_v) and its sites' x
        coefficient b (M,) and second-order coefficient c (M,) under q now.
      contribution: ``(v, rows, b, c) -> λ`` (v's natural-parameter layout):
        Σ_n of the sites (b_n, c_n) on rows a_n; linear in (b, c).
    """

    fresh: Callable[..., dict]
    contribution: Callable[..., Any]


def find_minibatch_glm(graph, factor, qs, examples, transforms, fixed, plate):
    """The GLM structure of the factor on one minibatch of ``plate``, or None.

    z concatenates the neighbours' values (each a full block, or independent
    Normal elements); returns ``(predictor, names, slices)``: the predictor's
    ``predict`` and ``log_likelihood`` take ``(model data, indices)``.
    """
    node = graph.factors[factor]
    names = tuple(node.neighbours)
    for v in names:
        q = qs[v]
        if not q.family.gaussian or q.family.chain or q.transform is not None or owner(graph, factor) == v:
            return None
        if q.family.event_ndim == 1 and q.num_batch:
            return None
    if node.param_neighbours:
        return None
    sizes = [math.prod(qs[v].shape) for v in names]
    bounds = np.cumsum([0] + sizes)
    slices = tuple(slice(int(a), int(b)) for a, b in itertools.pairwise(bounds))
    per_element = factor_log_density(
        graph, factor, transforms, fixed, use_canonical=False, elementwise=True, subsample=plate
    )

    def fn(z, data):
        values = {v: jnp.reshape(z[sl], qs[v].shape) for v, sl in zip(names, slices)}
        return per_element(values, {}, data[0], data[1])

    z0 = jnp.concatenate([jnp.ravel(jnp.asarray(examples[v], dtype=float)) for v in names])
    rows = jnp.arange(plate.subsample_size)
    try:
        predictor = find_linear_predictor(fn, z0, (graph.data.arrays, rows))
    except DATA_ERRORS:  # the model needs concrete data: Monte Carlo reads minibatches instead
        return None
    return None if predictor is None else (predictor, names, slices)


def predictor_moments(mean, design, offset, names, slices):
    """η = design @ x + offset: its mean and variance under q, and each neighbour's (v, rows, mean, stats)."""
    eta_mean, eta_var = offset, 0.0
    blocks = []
    for v, sl in zip(names, slices):
        a, stats = design[:, sl], mean[v]
        if isinstance(stats, MVNStats):
            m = stats.x
            cov = stats.xxT - jnp.outer(m, m)
            eta_var = eta_var + jnp.sum((a @ cov) * a, axis=1)
        else:
            m = jnp.ravel(stats.x)
            eta_var = eta_var + (a * a) @ (jnp.ravel(stats.x_sq) - m * m)
        eta_mean = eta_mean + a @ m
        blocks.append((v, a, m, stats))
    return eta_mean, eta_var, blocks


def _second_order(qs, v, a, weights):
    """Σ_n w_n a_n a_nᵀ (full block) or Σ_n w_n a_n² (independent elements), v's layout."""
    # Row vectors times A, never Aᵀ times a column: XLA:CPU copies a transposed (N, D) operand
    # first (a tenth of a logistic regression's step at N = 100,000).
    if qs[v].family.event_ndim == 1:
        return a.T @ (a * weights[:, None])
    return jnp.reshape(weights @ (a * a), qs[v].shape)


def natural_gradients(qs, blocks, d1, d2) -> dict:
    """Bonnet/Price from E[ℓ'], E[ℓ''] per observation (Eqs. 10-11): each neighbour's
    ``(v, rows, mean, stats)`` of :func:`predictor_moments`."""
    grads = {}
    for v, a, m, stats in blocks:
        g = d1 @ a
        hessian = _second_order(qs, v, a, d2)
        if isinstance(stats, MVNStats):
            grads[v] = MVNStats(x=g - hessian @ m, xxT=0.5 * hessian)  # Eqs. 10-11
        else:
            shape = qs[v].shape
            grads[v] = NormalStats(x=jnp.reshape(g, shape) - hessian * jnp.reshape(m, shape), x_sq=0.5 * hessian)
    return grads


def minibatch_glm_estimator(factor: str, qs, predictor: LinearPredictor, names, slices, plate) -> FactorEstimator:
    """Gauss-Hermite on the linear predictors of a minibatch (module docstring).

    ``estimate(..., batch=idx)`` is the batch's unscaled sum (the BLR step
    rescales it by N / M for global variables); ``batch=None`` sums every
    row in chunks of M (:func:`~blrppl.estimators.minibatch.rows_or_all`).
    """
    nodes, weights = hermite_rule(PREDICTOR_POINTS)
    total = slices[-1].stop
    dtype = predictor.design.dtype

    def on_rows(mean, arrays, idx):
        data = (arrays.data, idx)
        z0 = jnp.zeros((total,), dtype)
        offset = predictor.predict(z0, data)
        design = jax.jacfwd(lambda z: predictor.predict(z, data))(z0)  # the batch's rows of A: (M, D)
        eta_mean, eta_var, blocks = predictor_moments(mean, design, offset, names, slices)
        expected, d1, d2 = predictor_expectations(
            lambda eta: predictor.log_likelihood(eta, data), eta_mean, eta_var, nodes, weights
        )
        return eta_mean, blocks, expected, d1, d2

    def estimate_rows(rng_key, mean, params, arrays, idx, w):
        del rng_key, params
        _, blocks, expected, d1, d2 = on_rows(mean, arrays, idx)
        return jnp.sum(w * expected), natural_gradients(qs, blocks, w * d1, w * d2)

    def fresh(mean, params, arrays, batch):
        del params
        eta_mean, blocks, _, d1, d2 = on_rows(mean, arrays, batch)
        lam1, lam2 = d1 - d2 * eta_mean, 0.5 * d2  # the site on η_n (Khan & Lin 2017)
        out = {}
        for v, a, m, _ in blocks:
            rest = eta_mean - a @ m
            out[v] = (a, lam1 + 2.0 * lam2 * rest, lam2)
        return out

    def contribution(v, a, b, c):
        second = _second_order(qs, v, a, c)
        x = b @ a
        if qs[v].family.event_ndim == 1:
            return MVNStats(x=x, xxT=second)
        return NormalStats(x=jnp.reshape(x, qs[v].shape), x_sq=second)

    method = Method((), tuple(names), "quadrature")
    return FactorEstimator(
        factor, tuple(names), method, rows_or_all(estimate_rows, plate), None,
        subsample=plate, observation_sites=ObservationSites(fresh, contribution),
    )


def minibatch_glm_or_none(graph, factor, qs, examples, transforms, fixed, plate) -> Optional[FactorEstimator]:
    """:func:`minibatch_glm_estimator` where the factor has a GLM structure, else None."""
    found = find_minibatch_glm(graph, factor, qs, examples, transforms, fixed, plate)
    if found is None:
        return None
    return minibatch_glm_estimator(factor, qs, *found, plate=plate)
