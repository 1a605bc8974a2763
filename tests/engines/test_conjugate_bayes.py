"""ConjugateBayes: the exact posterior in one step, ELBO = log evidence (Sec. 5.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import betaln, gammaln  # scipy: jax.scipy betaln is only ~1e-8 accurate

import blrppl
from models import ZOO


def run(model, *args, steps=1, **kwargs):
    return blrppl.ConjugateBayes(model).run(jax.random.key(0), steps, *args, progress_bar=False, **kwargs)


def test_beta_bernoulli_is_exact_with_evidence():
    entry = ZOO["beta_bernoulli"]
    args, kwargs = entry.data()
    y = np.asarray(kwargs["y"])
    result = run(entry.model, *args, **kwargs)
    q = result.posterior["p"]
    heads, tails = y.sum(), y.size - y.sum()
    assert np.allclose(q.concentration1, 1.0 + heads, rtol=1e-12)
    assert np.allclose(q.concentration0, 1.0 + tails, rtol=1e-12)
    log_evidence = betaln(1.0 + heads, 1.0 + tails) - betaln(1.0, 1.0)
    assert np.allclose(result.elbo[-1], log_evidence, rtol=1e-10)


def test_gamma_poisson_is_exact_with_evidence():
    entry = ZOO["gamma_poisson"]
    args, kwargs = entry.data()
    y = np.asarray(kwargs["y"])
    a, b = 2.0, 1.0  # lam ~ Gamma(2, 1) in models/gamma_poisson.py
    result = run(entry.model, *args, **kwargs)
    q = result.posterior["lam"]
    assert np.allclose(q.concentration, a + y.sum(), rtol=1e-12)
    assert np.allclose(q.rate, b + y.size, rtol=1e-12)
    log_evidence = (
        a * np.log(b) - gammaln(a) + gammaln(a + y.sum()) - (a + y.sum()) * np.log(b + y.size)
        - np.sum(gammaln(y + 1.0))
    )
    assert np.allclose(result.elbo[-1], log_evidence, rtol=1e-10)


def normal_normal(y):
    z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def test_normal_normal_is_exact_and_extra_steps_are_no_ops():
    y = jnp.array([0.3, 1.1, 0.8])
    result = run(normal_normal, y, steps=5)
    precision = 1.0 + y.size / 0.25
    q = result.posterior["z"]
    assert np.allclose(q.loc, y.sum() / 0.25 / precision, rtol=1e-12)
    assert np.allclose(q.scale**2, 1.0 / precision, rtol=1e-12)
    log_evidence = jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros(3), 0.25 * jnp.eye(3) + jnp.ones((3, 3)))
    assert np.allclose(result.elbo, log_evidence, rtol=1e-12)  # every step: no-ops after the first


def test_with_tol_the_exact_step_is_its_own_fixed_point():
    """With ``tol`` the run stops after its one exact step (no steps to confirm it) and
    says why; the same engine without ``tol`` takes every step asked for."""
    engine = blrppl.ConjugateBayes(normal_normal)
    y = jnp.array([0.3, 1.1, 0.8])
    stopped = engine.run(jax.random.key(0), 5, y, tol=1e-12, progress_bar=False)
    assert stopped.converged and stopped.converged.num_steps == 1 and "fixed point" in stopped.converged.reason
    every = engine.run(jax.random.key(0), 3, y, progress_bar=False)
    assert not every.converged and len(every.elbo) == 3
    np.testing.assert_array_equal(every.elbo, stopped.elbo[0])


def regression_with_intercept(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    numpyro.sample("y", dist.Normal(X @ w + b, 0.3), obs=y)


def known_scales(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 2.0))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def test_gaussian_latents_sharing_a_factor_form_one_exact_joint_block():
    """A regression's intercept and slopes (uncentred columns: strongly correlated), and a
    hierarchy of means with known scales: one joint Gaussian block each, the exact posterior
    (moments and log evidence by dense conditioning) in one step; `choose` picks it."""
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, 1.0, size=(25, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.7 + 0.3 * rng.normal(size=25)
    result = run(regression_with_intercept, X, y=y)
    design = np.hstack([X, np.ones((25, 1))])
    cov = np.linalg.inv(design.T @ design / 0.09 + np.diag([1.0, 1.0, 1.0, 0.25]))
    mean = cov @ design.T @ y / 0.09
    post = result.posterior
    np.testing.assert_allclose(np.append(post["w"].mean, post["b"].loc), mean, rtol=1e-9)
    np.testing.assert_allclose(np.append(np.diag(post["w"].covariance_matrix), post["b"].scale**2), np.diag(cov), rtol=1e-9)
    marginal = jax.scipy.stats.multivariate_normal.logpdf(y, np.zeros(25), 0.09 * np.eye(25) + design @ np.diag([1.0, 1, 1, 4]) @ design.T)
    assert np.allclose(result.elbo[-1], marginal, rtol=1e-10)
    choice = blrppl.choose(regression_with_intercept, X, y=y)
    assert choice.name == "ConjugateBayes" and "joint blocks ('w+b')" in choice.reasons[0]

    sigma, y = np.array([15.0, 10, 16, 11, 9, 11, 10, 18]), np.array([28.0, 8, -3, 7, -1, 1, 18, 12])
    result = run(known_scales, sigma, y=y)
    evidence = jax.scipy.stats.multivariate_normal.logpdf(y, np.zeros(8), np.diag(sigma**2 + 4.0) + 25.0)
    assert np.allclose(result.elbo[-1], evidence, rtol=1e-10) and result.flags == ()
    assert blrppl.choose(known_scales, sigma, y=y).name == "ConjugateBayes"


@pytest.mark.parametrize("name", ["normal_mean_precision", "linear_regression", "gaussian_mixture"])
def test_models_outside_the_family_point_to_vmp(name):
    entry = ZOO[name]
    args, kwargs = entry.data()
    with pytest.raises(blrppl.ModelError, match="VMP") as error:
        run(entry.model, *args, **kwargs)
    assert "site '" in str(error.value)


def test_non_conjugate_factor_is_a_model_error_naming_factor_and_variable():
    entry = ZOO["poisson_regression"]
    args, kwargs = entry.data()
    with pytest.raises(blrppl.ModelError) as error:
        run(entry.model, *args, **kwargs)
    message = str(error.value)
    assert "site 'y'" in message and "exp" in message and "beta" in message


def _reject_every_step(monkeypatch):
    """Every update's safeguard says the new λ fails its family's check (as rounding can make it)."""
    from blrppl.blr import build, update

    def rejected(family, natural, messages, rho, **options):
        new, _ = update.safe_global_update(family, natural, messages, rho, **options)
        return new, jnp.ones((), bool)

    monkeypatch.setattr(build, "safe_global_update", rejected)


def test_a_rejected_exact_step_is_an_error_not_the_safeguards_fallback(monkeypatch):
    # The exact posterior is one step (rho = 1); a step whose λ fails the family's check leaves
    # the safeguard's fallback, which is not the posterior, and must never come back as one.
    _reject_every_step(monkeypatch)
    entry = ZOO["beta_bernoulli"]
    args, kwargs = entry.data()
    with pytest.raises(blrppl.ModelError, match="exact posterior .* is not a valid q"):
        run(entry.model, *args, **kwargs)


def test_a_batched_member_whose_exact_step_is_rejected_fails_alone(monkeypatch):
    _reject_every_step(monkeypatch)
    entry = ZOO["beta_bernoulli"]
    _, kwargs = entry.data()
    ys = jnp.stack([kwargs["y"], 1.0 - kwargs["y"]])
    batch = blrppl.ConjugateBayes(entry.model).run_batched(jax.random.key(0), 1, y=ys)
    assert list(batch.failed) == [True, True]
    assert all("exact posterior" in flags[0] for flags in (batch[i].flags for i in range(2)))


@pytest.mark.parametrize("progress_bar", [False, True])
def test_a_start_that_fails_its_test_stops_a_run_before_any_step(monkeypatch, progress_bar):
    # The driver tests a start inside the loop's program (an exact run without a progress bar) or
    # in the start's; either way a failed test is the start's error and no step is taken. An exact
    # engine's run does not test its start, which its one step does not read (a forward pass over
    # a chain, a third of a local level's run): its posterior is the same.
    from blrppl.blr import driver
    from blrppl.engines import base

    entry = ZOO["beta_bernoulli"]
    args, kwargs = entry.data()
    expected = blrppl.ConjugateBayes(entry.model).run(jax.random.key(0), 1, *args, progress_bar=False, **kwargs)
    monkeypatch.setattr(base, "start_tests", lambda qs: tuple((v, lambda lam: jnp.zeros((), bool)) for v in qs))
    with pytest.raises(blrppl.ModelError, match="site 'p': its prior does not define a proper starting q"):
        blrppl.VMP(entry.model).run(jax.random.key(0), 3, *args, progress_bar=progress_bar, **kwargs)
    result = blrppl.ConjugateBayes(entry.model).run(jax.random.key(0), 1, *args, progress_bar=progress_bar, **kwargs)
    np.testing.assert_array_equal(result.natural_params["p"], expected.natural_params["p"])
    engine = blrppl.ConjugateBayes(entry.model)
    plan = engine.plan(*args, **kwargs)
    _, elbo, _, valid = driver.checked_run(
        engine.build(plan), jax.random.key(0), 3, plan.arrays, base.start_tests(plan.qs), progress_bar=progress_bar
    )
    assert len(elbo) == 0 and not np.any(valid)


def test_an_improper_posterior_from_a_proper_prior_is_an_error_not_a_safe_step():
    # exp(-mu^2/2) * exp(1.5 mu^2) cannot be normalised. The safeguard's improved Gaussian step
    # used to turn the indefinite target into N(0, 0.71^2), returned as the exact posterior.
    def model(c):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.factor("push", 0.5 * c * mu**2)

    q = run(model, jnp.asarray(0.5)).posterior["mu"]  # proper: precision 1 - 0.5
    np.testing.assert_allclose(q.scale, np.sqrt(2.0), rtol=1e-12)
    with pytest.raises(blrppl.ModelError, match="exact posterior .* is not a valid q"):
        run(model, jnp.asarray(3.0))


def test_a_batched_argument_of_one_number_per_data_set_is_data_not_a_constant(rng_key):
    # A (B,) argument gave each data set a numpy scalar, which planning took as a constant: the
    # batched replanning then read its inputs one place off (a bare einsum ValueError).
    def pushed(c, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.factor("push", 0.5 * c * mu**2)
        with numpyro.plate("N", 20):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = jnp.asarray(np.random.default_rng(0).normal(size=(2, 20)))
    batch = blrppl.ConjugateBayes(pushed).run_batched(rng_key, 1, jnp.asarray([0.5, 0.2]), y=y)
    for c, result in zip((0.5, 0.2), batch):
        np.testing.assert_allclose(result.posterior["mu"].scale, (21.0 - c) ** -0.5, rtol=1e-12)  # 1 + 20 - c
