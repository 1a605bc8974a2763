"""Ten models outside the zoo, written the way NumPyro users write them, for first-call timing.

Not in ``ZOO``: the zoo's first calls are what the README tracks, and these were not tuned
for. Each entry is ``name -> (model, data)``, ``data()`` returning ``(args, kwargs)`` at a
fixed seed. ``benchmarks/first_call_profile.py --models styles`` times their first calls (the
engine ``blrppl.choose`` picks, as ``python -m blrppl fit`` does); some tests fit them too.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan


def horseshoe(X, y=None):
    """Sparse regression with a horseshoe prior (half-Cauchy global and local scales)."""
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    with numpyro.plate("d", X.shape[1]):
        lam = numpyro.sample("lam", dist.HalfCauchy(1.0))
        beta = numpyro.sample("beta", dist.Normal(0.0, tau * lam))
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def horseshoe_data(rng):
    X = rng.normal(size=(100, 20))
    beta = np.zeros(20)
    beta[:3] = [2.0, -1.0, 1.5]
    return (jnp.asarray(X),), {"y": jnp.asarray(X @ beta + 0.5 * rng.normal(size=100))}


def poisson_glmm(group, x, y=None):
    """Poisson counts with random intercepts per group, the group count fixed in the code."""
    mu = numpyro.sample("mu", dist.Normal(0, 2))
    sd = numpyro.sample("sd", dist.HalfNormal(1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    with numpyro.plate("groups", 20):
        a = numpyro.sample("a", dist.Normal(mu, sd))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(a[group] + b * x)), obs=y)


def poisson_glmm_data(rng):
    group, x, a = rng.integers(0, 20, 500), rng.normal(size=500), rng.normal(0.5, 0.7, 20)
    y = rng.poisson(np.exp(a[group] + 0.3 * x)).astype(float)
    return (jnp.asarray(group), jnp.asarray(x)), {"y": jnp.asarray(y)}


def robust_regression(x, y=None):
    """Student-t regression with its degrees of freedom learnt."""
    a = numpyro.sample("a", dist.Normal(0, 10))
    b = numpyro.sample("b", dist.Normal(0, 10))
    nu = numpyro.sample("nu", dist.Gamma(2, 0.1))
    s = numpyro.sample("s", dist.HalfNormal(5))
    with numpyro.plate("n", len(x)):
        numpyro.sample("y", dist.StudentT(nu, a + b * x, s), obs=y)


def robust_regression_data(rng):
    x = rng.normal(size=200)
    return (jnp.asarray(x),), {"y": jnp.asarray(1 + 2 * x + rng.standard_t(3, 200))}


def zero_inflated_poisson(y=None):
    """numpyro's ZeroInflatedPoisson with a Gamma rate and a Beta gate."""
    rate = numpyro.sample("rate", dist.Gamma(2, 1))
    gate = numpyro.sample("gate", dist.Beta(1, 1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.ZeroInflatedPoisson(gate, rate), obs=y)


def zero_inflated_poisson_data(rng):
    y = np.where(rng.random(300) < 0.3, 0, rng.poisson(3.0, 300))
    return (), {"y": jnp.asarray(y.astype(float))}


def ordinal_regression(x, y=None):
    """Ordered logistic regression with ordered cutpoints (an OrderedTransform prior)."""
    b = numpyro.sample("b", dist.Normal(0, 3))
    c = numpyro.sample(
        "c", dist.TransformedDistribution(dist.Normal(0, 3).expand([3]), dist.transforms.OrderedTransform())
    )
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.OrderedLogistic(b * x, c), obs=y)


def ordinal_regression_data(rng):
    x = rng.normal(size=300)
    latent = 1.2 * x + rng.logistic(size=300)
    return (jnp.asarray(x),), {"y": jnp.asarray(np.digitize(latent, [-1, 0, 1]))}


