"""Normal observations with unknown mean and precision (independent priors).

mu ~ Normal(0, 10),   tau ~ Gamma(1, 1),   y_n ~ Normal(mu, 1 / sqrt(tau))
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_obs=None, *, y=None):
    """Unknown mean ``mu`` and precision ``tau`` of Normal data ``y``."""
    n = num_obs if y is None else y.shape[0]
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", n):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def data():
    """Fifty draws from Normal(1.5, 0.8) (fixed seed)."""
    rng = np.random.default_rng(2)
    return (), {"y": jnp.asarray(rng.normal(1.5, 0.8, size=50))}
