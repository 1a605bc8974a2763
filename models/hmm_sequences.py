"""Hidden Markov model over many sequences of unequal lengths (padded and masked), with ``scan``.

trans_k ~ Dirichlet(1) (rows),   mu_k ~ Normal(0, 5),   tau_k ~ Gamma(2, 1)
for each sequence n (a plate):
    z_n0 ~ Categorical(1/K),   z_nt ~ Categorical(trans[z_n,t-1]),
    y_nt ~ Normal(mu[z_nt], 1 / sqrt(tau[z_nt])),   t = 1..L_n

The data are time-major, as the scan reads them: ``y`` (T, N) holds the N
sequences padded to T steps (NaN past each end) and ``mask`` (T, N) says which
entries are observed. The initial states are sampled in the ``sequences``
plate before the scan and the body enters the same plate, so the states of
one step have shape (N,): blrppl joins them into one chain Categorical q over
N independent sequences (forward-backward vmapped over sequences). States
past a sequence's end continue the chain unobserved (their marginals are
predictions), which leaves the evidence unchanged.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def model(num_states=2, num_steps=None, num_sequences=None, *, y=None, mask=None):
    """A ``num_states`` HMM over the columns of ``y``; ``mask`` marks observed entries."""
    shape = (y if y is not None else mask).shape if (y is not None or mask is not None) else None
    length = num_steps if shape is None else shape[0]
    count = num_sequences if shape is None else shape[1]
    with numpyro.plate("K", num_states):
        trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(num_states)))
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("sequences", count):
        z0 = numpyro.sample("z0", dist.Categorical(jnp.ones(num_states) / num_states))

    def transition(z_prev, inputs):
        y_t, m_t = inputs
        with numpyro.plate("sequences", count):
            z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
            emission = dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z]))
            numpyro.sample("y", emission if m_t is None else emission.mask(m_t), obs=y_t)
        return z, None

    scan(transition, z0, (y, mask), length=length)


def data(num_sequences=12, max_length=30):
    """Sequences of 15 to 30 steps from a sticky two-state chain (fixed seed), padded with NaN."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(15, max_length + 1, size=num_sequences)
    trans = np.array([[0.9, 0.1], [0.15, 0.85]])
    y = np.full((max_length, num_sequences), np.nan)
    for n, length in enumerate(lengths):
        z = rng.integers(2)
        for t in range(length):
            z = rng.choice(2, p=trans[z])
            y[t, n] = (-1.5, 1.5)[z] + 0.6 * rng.normal()
    mask = np.arange(max_length)[:, None] < lengths[None, :]
    return (2,), {"y": jnp.asarray(y), "mask": jnp.asarray(mask)}
