"""Linear-Gaussian state-space model, d = 2 state as ``dist.GaussianStateSpace``, 3-d observations.

x_t = A x_{t-1} + Normal(0, Q),   x_0 = 0,   A = 0.95 R(0.3) (a damped rotation),  Q = 0.2 I
y_t ~ Normal(H x_t, obs_scale) (3 independent coordinates),   t = 1..T

The state is one ``GaussianStateSpace`` site (event (T, 2)), whose q is a chain
Gaussian with 2 x 2 blocks; ``blrppl.ConjugateBayes`` is the exact Kalman smoother.
"""

import math

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

ANGLE, DAMPING = 0.3, 0.95
TRANSITION = tuple(
    tuple(DAMPING * v for v in row)
    for row in ((math.cos(ANGLE), -math.sin(ANGLE)), (math.sin(ANGLE), math.cos(ANGLE)))
)
"""A: a rotation by 0.3 rad, damped by 0.95."""
OBSERVATION = ((1.0, 0.0), (0.5, 1.0), (0.0, 1.0))
"""H: the three observed combinations of the two states."""


def model(num_steps=None, *, y=None, noise_var=0.2, obs_scale=0.5):
    """A damped rotating 2-d state seen through H with noise."""
    length = num_steps if y is None else y.shape[0]
    trans, obs = jnp.asarray(TRANSITION), jnp.asarray(OBSERVATION)
    x = numpyro.sample(
        "x", dist.GaussianStateSpace(length, trans, covariance_matrix=noise_var * jnp.eye(2))
    )
    with numpyro.plate("time", length):
        numpyro.sample("y", dist.Normal(x @ obs.T, obs_scale).to_event(1), obs=y)


def data(num_steps=60, noise_var=0.2, obs_scale=0.5):
    """A simulated series from the model with its defaults (fixed seed)."""
    rng = np.random.default_rng(31)
    trans, obs = np.asarray(TRANSITION), np.asarray(OBSERVATION)
    x = np.zeros(2)
    y = np.empty((num_steps, 3))
    for t in range(num_steps):
        x = trans @ x + math.sqrt(noise_var) * rng.normal(size=2)
        y[t] = obs @ x + obs_scale * rng.normal(size=3)
    return (), {"y": jnp.asarray(y)}
