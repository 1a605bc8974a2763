"""The deep-learning rows of Table 1: a diagonal-Gaussian BLR over all latents.

Oracles: the mean-field optimum of a Bayesian linear regression is closed
form (means = the exact posterior means, precisions = the diagonal of the
posterior precision); OGN's fixed point is the MAP with precision = the
empirical Fisher at the MAP plus the prior's (Eq. 45), also closed form.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive

import blrppl
from blrppl.engines.diagonal import DiagonalBLR
from tests.compiles import compilations, compiled_names
from tests.float32 import run_in_float32

SIGMA = 0.5


def regression(X, y=None, batch=None):
    b = numpyro.sample("b", dist.Normal(jnp.zeros(X.shape[1]), 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=batch) as i:
        numpyro.sample("y", dist.Normal(X[i] @ b, SIGMA), obs=None if y is None else y[i])


def regression_data(seed=0, n=500, d=5, dtype=np.float64):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = X @ rng.randn(d) + SIGMA * rng.randn(n)
    return X.astype(dtype), y.astype(dtype)


def mean_field_optimum(X, y):
    """(means, mean-field sds): the exact posterior mean and 1 / sqrt(diag(precision))."""
    precision = X.T @ X / SIGMA**2 + np.eye(X.shape[1])
    return np.linalg.solve(precision, X.T @ y / SIGMA**2), 1.0 / np.sqrt(np.diag(precision))


@pytest.fixture(scope="module")
def data():
    return regression_data()


@pytest.mark.parametrize("batch", [None, 50])
def test_ivon_reaches_the_mean_field_optimum(data, batch):
    X, y = data
    mean, sd = mean_field_optimum(X, y)
    result = blrppl.SVI(regression, estimator="ivon", beta2=0.999).run(jax.random.key(0), 20_000, X, y=y, batch=batch)
    q = result.posterior["b"]
    assert np.max(np.abs(q.mean - mean) / sd) < 0.08
    assert np.max(np.abs(np.sqrt(q.variance) / sd - 1.0)) < 0.05
    assert result.flags == ()
    assert result.elbo.shape == (20_000,)


def test_ogn_fixed_point_is_the_map_with_the_empirical_fisher(data):
    X, y = data
    mean, _ = mean_field_optimum(X, y)
    result = DiagonalBLR(regression, rule="ogn").run(jax.random.key(0), 10_000, X, y=y)
    q = result.posterior["b"]
    np.testing.assert_allclose(q.mean, mean, atol=1e-8)
    residual = y - X @ mean
    fisher = (residual[:, None] ** 2 * X**2).sum(0) / SIGMA**4 + 1.0  # Eq. 45: (N/M) Σ (∇ℓ_i)² + ∇²R
    np.testing.assert_allclose(np.sqrt(q.variance), 1.0 / np.sqrt(fisher), rtol=1e-3)


def test_vogn_on_minibatches_finds_the_means(data):
    X, y = data
    mean, sd = mean_field_optimum(X, y)
    result = DiagonalBLR(regression, rule="vogn").run(jax.random.key(1), 10_000, X, y=y, batch=50)
    q = result.posterior["b"]
    assert np.max(np.abs(q.mean - mean) / sd) < 0.1
    assert np.max(np.abs(np.sqrt(q.variance) / sd - 1.0)) < 0.2  # the empirical Fisher's bias, Eq. 45


@pytest.mark.parametrize("rule", ["rmsprop", "adam"])
def test_squared_gradient_rows_say_their_variances_are_not_posterior_variances(data, rule):
    X, y = data
    mean, sd = mean_field_optimum(X, y)
    result = DiagonalBLR(regression, rule=rule, learning_rate=1e-2).run(jax.random.key(0), 4000, X, y=y)
    assert np.max(np.abs(result.posterior["b"].mean - mean) / sd) < 0.5
    assert any("not posterior variances" in flag for flag in result.flags)
    assert not result.trustworthy


FLOAT32_SCRIPT = """
import json, jax, numpy as np
from blrppl.engines.diagonal import DiagonalBLR
from tests.engines.test_diagonal import regression, regression_data
X, y = regression_data(dtype=np.float32)
result = DiagonalBLR(regression, beta2=0.999).run(jax.random.key(0), 20_000, X, y=y, batch=50)
q = result.posterior["b"]
print(json.dumps({"dtype": str(q.mean.dtype), "finite": bool(np.isfinite(np.asarray(result.elbo)).all()),
                  "mean": np.asarray(q.mean, float).tolist(), "sd": np.sqrt(np.asarray(q.variance, float)).tolist()}))
