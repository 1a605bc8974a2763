"""A Gaussian process with latent kernel hyperparameters (numpyro's examples/gp.py).

var, noise, length ~ LogNormal(0, 10),
y ~ MultivariateNormal(0, K),   K_ij = var exp(-(x_i - x_j)² / (2 length²)) + (noise + 1e-6) δ_ij

The three hyperparameters enter only through the kernel matrix: no
exponential family fits, so ``NonConjugateVI`` gives them one joint Gaussian
q on their log scale and a deterministic degree-5 cubature of the
marginal likelihood (one Cholesky per node, never batched).
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def kernel(X, Z, var, length, noise, jitter=1.0e-6, include_noise=True):
    """The squared-exponential kernel of the numpyro example, noise and jitter on the diagonal."""
    deltaXsq = jnp.power((X[:, None] - Z) / length, 2.0)
    k = var * jnp.exp(-0.5 * deltaXsq)
    if include_noise:
        k += (noise + jitter) * jnp.eye(X.shape[0])
    return k


def model(X, *, y=None):
    X
    var = numpyro.sample("kernel_var", dist.LogNormal(0.0, 10.0))
    noise = numpyro.sample("kernel_noise", dist.LogNormal(0.0, 10.0))
    length = numpyro.sample("kernel_length", dist.LogNormal(0.0, 10.0))
    k = kernel(X, X, var, length, noise)
    numpyro.sample("y", dist.MultivariateNormal(loc=jnp.zeros(X.shape[0]), covariance_matrix=k), obs=y)


def data(num_data=25, sigma_obs=0.15):
    """The example's synthetic data (its ``get_data``, seed 0): ``num_data`` points on [-1, 1], y standardised."""
    rng = np.random.RandomState(0)
    X = np.linspace(-1, 1, num_data)
    Y = X + 0.2 * np.power(X, 3.0) + 0.5 * np.power(0.5 + X, 2.0) * np.sin(4.0 * X)
    Y = Y + sigma_obs * rng.randn(num_data)
    Y = (Y - np.mean(Y)) / np.std(Y)
    return (jnp.asarray(X),), {"y": jnp.asarray(Y)}
