"""A GLM factor's site parameters from its linear predictors (Khan & Lin 2017).

A likelihood that touches its Gaussian neighbours only through η = A z + o
(found in the model's code by :mod:`~blrppl.estimators.linear_predictor`)
needs one-dimensional expectations only. Under mean-field q over the
neighbours, η_n is Gaussian with mean Σ_v A_v m_v + o and variance
Σ_v a_nvᵀ Σ_v a_nv; with E[ℓ'], E[ℓ''] per observation, each neighbour's
natural gradient is Bonnet/Price (Eqs. 10-11) with its own Hessian block
A_vᵀ diag(E[ℓ'']) A_v (its diagonal for independent Normal elements).

The delta method (Newton; Khan & Rue, Sec. 4.4) is the same formula with ℓ, ℓ'
and ℓ'' at each predictor's mean instead of their expectations: the gradient
Aᵀ ℓ'(A m + o) and Hessian Aᵀ diag(ℓ''(A m + o)) A of log f at m, in one pass
over the rows, where differentiating the model's code twice would take one
pass per coordinate of z. A fit's Newton start takes that twin
(:attr:`~blrppl.estimators.base.FactorEstimator.delta`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from blrppl.estimators.base import FactorEstimator, Method
from blrppl.estimators.glm import PREDICTOR_POINTS, natural_gradients, predictor_moments
from blrppl.estimators.linear_predictor import LinearPredictor
from blrppl.estimators.minibatch import refuse_minibatch
from blrppl.estimators.quadrature import hermite_rule, predictor_expectations

_AT_THE_MEAN = (np.zeros((1, 1)), np.ones(1))  # the delta method: one node, at each predictor's mean


def predictor_estimator(
    factor: str, qs: Any, predictor: LinearPredictor, names: tuple, slices: tuple, closed: bool
) -> FactorEstimator:
    """Gauss-Hermite on each linear predictor η_n, with its delta-method twin as ``delta``.

    Both read the factor's ``arrays`` (A, o), so a Newton start and the fit share the plan's.
    """
    quadrature = _estimator(factor, qs, predictor, names, slices, closed, delta=False)
    return quadrature._replace(delta=_estimator(factor, qs, predictor, names, slices, closed, delta=True))


def _estimator(factor, qs, predictor, names, slices, closed, delta: bool) -> FactorEstimator:
    nodes, weights = _AT_THE_MEAN if delta else hermite_rule(PREDICTOR_POINTS)

    def estimate(rng_key, mean, params, arrays, batch=None):
        del rng_key, params
        refuse_minibatch(factor, batch)
        design, offset = arrays.factors[factor]
        data = None if closed else arrays.data
        eta_mean, eta_var, blocks = predictor_moments(mean, design, offset, names, slices)
        if delta:
            eta_var = jnp.zeros_like(eta_mean)  # (its computation is left out by the compiler)
        expected, d1, d2 = predictor_expectations(
            lambda eta: predictor.log_likelihood(eta, data), eta_mean, eta_var, nodes, weights
        )
        return jnp.sum(expected), natural_gradients(qs, blocks, d1, d2)

    def replay(data_arrays):
        design, offset, ok = predictor.replay(data_arrays)
        return (design, offset), ok

    method = Method((), tuple(names), "delta" if delta else "quadrature")
    return FactorEstimator(
        factor, tuple(names), method, estimate, (predictor.design, predictor.offset), closed_data=closed,
        replay=None if closed else replay,
    )
