"""result.loo() / result.influence(): leave-one-out from site parameters (memory perturbation).

Oracles: brute-force refits without each observation (conjugate models, where
removing the site parameter is exact), and PSIS-LOO on draws from q
(non-conjugate models, where it is an approximation).
"""

import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.stats as st

import blrppl
from blrppl.blr import driver
from models import ZOO

D, N, SIGMA = 3, 20, 0.7


def regression(X, *, y=None):
    """Conjugate regression: Gaussian coefficients, known noise; q is the exact posterior."""
    beta = numpyro.sample("beta", dist.MultivariateNormal(jnp.zeros(D), 4.0 * jnp.eye(D)))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, SIGMA), obs=y)


@pytest.fixture(scope="module")
def regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = X @ np.array([1.0, -2.0, 0.5]) + SIGMA * rng.normal(size=N)
    y[7] += 6.0  # an outlier
    return X, y


def test_conjugate_regression_loo_equals_refits_without_each_observation(regression_data, monkeypatch):
    X, y = regression_data
    engine = blrppl.ConjugateBayes(regression)
    result = engine.run(jax.random.key(0), 1, jnp.asarray(X), y=jnp.asarray(y), progress_bar=False)
    brute = []
    for i in range(N):
        keep = np.arange(N) != i
        refit = engine.run(jax.random.key(0), 1, jnp.asarray(X[keep]), y=jnp.asarray(y[keep]), progress_bar=False)
        q = refit.posterior["beta"]
        mean, cov = np.asarray(q.mean), np.asarray(q.covariance_matrix)
        brute.append(st.norm(X[i] @ mean, np.sqrt(SIGMA**2 + X[i] @ cov @ X[i])).logpdf(y[i]))

    def no_refit(*args, **kwargs):
        raise AssertionError("loo() must not refit")

    monkeypatch.setattr(driver, "run", no_refit)
    influence = result.influence()
    assert influence.method == "exact" and influence.exact and influence.factor == "y" and influence.plate == "N"
    np.testing.assert_allclose(influence.loo_lpd, brute, rtol=0, atol=1e-8)
    # The outlier moves the posterior most (KL(q || q_-i)), and leaving it out costs it most.
    assert int(np.argmax(influence.sensitivity)) == 7 and np.all(influence.sensitivity >= 0)
    assert int(np.argmax(influence.lpd - influence.loo_lpd)) == 7
    elpd = result.loo()
    assert isinstance(elpd, az.ELPDData)
    np.testing.assert_allclose(elpd.elpd_loo, np.sum(brute), atol=1e-8)
    np.testing.assert_allclose(elpd.loo_i.values, brute, atol=1e-8)
    assert elpd.loo_i.dims == ("N",) and not elpd.warning and np.all(elpd.pareto_k.values == 0)


def test_gamma_poisson_loo_equals_refits_without_each_observation():
    entry = ZOO["gamma_poisson"]
    args, kwargs = entry.data()
    y = np.asarray(kwargs["y"])
    engine = blrppl.ConjugateBayes(entry.model)
    result = engine.run(jax.random.key(0), 1, *args, progress_bar=False, **kwargs)
    brute = []
    for i in range(y.size):
        refit = engine.run(jax.random.key(0), 1, *args, progress_bar=False, y=jnp.asarray(np.delete(y, i)))
        q = refit.posterior["lam"]
        shape, rate = float(q.concentration), float(q.rate)
        brute.append(st.nbinom(shape, rate / (1.0 + rate)).logpmf(y[i]))  # the Gamma-Poisson predictive
    influence = result.influence()
    assert influence.method == "exact"
    np.testing.assert_allclose(influence.loo_lpd, brute, rtol=0, atol=1e-8)


def test_logistic_regression_loo_agrees_with_psis_loo():
    entry = ZOO["logistic_regression"]
    args, kwargs = entry.data()
    result = blrppl.NonConjugateVI(entry.model).run(jax.random.key(0), 200, *args, progress_bar=False, tol=1e-8, **kwargs)
    ours = result.loo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        psis = az.loo(result.to_arviz(jax.random.key(1), 4000), pointwise=True)
    assert abs(ours.elpd_loo - psis.elpd_loo) < psis.se
    assert abs(ours.p_loo - psis.p_loo) < 0.5
    np.testing.assert_allclose(ours.loo_i.values, psis.loo_i.values, atol=0.05)
    influence = result.influence()
    assert influence.method == "glm" and not influence.exact
    assert np.all(influence.diagnostic < 0.7) and np.all(influence.sensitivity > 0)
    comparison = az.compare({"blr": ours, "psis": psis})  # ELPDData: az.compare takes it
    assert set(comparison.index) == {"blr", "psis"}


def test_mean_field_model_uses_importance_weights_with_their_k():
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(jax.random.key(0), 50, *args, progress_bar=False, tol=1e-10, **kwargs)
    influence = result.influence(jax.random.key(3), num_samples=4000)
    assert influence.method == "importance" and influence.num_samples == 4000
    assert np.all(np.isfinite(influence.diagnostic)) and np.all(influence.diagnostic < 0.7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        psis = az.loo(result.to_arviz(jax.random.key(1), 4000), pointwise=True)
    assert abs(np.sum(influence.loo_lpd) - psis.elpd_loo) < psis.se


def test_factors_without_per_observation_sites_point_to_psis_loo():
    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()
    result = blrppl.NonConjugateVI(entry.model).run(jax.random.key(0), 5, *args, progress_bar=False, **kwargs)
    with pytest.raises(blrppl.ModelError, match=r"site 'y'.*az\.loo"):
        result.loo()
    with pytest.raises(blrppl.ModelError, match="not an observed site"):
        result.influence(factor="mu")
