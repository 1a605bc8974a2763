"""Hierarchical logistic regression: varying intercepts with an unknown group scale.

mu ~ Normal(0, 2),   sigma ~ HalfNormal(1),   alpha_j ~ Normal(mu, sigma)  (J groups)
beta ~ Normal(0, 2),   y_n ~ Bernoulli(logits = alpha[group_n] + beta x_n)

No set of a few latents makes the Bernoulli likelihood conjugate:
``blrppl.Integrated(model)`` says so (a ``ModelError``).
``Integrated(model, inner="vi")`` integrates the group scale sigma on a grid
over full-Gaussian VI fits of (mu, alpha, beta) given sigma (INLA with
variational inner fits; within 0.03 sd and 2% of NUTS on ``data()``, see
``tests/engines/test_integrated.py``). ``inner="laplace"`` (Laplace fits given
sigma) stays flagged as not validated: its conditional modes put beta's mean
0.24 posterior sd from NUTS's.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def model(group, x, num_groups, *, y=None):
    """Binary ``y`` with a group intercept and a slope on ``x``."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        alpha = numpyro.sample("alpha", dist.Normal(mu, sigma))
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0))
    with numpyro.plate("N", group.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=alpha[group] + beta * x), obs=y)


def data(num_groups=8, per_group=30):
    """8 groups of 30 observations (fixed seed)."""
    rng = np.random.default_rng(15)
    group = np.repeat(np.arange(num_groups), per_group)
    x = rng.normal(size=group.size)
    alpha = -0.3 + 0.8 * rng.normal(size=num_groups)
    p = 1.0 / (1.0 + np.exp(-(alpha[group] + 1.2 * x)))
    y = (rng.random(group.size) < p).astype(np.float64)
    return (jnp.asarray(group), jnp.asarray(x), num_groups), {"y": jnp.asarray(y)}
