"""numpyro's ``examples/hmm_enum.py`` model 1, as written there: many binary sequences.

probs_x ~ Dirichlet(0.9 I + 0.1) (rows),   probs_y ~ Beta(0.1, 0.9) (states x tones)
for each sequence n (a plate at dim -2) and step t < L_n (the whole step masked after):
    x_nt ~ Categorical(probs_x[x_n,t-1])   (x_n,-1 = 0, a constant carry),
    y_ntd ~ Bernoulli(probs_y[x_nt, d])    (a plate of tones at dim -1)

The states of one step have shape (N, 1), as numpyro's example writes them for
parallel enumeration; blrppl reads the (T, N, 1) stacked states as N
independent chains (one chain Categorical q, forward-backward vmapped over
sequences). ``y`` is time-major (T, N, D), as the scan reads it (numpyro's
example swaps the axes of its (N, T, D) ``sequences`` before scanning).
Masked steps carry no factor at all, as in numpyro: each contributes log K
(the states there are uniform) to the ELBO.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.contrib.control_flow import scan


def model(num_states=3, num_steps=None, *, y=None, lengths=None, num_tones=None):
    """numpyro's ``model_1`` with its data time-major; ``lengths`` (N,) sequence lengths."""
    length = num_steps if y is None else y.shape[0]
    data_dim = num_tones if y is None else y.shape[2]
    num_sequences = lengths.shape[0]
    probs_x = numpyro.sample(
        "probs_x", dist.Dirichlet(0.9 * jnp.eye(num_states) + 0.1).to_event(1)
    )
    probs_y = numpyro.sample(
        "probs_y", dist.Beta(0.1, 0.9).expand([num_states, data_dim]).to_event(2)
    )
    tones_plate = numpyro.plate("tones", data_dim, dim=-1)

    def transition_fn(carry, y_t):
        x_prev, t = carry
        with numpyro.plate("sequences", num_sequences, dim=-2):
            with handlers.mask(mask=(t < lengths)[..., None]):
                x = numpyro.sample("x", dist.Categorical(probs_x[x_prev]))
                with tones_plate:
                    numpyro.sample("y", dist.Bernoulli(probs_y[x.squeeze(-1)]), obs=y_t)
        return (x, t + 1), None

    x_init = jnp.zeros((num_sequences, 1), dtype=int)  # numpyro writes int32 (its default width)
    scan(transition_fn, (x_init, 0), y, length=length)


def data(num_sequences=8, max_length=24, num_tones=4):
    """Binary chords from a three-state chain (fixed seed), 12 to 24 steps, zero-padded."""
    rng = np.random.default_rng(13)
    lengths = rng.integers(12, max_length + 1, size=num_sequences)
    trans = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    probs = np.array([[0.9, 0.1, 0.1, 0.6], [0.1, 0.9, 0.2, 0.1], [0.2, 0.2, 0.9, 0.5]])
    y = np.zeros((max_length, num_sequences, num_tones))
    for n, length in enumerate(lengths):
        x = 0
        for t in range(length):
            x = rng.choice(3, p=trans[x])
            y[t, n] = rng.uniform(size=num_tones) < probs[x]
    return (3,), {"y": jnp.asarray(y), "lengths": jnp.asarray(lengths, dtype=jnp.int32), "num_tones": num_tones}
