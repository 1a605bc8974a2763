"""Local level model written with ``scan``, with a separately sampled initial level.

level_0 ~ Normal(0, 10),   sigma_level ~ HalfNormal(1),   sigma_obs ~ HalfNormal(1)
level_t ~ Normal(level_{t-1}, sigma_level),   y_t ~ Normal(level_t, sigma_obs)
"""

import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan

from models.local_level_grw import data  # noqa: F401  (the same generated series)


def model(num_steps=None, *, y=None):
    """A random-walk level, one ``scan`` step per time point."""
    length = num_steps if y is None else y.shape[0]
    level0 = numpyro.sample("level0", dist.Normal(0.0, 10.0))
    sigma_level = numpyro.sample("sigma_level", dist.HalfNormal(1.0))
    sigma_obs = numpyro.sample("sigma_obs", dist.HalfNormal(1.0))

    def transition(prev, y_t):
        level = numpyro.sample("level", dist.Normal(prev, sigma_level))
        numpyro.sample("y", dist.Normal(level, sigma_obs), obs=y_t)
        return level, level

    scan(transition, level0, y, length=length)
