"""Non-Gaussian observations of a latent chain: per-step quadrature with the chain Gaussian q."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

import blrppl
from models import stochastic_volatility

REFERENCES = json.loads((pathlib.Path(__file__).parents[1] / "data" / "references.json").read_text())


def test_stochastic_volatility_matches_nuts(rng_key):
    args, kwargs = stochastic_volatility.data()
    result = blrppl.NonConjugateVI(stochastic_volatility.model).run(rng_key, 300, *args, progress_bar=False, tol=1e-10, **kwargs)
    assert result.plan.qs["h"].family.name == "ScalarChainGaussian"
    assert result.estimators == {"h0": "exact", "h": "exact", "y": "quadrature"}
    reference = REFERENCES["stochastic_volatility"]
    ref_mean = np.concatenate([[reference["mean"]["h0"]], reference["mean"]["h"]])
    ref_sd = np.concatenate([[reference["sd"]["h0"]], reference["sd"]["h"]])
    q = result.posterior["h"]
    np.testing.assert_array_less(np.abs(np.asarray(q.mean) - ref_mean) / ref_sd, 0.1)
    np.testing.assert_array_less(np.abs(np.sqrt(np.asarray(q.variance)) / ref_sd - 1.0), 0.1)


def poisson_level(y=None, num_steps=40):
    level0 = numpyro.sample("level0", dist.Normal(1.0, 1.0))

    def transition(prev, y_t):
        level = numpyro.sample("level", dist.Normal(prev, 0.2))
        numpyro.sample("y", dist.Poisson(jnp.exp(level)), obs=y_t)
        return level, level

    scan(transition, level0, y, length=num_steps)


def test_poisson_counts_on_a_random_walk_level(rng_key):
    rng = np.random.default_rng(4)
    level = 1.0 + np.cumsum(rng.normal(0.0, 0.2, 40))
    y = jnp.asarray(rng.poisson(np.exp(level)).astype(float))
    result = blrppl.NonConjugateVI(poisson_level).run(rng_key, 300, y=y, progress_bar=False, tol=1e-10)
    assert result.estimators["y"] == "quadrature"
    q = result.posterior["level"]
    # Deterministic site parameters: the run converged (ELBO flat), and the smoothed level
    # tracks the truth within its own uncertainty.
    assert abs(float(result.elbo[-1] - result.elbo[-2])) < 1e-8
    z = (np.asarray(q.mean)[1:] - level) / np.sqrt(np.asarray(q.variance)[1:])
    assert np.mean(np.abs(z)) < 1.5


def test_a_non_gaussian_transition_is_refused(rng_key):
    def model(y=None):
        x0 = numpyro.sample("x0", dist.Normal(0.0, 1.0))

        def transition(prev, y_t):
            x = numpyro.sample("x", dist.Normal(jnp.tanh(prev), 0.5))
            numpyro.sample("y", dist.Normal(x, 1.0), obs=y_t)
            return x, x

        scan(transition, x0, y, length=5)

    with pytest.raises(blrppl.ModelError, match="couples"):
        blrppl.NonConjugateVI(model).run(rng_key, 2, y=jnp.zeros(5), progress_bar=False)


def hmm_halfnormal_scale(num_states=2, *, y=None):
    with numpyro.plate("K", num_states):
        trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(num_states)))
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    z0 = numpyro.sample("z0", dist.Categorical(jnp.ones(num_states) / num_states))

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(mu[z], sigma), obs=y_t)
        return z, None

    scan(transition, z0, y)


def test_hmm_with_a_halfnormal_scale_is_exact_in_the_chain_and_means(rng_key):
    """The emission factor is conjugate in mu and the chain, not in sigma: hybrid site parameters."""
    from models import hmm

    _, kwargs = hmm.data()  # a sticky two-state chain, means -2 and 2, noise sd 0.5
    result = blrppl.NonConjugateVI(hmm_halfnormal_scale).run(rng_key, 300, y=kwargs["y"], progress_bar=False, tol=1e-9)
    assert result.estimators["y"] == "exact+quadrature" and result.estimators["z"] == "exact"
    assert result.plan.qs["z"].family.name == "TiedChainCategorical"
    np.testing.assert_allclose(np.sort(np.asarray(result.posterior["mu"].mean)), [-2.0, 2.0], atol=0.2)
    np.testing.assert_allclose(float(result.posterior["sigma"].mean), 0.5, rtol=0.2)
    assert np.all(np.diff(np.asarray(result.elbo)[5:]) > -1e-6)
