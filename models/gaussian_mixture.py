"""Gaussian mixture with latent assignments (written for NumPyro's enumeration too).

weights ~ Dirichlet(1),   mu_k ~ Normal(0, 10),   tau_k ~ Gamma(1, 1)
z_n ~ Categorical(weights),   y_n ~ Normal(mu[z_n], 1 / sqrt(tau[z_n]))
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_components=3, num_obs=None, *, y=None):
    """A ``num_components`` mixture of univariate Normals."""
    n = num_obs if y is None else y.shape[0]
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(num_components)))
    with numpyro.plate("K", num_components):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", n):
        z = numpyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])), obs=y)


def data():
    """90 points from three well-separated clusters (fixed seed)."""
    rng = np.random.default_rng(4)
    centres = np.array([-4.0, 0.0, 5.0])
    z = rng.integers(0, 3, size=90)
    y = centres[z] + 0.7 * rng.normal(size=90)
    return (3,), {"y": jnp.asarray(y)}
