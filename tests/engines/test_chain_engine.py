"""A scan chain gets a chain Gaussian q: ConjugateBayes is the exact Kalman smoother."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan
from scipy.stats import multivariate_normal

import blrppl

T, LEVEL_SD, OBS_SD = 30, 0.5, 1.0


def local_level(y=None):
    level0 = numpyro.sample("level0", dist.Normal(0.0, 10.0))

    def transition(prev, y_t):
        level = numpyro.sample("level", dist.Normal(prev, LEVEL_SD))
        numpyro.sample("y", dist.Normal(level, OBS_SD), obs=y_t)
        return level, level

    scan(transition, level0, y, length=T)


def dense_posterior(y):
    n = T + 1
    precision, linear = np.zeros((n, n)), np.zeros(n)
    precision[0, 0] = 1.0 / 100.0
    for t in range(1, n):
        w = 1.0 / LEVEL_SD**2
        precision[t, t] += w
        precision[t - 1, t - 1] += w
        precision[t, t - 1] -= w
        precision[t - 1, t] -= w
        precision[t, t] += 1.0 / OBS_SD**2
        linear[t] += y[t - 1] / OBS_SD**2
    covariance = np.linalg.inv(precision)
    return covariance @ linear, covariance


def test_conjugate_bayes_on_a_scan_local_level_is_the_kalman_smoother(rng_key):
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.normal(0.0, LEVEL_SD, T)) + rng.normal(0.0, OBS_SD, T)
    result = blrppl.ConjugateBayes(local_level).run(rng_key, 2, y=jnp.asarray(y), progress_bar=False)
    assert result.plan.qs["level"].family.name == "ScalarChainGaussian"
    q = result.posterior["level"]
    mean, covariance = dense_posterior(y)
    np.testing.assert_allclose(q.mean, mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(q.variance, np.diag(covariance), rtol=1e-10)
    # The ELBO of the exact posterior is the log evidence.
    design = np.eye(T + 1)[1:]
    prior_cov = np.linalg.inv(np.linalg.inv(covariance) - design.T @ design / OBS_SD**2)
    evidence = multivariate_normal(np.zeros(T), design @ prior_cov @ design.T + OBS_SD**2 * np.eye(T)).logpdf(y)
    np.testing.assert_allclose(result.elbo, evidence, rtol=1e-10)
    draws = result.sample(rng_key, 5)
    assert draws["level"].shape == (5, T) and draws["level0"].shape == (5,)  # the model's sites


def random_walk(y=None):
    level = numpyro.sample("level", dist.GaussianRandomWalk(LEVEL_SD, num_steps=T))
    with numpyro.plate("time", T):
        numpyro.sample("y", dist.Normal(level, OBS_SD), obs=y)


def test_gaussian_random_walk_gets_the_exact_smoother(rng_key):
    rng = np.random.default_rng(1)
    y = np.cumsum(rng.normal(0.0, LEVEL_SD, T)) + rng.normal(0.0, OBS_SD, T)
    result = blrppl.ConjugateBayes(random_walk).run(rng_key, 1, y=jnp.asarray(y), progress_bar=False)
    w = 1.0 / LEVEL_SD**2
    precision = np.eye(T) / OBS_SD**2
    precision[0, 0] += w
    for t in range(1, T):
        precision[t, t] += w
        precision[t - 1, t - 1] += w
        precision[t, t - 1] -= w
        precision[t - 1, t] -= w
    covariance = np.linalg.inv(precision)
    q = result.posterior["level"]
    np.testing.assert_allclose(q.mean, covariance @ y / OBS_SD**2, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(q.variance, np.diag(covariance), rtol=1e-10)
