"""Poisson regression with a log link.

beta ~ Normal(0, I),   y_n ~ Poisson(exp(x_n . beta))
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(X, *, y=None):
    """Counts ``y`` on the columns of ``X`` (include a column of ones for an intercept)."""
    num_obs, num_features = X.shape
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    with numpyro.plate("N", num_obs):
        numpyro.sample("y", dist.Poisson(jnp.exp(X @ beta)), obs=y)


def data():
    """150 rows: an intercept and two features (fixed seed)."""
    rng = np.random.default_rng(9)
    X = np.column_stack([np.ones(150), 0.5 * rng.normal(size=(150, 2))])
    y = rng.poisson(np.exp(X @ np.array([1.0, 0.5, -0.3]))).astype(np.float64)
    return (jnp.asarray(X),), {"y": jnp.asarray(y)}
