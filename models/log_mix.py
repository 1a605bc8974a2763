"""A two-component mixture with a Beta weight, as ported from Stan's ``log_mix``.

theta ~ Beta(2, 2),   mu ~ Normal((-2, 2), 1),
z_n ~ Categorical((theta, 1 - theta)),   y_n ~ Normal(mu[z_n], 1)

``log(1 - theta)`` is a Beta sufficient statistic, so every edge is exact
(VMP is coordinate ascent on the exact mean-field ELBO).
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_obs=None, *, y=None):
    """Stan's ``log_mix(theta, normal_lpdf(y | mu1, 1), normal_lpdf(y | mu2, 1))`` with z enumerated."""
    n = num_obs if y is None else y.shape[0]
    theta = numpyro.sample("theta", dist.Beta(2.0, 2.0))
    mu = numpyro.sample("mu", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))
    with numpyro.plate("N", n):
        z = numpyro.sample("z", dist.Categorical(jnp.stack([theta, 1 - theta])), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(mu[z], 1.0), obs=y)


def data():
    """40 points, 30% from N(-2.5, 1) and 70% from N(1.5, 1) (fixed seed)."""
    rng = np.random.default_rng(41)
    z = rng.random(40) < 0.7
    y = np.where(z, 1.5, -2.5) + rng.normal(size=40)
    return (), {"y": jnp.asarray(y)}
