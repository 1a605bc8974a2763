"""Logistic regression.

beta ~ Normal(0, I),   y_n ~ Bernoulli(logits = x_n . beta)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(X, *, y=None):
    """Binary ``y`` on the columns of ``X`` (include a column of ones for an intercept)."""
    num_obs, num_features = X.shape
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    with numpyro.plate("N", num_obs):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def data():
    """200 rows: an intercept and two features (fixed seed)."""
    rng = np.random.default_rng(8)
    X = np.column_stack([np.ones(200), rng.normal(size=(200, 2))])
    p = 1.0 / (1.0 + np.exp(-(X @ np.array([-0.5, 1.5, -1.0]))))
    y = (rng.random(200) < p).astype(np.float64)
    return (jnp.asarray(X),), {"y": jnp.asarray(y)}
