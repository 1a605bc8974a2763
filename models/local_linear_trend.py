"""Local linear trend: a 2-d state (level, slope) written with ``scan``, known noise scales.

state_0 = (level_0, slope_0) ~ Normal(init_loc, init_scale) (independent),
level_t = level_{t-1} + slope_{t-1} + Normal(0, level_scale),
slope_t = slope_{t-1} + Normal(0, slope_scale),
y_t ~ Normal(level_t, obs_scale),   t = 1..T

One ``scan`` step per time point with ``state_t ~ Normal(F state_{t-1}, scales).to_event(1)``,
F = [[1, 1], [0, 1]]; q of the states is a chain Gaussian with 2 x 2 blocks, and
``blrppl.ConjugateBayes`` is the exact Kalman smoother. ``future=h`` continues the
chain h steps past the data (``state_future``, ``y_future``) for forecasts with
``numpyro.infer.Predictive`` and ``engine.guide(result)``.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan

TRANSITION = ((1.0, 1.0), (0.0, 1.0))
"""F: the level moves by the slope, the slope by a random walk."""


def model(
    num_steps=None,
    *,
    y=None,
    level_scale=0.3,
    slope_scale=0.05,
    obs_scale=1.0,
    init_loc=(0.0, 0.0),
    init_scale=(10.0, 1.0),
    future=0,
):
    """A local linear trend observed with noise; the scales are known constants."""
    length = num_steps if y is None else y.shape[0]
    trans = jnp.asarray(TRANSITION)
    scales = jnp.stack([jnp.asarray(level_scale, float), jnp.asarray(slope_scale, float)])
    state0 = numpyro.sample(
        "state0", dist.Normal(jnp.asarray(init_loc), jnp.asarray(init_scale)).to_event(1)
    )

    def transition(prev, y_t):
        state = numpyro.sample("state", dist.Normal(trans @ prev, scales).to_event(1))
        numpyro.sample("y", dist.Normal(state[0], obs_scale), obs=y_t)
        return state, state

    last, _ = scan(transition, state0, y, length=length)
    if future:

        def forecast(prev, _):
            state = numpyro.sample("state_future", dist.Normal(trans @ prev, scales).to_event(1))
            numpyro.sample("y_future", dist.Normal(state[0], obs_scale))
            return state, None

        scan(forecast, last, None, length=future)


def data(num_steps=80):
    """A simulated trend (level sd 0.3, slope sd 0.05, noise sd 1; fixed seed)."""
    rng = np.random.default_rng(12)
    level, slope = 2.0, 0.2
    y = np.empty(num_steps)
    for t in range(num_steps):
        level, slope = level + slope + 0.3 * rng.normal(), slope + 0.05 * rng.normal()
        y[t] = level + rng.normal()
    return (), {"y": jnp.asarray(y)}