"""


def test_float32_is_stable():
    out = json.loads(run_in_float32(FLOAT32_SCRIPT).strip().splitlines()[-1])
    X, y = regression_data(dtype=np.float32)
    mean, sd = mean_field_optimum(X.astype(np.float64), y.astype(np.float64))
    assert out["dtype"] == "float32" and out["finite"]
    assert np.max(np.abs(np.asarray(out["mean"]) - mean) / sd) < 0.1
    assert np.max(np.abs(np.asarray(out["sd"]) / sd - 1.0)) < 0.05


def test_an_unfinished_run_is_flagged(data):
    X, y = data
    result = DiagonalBLR(regression, learning_rate=1e-3, average=0.0).run(jax.random.key(0), 400, X, y=y)
    assert any("has not converged" in flag for flag in result.flags)


def test_noisy_averages_are_flagged(data):
    """Big steps on tiny minibatches: the average of the iterates is off by its Monte Carlo error, and says so."""
    X, y = data
    mean, sd = mean_field_optimum(X, y)
    result = DiagonalBLR(regression, learning_rate=0.5).run(jax.random.key(0), 2000, X, y=y, batch=5)
    assert np.max(np.abs(result.posterior["b"].mean - mean) / sd) > 0.1  # the test bites: the answer is off
    assert any("averaged iterates are noisy" in flag for flag in result.flags)


def wide_network(X, y=None, width=20):
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((X.shape[1], width)), 1.0))
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((width, width)), 1.0))
    w3 = numpyro.sample("w3", dist.Normal(jnp.zeros((width, 1)), 1.0))
    prec = numpyro.sample("prec", dist.Gamma(3.0, 1.0))
    f = jnp.tanh(jnp.tanh(X @ w1) @ w2) @ w3
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 1.0 / jnp.sqrt(prec)), obs=y)


@pytest.mark.slow  # 10,000 steps (12 s)
def test_mean_field_collapse_of_a_wide_network_is_flagged():
    x = np.linspace(-1, 1, 50)
    X = np.stack([np.ones_like(x), x, x**2], 1)
    y = np.sin(4 * x) + 0.05 * np.random.RandomState(0).randn(50)
    result = DiagonalBLR(wide_network, beta2=0.999).run(jax.random.key(0), 10_000, X, y=y)
    assert any("mean-field VI's known collapse" in flag for flag in result.flags)
    assert result.posterior["prec"].mean < 2.0  # the collapse: noise explains the data


def with_deterministic(X, y=None):
    b = numpyro.sample("b", dist.Normal(jnp.zeros(X.shape[1]), 1.0))
    prec = numpyro.sample("prec", dist.Gamma(2.0, 1.0))
    numpyro.deterministic("sd", 1.0 / jnp.sqrt(prec))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ b, 1.0 / jnp.sqrt(prec)), obs=y)


def test_result_api_draws_guide_and_arviz(data):
    X, y = data
    engine = DiagonalBLR(with_deterministic)
    result = engine.run(jax.random.key(0), 1500, X, y=y)
    q = result.posterior["prec"]
    assert q.mean > 0 and q.variance > 0  # a Gaussian on log prec, moments in the support
    assert abs(float(q.mean) - 1 / SIGMA**2) < 0.5
    draws = result.sample(jax.random.key(1), 100)
    assert {k: v.shape for k, v in draws.items()} == {"b": (100, 5), "prec": (100,), "sd": (100,)}
    np.testing.assert_allclose(draws["sd"], 1 / np.sqrt(draws["prec"]), rtol=1e-6)
    # Compiled as one program, as a user would (eagerly each of numpyro's operations compiles alone).
    predictive = jax.jit(Predictive(with_deterministic, guide=engine.guide(result), num_samples=20))(jax.random.key(2), X)
    assert predictive["y"].shape == (20, X.shape[0])
    idata = result.to_arviz(jax.random.key(3), num_samples=50)
    assert idata.posterior["b"].shape == (1, 50, 5)
    assert set(result.natural_params) == {"b", "prec"}


def test_draws_from_q_are_one_compiled_program(data):
    """Eagerly, q's draws and the model's deterministic sites compiled 46 one-operation programs."""
    X, y = data

    def model(X, y=None):  # a fresh model: nothing cached
        with_deterministic(X, y)

    result = DiagonalBLR(model).run(jax.random.key(0), 50, X, y=y)
    with compilations() as compiled:
        draws = result.sample(jax.random.key(1), 13)
    assert set(compiled_names(compiled)) <= {"jit(evaluate)"}, compiled_names(compiled)
    assert {k: v.shape for k, v in draws.items()} == {"b": (13, 5), "prec": (13,), "sd": (13,)}
    np.testing.assert_allclose(draws["sd"], 1 / np.sqrt(draws["prec"]), rtol=1e-12)
    with compilations() as compiled:  # q's marginals: one program too (eagerly 20 of them, 1.4 s)
        posterior = result.posterior
    assert set(compiled_names(compiled)) <= {"jit(evaluate)"}, compiled_names(compiled)
    mean, precision = result.state.averaged()
    np.testing.assert_allclose(posterior["b"].base_dist.loc, mean[:5], rtol=1e-14)
    np.testing.assert_allclose(posterior["b"].base_dist.scale, 1 / np.sqrt(precision[:5]), rtol=1e-14)


def subsampled_with_deterministic(X, y=None, batch=None):
    b = numpyro.sample("b", dist.Normal(jnp.zeros(X.shape[1]), 1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=batch):
        x = numpyro.subsample(X, event_dim=1)
        mean = numpyro.deterministic("mean", x @ b)
        numpyro.sample("y", dist.Normal(mean, SIGMA), obs=None if y is None else numpyro.subsample(y, event_dim=0))


def test_a_deterministic_site_in_the_subsampled_plate_is_drawn_on_every_row(data):
    """It was drawn on one minibatch's rows (50 of 500), in sample and to_arviz alike."""
    X, y = data
    result = DiagonalBLR(subsampled_with_deterministic).run(jax.random.key(0), 100, X, y=y, batch=50)
    draws = result.sample(jax.random.key(1), 7)
    assert draws["mean"].shape == (7, X.shape[0])
    np.testing.assert_allclose(draws["mean"], draws["b"] @ X.T, rtol=1e-10, atol=1e-12)
    assert result.to_arviz(jax.random.key(2), num_samples=5).posterior["mean"].shape == (1, 5, X.shape[0])
    with pytest.raises(blrppl.ModelError, match="site 'mean'.*draw fewer"):
        result.sample(jax.random.key(1), (1 << 27) // X.shape[0] + 1)


def test_a_second_run_on_new_data_compiles_nothing(data):
    X, y = data
    engine = DiagonalBLR(regression, beta2=0.999)
    warm = engine.run(jax.random.key(0), 1500, X, y=y, batch=50)
    jax.block_until_ready(warm.posterior["b"].mean)
    with compilations() as compiled:
        result = engine.run(jax.random.key(0), 1500, X, y=2.0 * y + 1.0, batch=50)
        jax.block_until_ready(result.posterior["b"].mean)
    assert not np.allclose(result.posterior["b"].mean, warm.posterior["b"].mean)  # the new data were used
    assert compiled == []


def test_resuming_goes_on_from_the_state(data):
    X, y = data
    engine = DiagonalBLR(regression, beta2=0.999)
    first = engine.run(jax.random.key(0), 200, X, y=y)
    second = engine.run(jax.random.key(0), 200, X, y=y, init_state=first.state)
    assert int(second.state.step) == 400
    assert float(second.elbo[-50:].mean()) > float(first.elbo[:50].mean())


def discrete(y=None):
    z = numpyro.sample("z", dist.Bernoulli(0.5))
    numpyro.sample("y", dist.Normal(z, 1.0), obs=y)


def with_param(y=None):
    loc = numpyro.param("loc", 0.0)
    numpyro.sample("y", dist.Normal(loc, 1.0), obs=y)


def local_latents(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5) as i:
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y[i])


