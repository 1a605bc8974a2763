"""AR(1) latent process observed with noise, written with ``scan``; phi and the scales are ``numpyro.param``.

x_0 ~ Normal(0, init_scale)                          (a known, moderately broad start)
x_t ~ Normal(phi x_{t-1}, sigma),   y_t ~ Normal(x_t, obs_scale),   t = 1..T

``blrppl.EM`` estimates phi, sigma and obs_scale by maximum likelihood (an exact
chain-Gaussian E-step and Newton M-steps, Khan & Rue, Sec. 5.2); pass numbers to
fix any of them, and with all three fixed ``blrppl.ConjugateBayes`` is the exact
smoother. The start is not the stationary N(0, sigma^2 / (1 - phi^2)): its
scale is the square root of a function of the point estimate phi, which the
symbolic M-step does not take.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def model(num_steps=None, *, y=None, phi=None, sigma=None, obs_scale=None, init_scale=2.0):
    """An AR(1) state ``x`` (joined with its start ``x0``) seen through Gaussian noise."""
    length = num_steps if y is None else y.shape[0]
    if phi is None:
        phi = numpyro.param("phi", 0.5, constraint=dist.constraints.interval(-1.0, 1.0))
    if sigma is None:
        sigma = numpyro.param("sigma", 1.0, constraint=dist.constraints.positive)
    if obs_scale is None:
        obs_scale = numpyro.param("obs_scale", 1.0, constraint=dist.constraints.positive)
    x0 = numpyro.sample("x0", dist.Normal(0.0, init_scale))

    def transition(prev, y_t):
        x = numpyro.sample("x", dist.Normal(phi * prev, sigma))
        numpyro.sample("y", dist.Normal(x, obs_scale), obs=y_t)
        return x, x

    scan(transition, x0, y, length=length)


def data(num_steps=200, phi=0.9, sigma=0.5, obs_scale=0.7):
    """A simulated AR(1) (phi 0.9, sigma 0.5) seen with noise sd 0.7 (fixed seed)."""
    rng = np.random.default_rng(21)
    x = sigma / np.sqrt(1.0 - phi**2) * rng.normal()
    y = np.empty(num_steps)
    for t in range(num_steps):
        x = phi * x + sigma * rng.normal()
        y[t] = x + obs_scale * rng.normal()
    return (), {"y": jnp.asarray(y)}
