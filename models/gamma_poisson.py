"""Gamma-Poisson: the rate of a count process.

lam ~ Gamma(2, 1),    y_n ~ Poisson(lam),  n = 1..N
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_obs=None, *, y=None):
    """Gamma prior on a Poisson rate; ``y`` are counts."""
    n = num_obs if y is None else y.shape[0]
    lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", n):
        numpyro.sample("y", dist.Poisson(lam), obs=y)


def data():
    """Thirty counts with rate 3.5 (fixed seed)."""
    rng = np.random.default_rng(1)
    return (), {"y": jnp.asarray(rng.poisson(3.5, size=30).astype(np.float64))}
