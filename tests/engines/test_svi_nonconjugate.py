"""SVI with non-conjugate likelihoods: estimated site parameters on minibatches.

Both modes (global: stochastic natural gradient with a decaying ρ, Sec. 5.3;
local: per-observation two-number GLM sites swapped, Eq. 60) and both
estimators (Gauss-Hermite on the batch's linear predictors; Monte Carlo on
the subsample) must land on the full-batch NonConjugateVI optimum.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.plan import make_plan
from blrppl.engines import presets
from tests.compiles import cheap_jit

N, D, M = 1000, 3, 100
W = np.array([0.5, -0.3, 0.2])


def logistic(X, y, batch_size=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def poisson(X, y, batch_size=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Poisson(jnp.exp(a + X[idx] @ beta)), obs=y[idx])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y_bernoulli = (rng.random(N) < 1.0 / (1.0 + np.exp(-X @ W))).astype(float)
    y_poisson = rng.poisson(np.exp(0.3 + X @ W)).astype(float)
    return jnp.asarray(X), {"logistic": jnp.asarray(y_bernoulli), "poisson": jnp.asarray(y_poisson)}


_REFERENCES = {}


def reference(model, X, y):
    """The full-batch NonConjugateVI optimum (Gauss-Hermite on every predictor), once per model."""
    if model.__name__ not in _REFERENCES:
        result = blrppl.NonConjugateVI(model).run(jax.random.PRNGKey(0), 200, X, y, progress_bar=False)
        _REFERENCES[model.__name__] = result.posterior
    return _REFERENCES[model.__name__]


def assert_close_in_sds(posterior, ref, tol=0.05, sd_rtol=0.02):
    for site, q in ref.items():
        m0, s0 = np.asarray(q.mean), np.sqrt(np.asarray(q.variance))
        m1, s1 = np.asarray(posterior[site].mean), np.sqrt(np.asarray(posterior[site].variance))
        np.testing.assert_array_less(np.abs(m1 - m0) / s0, tol, err_msg=site)
        np.testing.assert_allclose(s1, s0, rtol=sd_rtol, err_msg=site)


def test_poisson_glm_both_modes_reach_the_full_batch_optimum(data, rng_key):
    X, ys = data
    ref = reference(poisson, X, ys["poisson"])
    stepwise = blrppl.SVI(poisson, estimator="auto").run(rng_key, 300, X, ys["poisson"], M, progress_bar=False)
    assert stepwise.estimators["y"] == "quadrature"
    assert_close_in_sds(stepwise.posterior, ref)
    incremental = blrppl.SVI(poisson, estimator="auto", mode="local", learning_rate=1.0)
    result = incremental.run(rng_key, 200, X, ys["poisson"], M, progress_bar=False)
    assert_close_in_sds(result.posterior, ref, tol=1e-3, sd_rtol=1e-3)


def test_local_mode_stores_two_numbers_per_observation(data, rng_key):
    """Eq. 60 with GLM sites: O(N) numbers, never N × D², and finite after an epoch."""
    X, ys = data
    result = blrppl.SVI(logistic, estimator="auto", mode="local", learning_rate=1.0).run(
        rng_key, N // M, X, ys["logistic"], M, progress_bar=False
    )
    leaves = jax.tree.leaves(result.state.site_params)
    per_observation = [x for x in leaves if x.shape and x.shape[0] == N]
    assert len(per_observation) == 2 and all(x.shape == (N,) for x in per_observation)
    assert sum(x.size for x in leaves) < 3 * N
    # After one pass every observation has its site: none is still zero.
    assert all(bool(jnp.all(x != 0.0)) for x in per_observation)
    assert np.all(np.isfinite(np.asarray(result.posterior["beta"].mean)))


def test_logistic_regression_both_modes_reach_the_full_batch_optimum(data, rng_key):
    X, ys = data
    ref = reference(logistic, X, ys["logistic"])
    stepwise = blrppl.SVI(logistic, estimator="quadrature").run(rng_key, 300, X, ys["logistic"], M, progress_bar=False)
    assert_close_in_sds(stepwise.posterior, ref)
    incremental = blrppl.SVI(logistic, estimator="quadrature", mode="local", learning_rate=1.0)
    assert_close_in_sds(incremental.run(rng_key, 200, X, ys["logistic"], M, progress_bar=False).posterior, ref, 1e-3)


def test_monte_carlo_on_the_subsample_reaches_the_full_batch_optimum(data, rng_key):
    X, ys = data
    ref = reference(logistic, X, ys["logistic"])
    result = blrppl.SVI(logistic, estimator="mc").run(rng_key, 400, X, ys["logistic"], M, progress_bar=False)
    assert result.estimators["y"] == "mc"
    assert_close_in_sds(result.posterior, ref)


def test_minibatch_sums_over_every_row_equal_the_full_data_estimate(data):
    """N/M chunks of the minibatch estimator add up to the full-data site parameters."""
    X, ys = data
    y = ys["poisson"]
    full = make_plan(poisson, (X, y), {}, presets.nonconjugate_vi())
    batched = make_plan(poisson, (X, y, M), {}, presets.svi(estimator="auto"))
    (est_full,) = [e for e in full.estimators if e.factor == "y"]
    (est_batch,) = [e for e in batched.estimators if e.factor == "y"]
    from blrppl.blr.elbo import mean_params
    from blrppl.blr.starts import initial_natural

    natural = initial_natural(jax.random.PRNGKey(1), full.graph, full.qs, full.estimators, full.arrays, {})
    mean = mean_params(full.qs, natural)
    key = jax.random.PRNGKey(2)
    # Each estimate as one compiled call (run eagerly, every operation compiles on its own).
    value_full, grads_full = cheap_jit(lambda a: est_full.estimate(key, mean, {}, a))(full.arrays)
    value_batch, grads_batch = cheap_jit(lambda a: est_batch.estimate(key, mean, {}, a))(batched.arrays)
    np.testing.assert_allclose(value_batch, value_full, rtol=1e-10)
    for a, b in zip(jax.tree.leaves(grads_batch), jax.tree.leaves(grads_full)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    # One minibatch is its rows' share: the unscaled sum over those rows.
    rows = jnp.arange(M)
    value_rows, _ = cheap_jit(lambda a: est_batch.estimate(key, mean, {}, a, batch=rows))(batched.arrays)
    head = make_plan(poisson, (X[:M], y[:M]), {}, presets.nonconjugate_vi())
    (est_head,) = [e for e in head.estimators if e.factor == "y"]
    value_head = cheap_jit(lambda a: est_head.estimate(key, mean, {}, a)[0])(head.arrays)
    np.testing.assert_allclose(value_rows, value_head, rtol=1e-10)


def test_svi_refuses_non_conjugate_factors_unless_asked_and_local_latents_always(data):
    X, ys = data
    with pytest.raises(blrppl.ModelError, match="estimator='auto'"):
        blrppl.SVI(logistic).plan(X, ys["logistic"], M)

    def local_scale(X, y, batch_size=None):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
        with numpyro.plate("N", X.shape[0], subsample_size=batch_size) as idx:
            u = numpyro.sample("u", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta + u), obs=y[idx])

    with pytest.raises(blrppl.ModelError, match="local to the subsampled plate"):
        blrppl.SVI(local_scale, estimator="mc").plan(X, ys["logistic"], M)
