"""A batch of local-level series: a plate of ``GaussianRandomWalk`` levels, unequal lengths.

prec_level ~ Gamma(2, 0.5),   prec_obs ~ Gamma(2, 0.5)
for each series n (a plate):  level_n ~ GaussianRandomWalk(1 / sqrt(prec_level), T),
                              y_nt ~ Normal(level_nt, 1 / sqrt(prec_obs)),  t < L_n

The random walks share their noise precisions; each series gets its own chain
Gaussian (one q over (N, T), Kalman/RTS passes vmapped over the series). ``y``
(N, T) is padded with zeros past each series' end and ``mask`` (N, T) marks the
observed entries; the level past the end is a forecast. (Pad with numbers: a
mask inside ``to_event`` does not make NaN acceptable to blrppl's data check.)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_steps=None, num_series=None, *, y=None, mask=None):
    """``num_series`` random walks observed with noise where ``mask`` is True."""
    shape = mask.shape if mask is not None else (num_series, num_steps)
    prec_level = numpyro.sample("prec_level", dist.Gamma(2.0, 0.5))
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(2.0, 0.5))
    with numpyro.plate("series", shape[0]):
        level = numpyro.sample(
            "level", dist.GaussianRandomWalk(1.0 / jnp.sqrt(prec_level), num_steps=shape[1])
        )
        obs = dist.Normal(level, 1.0 / jnp.sqrt(prec_obs))
        obs = obs if mask is None else obs.mask(mask)
        numpyro.sample("y", obs.to_event(1), obs=y)


def data(num_series=6, max_length=40):
    """Six random walks (step sd 0.5, noise sd 0.8) of 25 to 40 steps (fixed seed)."""
    rng = np.random.default_rng(19)
    lengths = rng.integers(25, max_length + 1, size=num_series)
    level = np.cumsum(0.5 * rng.normal(size=(num_series, max_length)), axis=1)
    y = level + 0.8 * rng.normal(size=level.shape)
    mask = np.arange(max_length)[None, :] < lengths[:, None]
    return (), {"y": jnp.asarray(np.where(mask, y, 0.0)), "mask": jnp.asarray(mask)}
