"""Eight schools, centred parameterisation (Rubin 1981; Gelman et al., BDA3 Sec. 5.5).

mu ~ Normal(0, 5),   tau ~ HalfCauchy(5),
theta_j ~ Normal(mu, tau),   y_j ~ Normal(theta_j, sigma_j)
"""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def model(sigma, *, y=None):
    """Treatment effects ``theta`` of J schools with known standard errors ``sigma``."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def data():
    """The classic eight-schools data (bundled)."""
    return (SIGMA,), {"y": Y}
