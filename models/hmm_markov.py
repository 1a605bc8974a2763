"""Hidden Markov model over several sequences written as a Python loop, one site per step.

trans_k ~ Dirichlet(1) (rows),   mu_k ~ Normal(0, 5),   tau_k ~ Gamma(2, 1)
for each sequence n (a plate around the loop):
    z_n,0 ~ Categorical(1/K),   z_n,t ~ Categorical(trans[z_n,t-1]),
    y_n,t-1 ~ Normal(mu[z_n,t], 1 / sqrt(tau[z_n,t])),   t = 1..T

The way Pyro's and NumPyro's HMM tutorials write it (there the loop runs over
``markov(range(T))`` from ``numpyro.contrib.funsor``, which gives the same
sites). blrppl joins the sites ``z_0 .. z_T`` into one chain Categorical q
named ``z_0`` (the chain's first site), so the fit equals the ``scan`` form's.
``y`` is time-major (T, N): ``y[t]`` holds step t of every sequence.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(num_states=2, num_steps=None, num_sequences=None, *, y=None):
    """The loop over steps inside a plate of sequences; sites ``z_t`` and ``y_t``."""
    length = num_steps if y is None else y.shape[0]
    count = num_sequences if y is None else y.shape[1]
    with numpyro.plate("K", num_states):
        trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(num_states)))
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("sequences", count):
        z = numpyro.sample("z_0", dist.Categorical(jnp.ones(num_states) / num_states))
        for t in range(length):
            z = numpyro.sample(f"z_{t + 1}", dist.Categorical(trans[z]))
            y_t = None if y is None else y[t]
            numpyro.sample(f"y_{t}", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])), obs=y_t)


def data(num_sequences=5, num_steps=10):
    """Five 10-step sequences from a sticky two-state chain (fixed seed); short, as tracing a loop costs ~T^2."""
    rng = np.random.default_rng(17)
    trans = np.array([[0.85, 0.15], [0.2, 0.8]])
    y = np.zeros((num_steps, num_sequences))
    for n in range(num_sequences):
        z = rng.integers(2)
        for t in range(num_steps):
            z = rng.choice(2, p=trans[z])
            y[t, n] = (-2.0, 2.0)[z] + 0.7 * rng.normal()
    return (2,), {"y": jnp.asarray(y)}
