"""Varying-intercept regression with an integer group index (radon-style).

mu_alpha ~ Normal(0, 10),   sigma_alpha ~ HalfNormal(5)
alpha_c ~ Normal(mu_alpha, sigma_alpha)  for each county c
beta ~ Normal(0, 10),   sigma_y ~ HalfNormal(5)
y_n ~ Normal(alpha[county_n] + beta floor_n, sigma_y)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(county_idx, floor, num_counties, *, y=None):
    """Log radon ``y`` by house, with a county intercept and a floor effect."""
    mu_alpha = numpyro.sample("mu_alpha", dist.Normal(0.0, 10.0))
    sigma_alpha = numpyro.sample("sigma_alpha", dist.HalfNormal(5.0))
    with numpyro.plate("county", num_counties):
        alpha = numpyro.sample("alpha", dist.Normal(mu_alpha, sigma_alpha))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(5.0))
    with numpyro.plate("N", county_idx.shape[0]):
        numpyro.sample("y", dist.Normal(alpha[county_idx] + beta * floor, sigma_y), obs=y)


def data(num_counties=85, num_obs=919):
    """Generated data shaped like Minnesota radon: 85 counties, 919 houses (fixed seed)."""
    rng = np.random.default_rng(6)
    county_idx = np.concatenate(
        [np.arange(num_counties), rng.integers(0, num_counties, num_obs - num_counties)]
    )
    floor = (rng.random(num_obs) < 0.2).astype(np.float64)
    alpha = 1.5 + 0.3 * rng.normal(size=num_counties)
    y = alpha[county_idx] - 0.7 * floor + 0.8 * rng.normal(size=num_obs)
    return (jnp.asarray(county_idx), jnp.asarray(floor), num_counties), {"y": jnp.asarray(y)}
