"""Local level model with the level as a ``GaussianRandomWalk``.

sigma_level ~ HalfNormal(1),   sigma_obs ~ HalfNormal(1)
level ~ GaussianRandomWalk(sigma_level, T),   y_t ~ Normal(level_t, sigma_obs)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_steps=None, *, y=None):
    """A random-walk level observed with noise."""
    length = num_steps if y is None else y.shape[0]
    sigma_level = numpyro.sample("sigma_level", dist.HalfNormal(1.0))
    sigma_obs = numpyro.sample("sigma_obs", dist.HalfNormal(1.0))
    level = numpyro.sample("level", dist.GaussianRandomWalk(sigma_level, num_steps=length))
    with numpyro.plate("time", length):
        numpyro.sample("y", dist.Normal(level, sigma_obs), obs=y)


def data(num_steps=50):
    """A random walk with step sd 0.3 observed with sd 0.5 (fixed seed)."""
    rng = np.random.default_rng(7)
    level = np.cumsum(0.3 * rng.normal(size=num_steps))
    return (), {"y": jnp.asarray(level + 0.5 * rng.normal(size=num_steps))}
