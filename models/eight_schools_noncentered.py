"""Eight schools, non-centred parameterisation.

mu ~ Normal(0, 5),   tau ~ HalfCauchy(5),   theta_raw_j ~ Normal(0, 1),
theta_j = mu + tau theta_raw_j (deterministic),   y_j ~ Normal(theta_j, sigma_j)
"""

import numpyro
import numpyro.distributions as dist

from models.eight_schools_centered import SIGMA, Y


def model(sigma, *, y=None):
    """Non-centred eight schools; ``theta`` is recorded as a deterministic site."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_raw)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def data():
    """The classic eight-schools data (bundled)."""
    return (SIGMA,), {"y": Y}