@pytest.mark.parametrize(
    "model, match",
    [(discrete, "'z'.*continuous"), (with_param, "'loc'.*numpyro.param"), (local_latents, "'theta'.*subsampled plate")],
)
def test_models_it_cannot_fit_are_model_errors(model, match):
    with pytest.raises(blrppl.ModelError, match=match):
        DiagonalBLR(model).run(jax.random.key(0), 10, y=jnp.zeros(20))


def poisson(X, y=None):
    b = numpyro.sample("b", dist.Normal(jnp.zeros(X.shape[1]), 1.0))
    numpyro.sample("y", dist.Poisson(jnp.exp(X @ b)), obs=y)


def test_divergence_is_a_model_error(data):
    X, _ = data
    with pytest.raises(blrppl.ModelError, match="'b'.*diverged"):  # q's sd 1e6: exp overflows
        DiagonalBLR(poisson, hess_init=1e-12).run(jax.random.key(0), 50, X, y=np.ones(X.shape[0]))


def test_svi_names_the_rows():
    assert isinstance(blrppl.SVI(regression, estimator="ivon"), DiagonalBLR)
    assert blrppl.SVI(regression, estimator="vogn").rule.name == "vogn"
    with pytest.raises(ValueError, match="mode='global'"):
        blrppl.SVI(regression, estimator="ivon", mode="local")
    with pytest.raises(ValueError, match="rule must be one of"):
        DiagonalBLR(regression, rule="sgd")


def reads_its_data(X, y=None):
    groups = len(np.unique(np.asarray(X[:, 0] > 0)))  # numpy on the data: not traceable
    b = numpyro.sample("b", dist.Normal(jnp.zeros(X.shape[1]), 1.0))
    c = numpyro.sample("c", dist.Normal(jnp.zeros(groups), 1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ b + c[0], SIGMA), obs=y)


def test_a_model_that_reads_its_data_values_runs_with_the_data_as_constants(data):
    X, y = data
    engine = DiagonalBLR(reads_its_data, beta2=0.999)
    first = engine.run(jax.random.key(0), 2000, X, y=y)
    second = engine.run(jax.random.key(0), 2000, X, y=y + 5.0)
    assert first.posterior["c"].mean.shape == (2,)
    assert float(second.posterior["c"].mean[0]) > float(first.posterior["c"].mean[0]) + 1.0
