"""The Nile local level with its initial state inside the scan: a per-step scale vector.

level_1 ~ Normal(1000, 1000^2),   level_t ~ Normal(level_{t-1}, level_var),   t = 2..T
y_t ~ Normal(level_t, obs_var)

written the way many users do: the scan starts from the constant 1000 and
reads a per-step scale from ``xs``, ``concatenate([[1000], full(T - 1,
sqrt(level_var))])``, so the first step is the broad initial state and the
others are the random walk. blrppl's symbolic layer sees through the
concatenation (each position is one piece: a constant or a function of
``level_var``), so every factor is exact in the noise parameters:

* :func:`model` (the zoo's): Gamma(1e-3, 1e-3) priors on both precisions,
  for ``VMP``;
* :func:`em_model`: ``numpyro.param`` variances for ``EM`` (their maximum
  likelihood estimates), or known variances (``obs_var=``, ``level_var=``)
  for ``ConjugateBayes`` (the exact Kalman smoother).

The data are the Nile flows of :mod:`models.nile`.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan

from models.nile import FLOW, INITIAL_MEAN, INITIAL_SD


def _local_level(length, y, obs_sd, level_sd):
    scales = jnp.concatenate([jnp.array([INITIAL_SD]), jnp.full((length - 1,), level_sd)])

    def transition(prev, inputs):
        scale, y_t = inputs
        level = numpyro.sample("level", dist.Normal(prev, scale))
        numpyro.sample("y", dist.Normal(level, obs_sd), obs=y_t)
        return level, None

    scan(transition, INITIAL_MEAN, (scales, y), length=length)


def model(num_steps=None, *, y=None, concentration=1e-3, rate=1e-3):
    """Gamma(concentration, rate) priors on the observation and level precisions."""
    length = num_steps if y is None else y.shape[0]
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(concentration, rate))
    prec_level = numpyro.sample("prec_level", dist.Gamma(concentration, rate))
    _local_level(length, y, 1.0 / jnp.sqrt(prec_obs), 1.0 / jnp.sqrt(prec_level))


def em_model(num_steps=None, *, y=None, obs_var=None, level_var=None):
    """``numpyro.param`` variances, unless given (then known)."""
    length = num_steps if y is None else y.shape[0]
    if obs_var is None:
        obs_var = numpyro.param("obs_var", 10000.0, constraint=dist.constraints.positive)
    if level_var is None:
        level_var = numpyro.param("level_var", 1000.0, constraint=dist.constraints.positive)
    _local_level(length, y, jnp.sqrt(obs_var), jnp.sqrt(level_var))


def data():
    """The 100 annual Nile flows as ``y`` (float)."""
    return (), {"y": jnp.asarray(np.asarray(FLOW, dtype=float))}
