"""Multivariate-output regression with a (6, 2) coefficient matrix, no plates over it.

W ~ Normal(0, 2) elementwise (shape (6, 2), written with ``expand``, no plate),
y_n ~ MultivariateNormal(x_n W, Sigma) with a known 2 x 2 noise covariance.

W's q is one full-covariance Gaussian over its 12 entries (its two axes are
not plates), so ``ConjugateBayes`` is the exact posterior.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

NOISE_COVARIANCE = np.array([[1.0, 0.6], [0.6, 2.0]])


def model(X, *, y=None):
    """Regression of the (N, 2) outputs ``y`` on the (N, 6) inputs ``X``."""
    num_features = X.shape[1]
    W = numpyro.sample("W", dist.Normal(0.0, 2.0).expand([num_features, 2]))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(X @ W, covariance_matrix=jnp.asarray(NOISE_COVARIANCE)), obs=y)


def data():
    """30 rows, 6 features, correlated noise (fixed seed)."""
    rng = np.random.default_rng(14)
    X = rng.normal(size=(30, 6))
    W = rng.normal(size=(6, 2))
    y = X @ W + rng.multivariate_normal(np.zeros(2), NOISE_COVARIANCE, size=30)
    return (jnp.asarray(X),), {"y": jnp.asarray(y)}