def crossed_effects(a_idx, b_idx, y=None):
    """Gaussian responses with two crossed random effects (30 x 20 levels, 2,000 rows)."""
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    sa = numpyro.sample("sa", dist.HalfNormal(1))
    sb = numpyro.sample("sb", dist.HalfNormal(1))
    se = numpyro.sample("se", dist.HalfNormal(1))
    with numpyro.plate("A", 30):
        ea = numpyro.sample("ea", dist.Normal(0, sa))
    with numpyro.plate("B", 20):
        eb = numpyro.sample("eb", dist.Normal(0, sb))
    with numpyro.plate("N", a_idx.shape[0]):
        numpyro.sample("y", dist.Normal(mu + ea[a_idx] + eb[b_idx], se), obs=y)


def crossed_effects_data(rng):
    a, b = rng.integers(0, 30, 2000), rng.integers(0, 20, 2000)
    y = 1 + rng.normal(0, 0.7, 30)[a] + rng.normal(0, 0.4, 20)[b] + rng.normal(0, 1, 2000)
    return (jnp.asarray(a), jnp.asarray(b)), {"y": jnp.asarray(y)}


def ar1_state_space(T, y=None):
    """A latent AR(1) observed with noise, written with numpyro's ``scan``."""
    phi = numpyro.sample("phi", dist.Uniform(-1, 1))
    s = numpyro.sample("s", dist.HalfNormal(1))
    so = numpyro.sample("so", dist.HalfNormal(1))

    def step(x, y_t):
        x = numpyro.sample("x", dist.Normal(phi * x, s))
        numpyro.sample("y_obs", dist.Normal(x, so), obs=y_t)
        return x, None

    scan(step, jnp.zeros(()), y, length=T)


def ar1_state_space_data(rng):
    x = np.zeros(150)
    for t in range(1, 150):
        x[t] = 0.8 * x[t - 1] + 0.5 * rng.normal()
    return (150,), {"y": jnp.asarray(x + 0.3 * rng.normal(size=150))}


def dirichlet_categorical(K, y=None):
    """Category frequencies with a flat Dirichlet prior."""
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Categorical(p), obs=y)


def dirichlet_categorical_data(rng):
    return (4,), {"y": jnp.asarray(rng.integers(0, 4, 400))}


def funnel_noncentered(J=10, y=None, sigma=None):
    """Eight-schools style measurements, non-centred with ``numpyro.deterministic``, keyword data."""
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta_raw = numpyro.sample("theta_raw", dist.Normal(0, 1))
        theta = numpyro.deterministic("theta", mu + tau * theta_raw)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def funnel_noncentered_data(rng):
    return (), {"J": 10, "y": jnp.asarray(rng.normal(3, 8, 10)), "sigma": jnp.asarray(rng.uniform(5, 15, 10))}


def logistic_random_intercepts(county, x, y=None):
    """Bernoulli outcomes with random intercepts per county, no plate around the likelihood."""
    mu = numpyro.sample("mu", dist.Normal(0, 2))
    sd = numpyro.sample("sd", dist.HalfNormal(1))
    beta = numpyro.sample("beta", dist.Normal(0, 2))
    with numpyro.plate("c", 15):
        a = numpyro.sample("a", dist.Normal(mu, sd))
    numpyro.sample("y", dist.Bernoulli(logits=a[county] + beta * x), obs=y)


def logistic_random_intercepts_data(rng):
    county, x, a = rng.integers(0, 15, 600), rng.normal(size=600), rng.normal(0, 1, 15)
    y = (rng.random(600) < 1 / (1 + np.exp(-(a[county] + 0.7 * x)))).astype(float)
    return (jnp.asarray(county), jnp.asarray(x)), {"y": jnp.asarray(y)}


NAMES = (
    "horseshoe", "poisson_glmm", "robust_regression", "zero_inflated_poisson", "ordinal_regression",
    "crossed_effects", "ar1_state_space", "dirichlet_categorical", "funnel_noncentered", "logistic_random_intercepts",
)
MODELS = {name: (globals()[name], (lambda make: lambda: make(np.random.default_rng(1)))(globals()[name + "_data"])) for name in NAMES}
"""name -> (model, data): ``data()`` gives ``(args, kwargs)``, drawn at seed 1."""
