"""Bayesian linear regression with unknown noise precision.

alpha ~ Normal(0, 10),   beta ~ Normal(0, I),   tau ~ Gamma(1, 1)
y_n ~ Normal(alpha + x_n . beta, 1 / sqrt(tau))
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(X, *, y=None):
    """Linear regression of ``y`` on the columns of ``X`` (N x D)."""
    num_obs, num_features = X.shape
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", num_obs):
        numpyro.sample("y", dist.Normal(alpha + X @ beta, 1.0 / jnp.sqrt(tau)), obs=y)


def data():
    """100 rows, 3 features, noise sd 0.5 (fixed seed)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(100, 3))
    y = 1.0 + X @ np.array([0.5, -1.0, 2.0]) + 0.5 * rng.normal(size=100)
    return (jnp.asarray(X),), {"y": jnp.asarray(y)}


def noise_scale_model(X, *, y=None):
    """The same regression with a half-normal prior on the noise scale.

    alpha ~ Normal(0, 10),   beta ~ Normal(0, I),   sigma ~ HalfNormal(1)
    y_n ~ Normal(alpha + x_n . beta, sigma)

    Given sigma every factor is conjugate, so ``blrppl.Integrated`` integrates
    sigma on a grid over exact conditionals of (alpha, beta).
    """
    num_obs, num_features = X.shape
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("N", num_obs):
        numpyro.sample("y", dist.Normal(alpha + X @ beta, sigma), obs=y)
