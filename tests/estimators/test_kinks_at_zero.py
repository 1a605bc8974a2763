"""Derivatives of logit likelihoods at a zero linear predictor (a start from zero-mean priors).

numpyro writes ``Bernoulli(logits=η)`` and ``Binomial(n, logits=η)`` with |η| and
``clip(η, 0)``; JAX differentiates those at exactly 0 as 1 and 1/2, so autodiff of the
model's code at η = 0 gives ℓ'(0) = y instead of y - n/2. Every estimator that reads the
model's code at q's mean (the delta method through a linear predictor or through the whole
factor, cubature's centre node) must give the smooth function's derivatives there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from blrppl.estimators.cubature import cubature
from blrppl.estimators.delta import delta
from blrppl.estimators.quadrature import predictor_expectations
from blrppl.families.mvn import MVNStats

N, D = 12, 3
TRIALS = 4


def _data(dtype):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D)).astype(dtype)
    y = rng.integers(0, TRIALS + 1, size=N).astype(dtype)
    return jnp.asarray(X), jnp.asarray(y)


def _likelihood(kind, y):
    if kind == "bernoulli":
        return lambda eta: dist.Bernoulli(logits=eta).log_prob(jnp.minimum(y, 1.0)), jnp.minimum(y, 1.0), 1.0
    return lambda eta: dist.Binomial(TRIALS, logits=eta).log_prob(y), y, float(TRIALS)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["bernoulli", "binomial"])
def test_the_delta_method_on_a_linear_predictor_at_zero(kind, dtype):
    X, y = _data(dtype)
    log_lik, counts, n = _likelihood(kind, y)
    zero = jnp.zeros(N, dtype)
    nodes, weights = np.zeros((1, 1)), np.ones(1)
    _, d1, d2 = jax.jit(lambda m: predictor_expectations(log_lik, m, jnp.zeros_like(m), nodes, weights))(zero)
    rtol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(d1, counts - n / 2, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(d2, np.full(N, -n / 4), rtol=rtol)


@pytest.mark.parametrize("estimator", ["delta", "cubature at the mean", "cubature"])
@pytest.mark.parametrize("kind", ["bernoulli", "binomial"])
def test_estimators_reading_the_mean_differentiate_at_zero_as_the_smooth_function(kind, estimator):
    X, y = _data(np.float64)
    log_lik, counts, n = _likelihood(kind, y)
    mean = MVNStats(x=jnp.zeros(D), xxT=jnp.eye(D) * 1e-6)  # a narrow q at zero
    rule = {"delta": delta(), "cubature at the mean": cubature(at_mean=True), "cubature": cubature()}[estimator]
    _, grad = jax.jit(lambda m: rule.estimate(None, m, lambda beta: jnp.sum(log_lik(X @ beta))))(mean)
    gradient = X.T @ (counts - n / 2)  # at β = 0: Aᵀ ℓ'(0) and Aᵀ diag(ℓ''(0)) A
    hessian = -(n / 4) * X.T @ X
    # Bonnet and Price at m = 0: (g - H m, H / 2); cubature's spread of 1e-3 moves them by ~1e-6.
    tol = 1e-10 if estimator != "cubature" else 1e-5
    np.testing.assert_allclose(grad.x, gradient, rtol=tol, atol=tol * np.abs(gradient).max())
    np.testing.assert_allclose(grad.xxT, hessian / 2, rtol=tol, atol=tol * np.abs(hessian).max())


def test_laplace_steps_from_a_zero_mean_prior_are_newton_steps():
    """End to end: ``Laplace``'s BLR steps (ρ = 1, delta method) are Newton's from β = 0 on the zoo's
    logistic regression (the first step's intercept was +0.756 where Newton's is -0.265)."""
    import blrppl
    from models import ZOO

    entry = ZOO["logistic_regression"]
    args, kwargs = entry.data()
    X, y = np.asarray(args[0]), np.asarray(kwargs["y"])
    beta = np.zeros(X.shape[1])
    for num_steps in (1, 2):
        p = 1.0 / (1.0 + np.exp(-X @ beta))
        hessian = X.T @ (X * (p * (1.0 - p))[:, None]) + np.eye(X.shape[1])  # the N(0, 1) prior's 1
        beta = beta + np.linalg.solve(hessian, X.T @ (y - p) - beta)
        result = blrppl.Laplace(entry.model).run(jax.random.key(0), num_steps, *args, progress_bar=False, **kwargs)
        np.testing.assert_allclose(result.posterior["beta"].mean, beta, rtol=1e-9, atol=1e-12)
