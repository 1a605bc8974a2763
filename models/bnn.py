"""numpyro's Bayesian neural network (``examples/bnn.py``): two tanh hidden layers.

w1 ~ Normal(0, 1) (D_X, D_H),  w2 ~ Normal(0, 1) (D_H, D_H),  w3 ~ Normal(0, 1) (D_H, 1),
prec_obs ~ Gamma(3, 1),   y_i ~ Normal(tanh(tanh(x_i w1) w2) w3, 1 / sqrt(prec_obs))

The model is numpyro's, as written (no biases; the inputs are the powers
1, x, x^2 of a scalar x), with the observations as the keyword ``y`` and 50
hidden units by default. ``data()`` is numpyro's ``get_data`` (N = 50 points
on [-1, 1], noise sd 0.05, seed 0); ``held_out()`` draws test points of the
same function at random positions in [-1, 1] from another seed.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(X, D_H=50, D_Y=1, *, y=None):
    """numpyro's ``model(X, Y, D_H, D_Y)`` with ``Y`` renamed ``y``."""
    N, D_X = X.shape
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((D_X, D_H)), jnp.ones((D_X, D_H))))
    z1 = jnp.tanh(jnp.matmul(X, w1))
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((D_H, D_H)), jnp.ones((D_H, D_H))))
    z2 = jnp.tanh(jnp.matmul(z1, w2))
    w3 = numpyro.sample("w3", dist.Normal(jnp.zeros((D_H, D_Y)), jnp.ones((D_H, D_Y))))
    z3 = jnp.matmul(z2, w3)
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    sigma_obs = 1.0 / jnp.sqrt(prec_obs)
    with numpyro.plate("data", N):
        numpyro.sample("y", dist.Normal(z3, sigma_obs).to_event(1), obs=y)


def _features(x, D_X):
    return jnp.power(jnp.asarray(x)[:, None], jnp.arange(D_X))


def _truth(X, W):
    return jnp.dot(X, W) + 0.5 * jnp.power(0.5 + X[:, 1], 2.0) * jnp.sin(4.0 * X[:, 1])


def data(N=50, D_X=3, sigma_obs=0.05):
    """numpyro's ``get_data``: ``((X,), {"y": y})`` with y of shape (N, 1)."""
    rng = np.random.RandomState(0)
    X = _features(np.linspace(-1, 1, N), D_X)
    W = 0.5 * rng.randn(D_X)
    y = _truth(X, W) + sigma_obs * rng.randn(N)
    return (X,), {"y": y[:, None]}


def held_out(N_test=500, D_X=3, sigma_obs=0.05, seed=1):
    """Test points of the same function: ``(X_test, y_test)``, y_test of shape (N_test, 1)."""
    W = 0.5 * np.random.RandomState(0).randn(D_X)  # the training function's weights
    rng = np.random.RandomState(seed)
    X = _features(rng.uniform(-1, 1, N_test), D_X)
    y = _truth(X, W) + sigma_obs * rng.randn(N_test)
    return X, y[:, None]
