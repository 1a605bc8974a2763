"""Hidden Markov model with Normal emissions, the latent chain written with ``scan``.

trans_k ~ Dirichlet(1) (rows),   mu_k ~ Normal(0, 5),   tau_k ~ Gamma(2, 1)
z_0 ~ Categorical(1/K),   z_t ~ Categorical(trans[z_{t-1}]),
y_t ~ Normal(mu[z_t], 1 / sqrt(tau[z_t])),  t = 1..T

Every factor is conjugate, so ``VMP`` fits it exactly coordinate-wise: the
states get a chain Categorical q (forward-backward), the transition rows
Dirichlet, the emission means Normal and the emission precisions Gamma. (An
emission scale with a ``HalfNormal`` prior is not conjugate; a precision
with a Gamma prior is the conjugate way to learn the noise.)
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def model(num_states=2, num_steps=None, *, y=None):
    """A ``num_states`` HMM; ``z0`` and ``z`` are marked for parallel enumeration (NUTS works)."""
    length = num_steps if y is None else y.shape[0]
    with numpyro.plate("K", num_states):
        trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(num_states)))
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    z0 = numpyro.sample(
        "z0",
        dist.Categorical(jnp.ones(num_states) / num_states),
        infer={"enumerate": "parallel"},
    )

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])), obs=y_t)
        return z, None

    scan(transition, z0, y, length=length)


def data():
    """A 60-step sequence from a sticky two-state chain (fixed seed)."""
    rng = np.random.default_rng(5)
    # A two-state chain that stays put with probability 0.85: alternating
    # regimes with geometric durations.
    durations = rng.geometric(0.15, size=60)
    z = np.repeat(np.arange(60) % 2, durations)[:60]
    y = np.array([-2.0, 2.0])[z] + 0.5 * rng.normal(size=60)
    return (2,), {"y": jnp.asarray(y)}
