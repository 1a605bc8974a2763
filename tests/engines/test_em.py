"""EM: exact E-step, closed-form M-step for numpyro.param sites (Sec. 5.2)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
import pytest
from scipy.stats import norm

import blrppl
from blrppl.blr import driver

WEIGHTS = np.array([0.3, 0.3, 0.4])


def mixture(y):
    mu = numpyro.param("mu", jnp.array([-1.0, 0.0, 1.0]))
    sigma = numpyro.param("sigma", jnp.ones(3), constraint=constraints.positive)
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(jnp.asarray(WEIGHTS)))
        numpyro.sample("y", dist.Normal(mu[z], sigma[z]), obs=y)


def numpy_em(y, mu, sigma, steps):
    history = []
    for _ in range(steps):
        log_r = np.log(WEIGHTS) + norm.logpdf(y[:, None], mu, sigma)
        r = np.exp(log_r - log_r.max(1, keepdims=True))
        r /= r.sum(1, keepdims=True)
        n = r.sum(0)
        mu = (r * y[:, None]).sum(0) / n
        sigma = np.sqrt((r * (y[:, None] - mu) ** 2).sum(0) / n)
        history.append((mu, sigma))
    return history


def test_em_equals_hand_written_em_step_by_step(rng_key):
    rng = np.random.default_rng(5)
    y = np.concatenate([rng.normal(-3, 0.5, 40), rng.normal(0.5, 1.0, 40), rng.normal(4, 0.7, 50)])
    engine = blrppl.EM(mixture)
    plan = engine.plan(jnp.asarray(y))
    algorithm = engine.build(plan)
    state = driver.init(algorithm, rng_key, plan.arrays)
    step = jax.jit(algorithm.step)
    expected = numpy_em(y, np.array([-1.0, 0.0, 1.0]), np.ones(3), 8)
    elbos = []
    for t, (mu, sigma) in enumerate(expected):
        state, info = step(state, plan.arrays)
        np.testing.assert_allclose(state.params["mu"], mu, rtol=1e-8)
        np.testing.assert_allclose(state.params["sigma"], sigma, rtol=1e-8)
        elbos.append(float(info.elbo))
    assert np.all(np.diff(elbos) >= -1e-9 * np.abs(elbos[1:]))


def test_em_bound_equals_the_log_likelihood_at_convergence(rng_key):
    rng = np.random.default_rng(6)
    y = np.concatenate([rng.normal(-2, 0.5, 30), rng.normal(2, 0.8, 30)])
    result = blrppl.EM(mixture).run(rng_key, 300, jnp.asarray(y), progress_bar=False, tol=1e-12)
    mu, sigma = np.asarray(result.params["mu"]), np.asarray(result.params["sigma"])
    log_likelihood = np.sum(np.log(np.sum(WEIGHTS * norm.pdf(y[:, None], mu, sigma), 1)))
    np.testing.assert_allclose(result.elbo[-1], log_likelihood, rtol=1e-8)


def test_point_estimates_of_latent_sites_are_map_steps(rng_key):
    from models import ZOO

    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    y = np.asarray(kwargs["y"])
    result = blrppl.EM(entry.model, point_estimates=["mu"]).run(rng_key, 200, *args, progress_bar=False, **kwargs)
    assert "mu" in result.params and "mu" not in result.posterior
    # Fixed point of: q(tau) = Gamma(1 + N/2, 1 + sum (y - mu)^2 / 2); mu = MAP given E[tau].
    mu = 0.0
    for _ in range(500):
        a, b = 1.0 + y.size / 2.0, 1.0 + 0.5 * np.sum((y - mu) ** 2)
        e_tau = a / b
        mu = e_tau * y.sum() / (y.size * e_tau + 1.0 / 100.0)
    np.testing.assert_allclose(result.params["mu"], mu, rtol=1e-9)
    np.testing.assert_allclose(result.posterior["tau"].rate, b, rtol=1e-9)


def test_unknown_point_estimate_is_a_model_error(rng_key):
    from models import ZOO

    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    with pytest.raises(blrppl.ModelError, match="'nope'"):
        blrppl.EM(entry.model, point_estimates=["nope"]).run(rng_key, 2, *args, progress_bar=False, **kwargs)
