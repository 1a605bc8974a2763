"""Stochastic volatility with known constants, written with ``scan`` (only log-volatilities latent).

h_0 ~ Normal(mu, sigma / sqrt(1 - phi^2)),
h_t ~ Normal(mu + phi (h_{t-1} - mu), sigma),   y_t ~ Normal(0, exp(h_t / 2)),
with known mu = -1, phi = 0.95, sigma = 0.25 (keyword arguments).
"""

import math

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def model(num_steps=None, *, y=None, mu=-1.0, phi=0.95, sigma=0.25):
    """An AR(1) log-volatility ``h`` (stationary start ``h0``), one ``scan`` step per time point."""
    length = num_steps if y is None else y.shape[0]
    h0 = numpyro.sample("h0", dist.Normal(mu, sigma / jnp.sqrt(1.0 - phi**2)))

    def transition(prev, y_t):
        h = numpyro.sample("h", dist.Normal(mu + phi * (prev - mu), sigma))
        numpyro.sample("y", dist.Normal(0.0, jnp.exp(h / 2.0)), obs=y_t)
        return h, h

    scan(transition, h0, y, length=length)


def data(num_steps=60, mu=-1.0, phi=0.95, sigma=0.25):
    """``num_steps`` returns simulated from the model with its default constants (fixed seed)."""
    rng = np.random.default_rng(11)
    h = mu + sigma / math.sqrt(1.0 - phi**2) * rng.normal()
    y = np.empty(num_steps)
    for t in range(num_steps):
        h = mu + phi * (h - mu) + sigma * rng.normal()
        y[t] = math.exp(h / 2.0) * rng.normal()
    return (), {"y": jnp.asarray(y)}
