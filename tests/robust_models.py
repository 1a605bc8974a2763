"""Models of the robustness tests (issue 13), shared with their reference script.

Each ``CASES`` entry: a model, its data (fixed seed) and the sites to compare.
Broad priors (Normal(0, s) on GLM coefficients, s up to 100), a scalar
Poisson with a log link, and likelihoods without conjugate structure
(Gumbel, Student-t, zero-inflated Poisson).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from models import ZOO

PRIOR_SCALES = (1.0, 5.0, 10.0, 100.0)


def poisson_regression(scale):
    def model(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), scale).to_event(1))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Poisson(jnp.exp(X @ beta)), obs=y)

    return model


def logistic_regression(scale):
    def model(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), scale).to_event(1))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

    return model


def scalar_poisson(y=None):
    loc = numpyro.sample("loc", dist.Normal(0.0, 10.0))
    numpyro.sample("y", dist.Poisson(jnp.exp(loc)), obs=y)


def gumbel(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    s = numpyro.sample("s", dist.HalfNormal(5.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Gumbel(mu, s), obs=y)


def student_t(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    s = numpyro.sample("s", dist.HalfNormal(5.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, mu, s), obs=y)


def zero_inflated_poisson(y=None):
    gate = numpyro.sample("gate", dist.Beta(1.0, 1.0))
    log_rate = numpyro.sample("log_rate", dist.Normal(0.0, 3.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.ZeroInflatedPoisson(gate, jnp.exp(log_rate)), obs=y)


def _zoo(name):
    (X,), kwargs = ZOO[name].data()
    return (X,), kwargs


def _gumbel_data():
    rng = np.random.default_rng(21)
    return (), {"y": jnp.asarray(rng.gumbel(1.5, 2.0, 60))}


def _student_data():
    rng = np.random.default_rng(22)
    return (), {"y": jnp.asarray(0.5 + 1.5 * rng.standard_t(4.0, 60))}


def _zip_data():
    rng = np.random.default_rng(23)
    zero = rng.random(80) < 0.3
    return (), {"y": jnp.asarray(np.where(zero, 0, rng.poisson(3.0, 80)).astype(float))}


CASES = {
    **{f"poisson_s{s:g}": (poisson_regression(s), lambda: _zoo("poisson_regression"), ("beta",)) for s in PRIOR_SCALES},
    **{f"logistic_s{s:g}": (logistic_regression(s), lambda: _zoo("logistic_regression"), ("beta",)) for s in PRIOR_SCALES},
    "scalar_poisson": (scalar_poisson, lambda: ((), {"y": jnp.asarray(7.0)}), ("loc",)),
    "gumbel": (gumbel, _gumbel_data, ("mu", "s")),
    "student_t": (student_t, _student_data, ("mu", "s")),
    "zero_inflated_poisson": (zero_inflated_poisson, _zip_data, ("gate", "log_rate")),
}
