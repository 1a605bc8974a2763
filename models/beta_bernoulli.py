"""Beta-Bernoulli: the probability of heads of one coin from a run of tosses.

p ~ Beta(1, 1),    y_n ~ Bernoulli(p),  n = 1..N
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_obs=None, *, y=None):
    """Beta prior on a coin's bias; ``y`` are 0/1 tosses (None to predict ``num_obs`` tosses)."""
    n = num_obs if y is None else y.shape[0]
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", n):
        numpyro.sample("y", dist.Bernoulli(probs=p), obs=y)


def data():
    """Twenty tosses of a coin with bias 0.3 (fixed seed)."""
    rng = np.random.default_rng(0)
    y = (rng.random(20) < 0.3).astype(np.float64)
    return (), {"y": jnp.asarray(y)}
