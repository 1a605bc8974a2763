"""SVI: minibatches from a subsampled plate, stepwise (global) and incremental (local)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.minibatch import batch_key, minibatch
from models import ZOO

N, M, SIGMA = 20_000, 500, 0.5


def subsampled(y, batch_size):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Normal(mu, SIGMA), obs=y[idx])


def full(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, SIGMA), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    # Low-noise data around a mean that drifts with the index: minibatch means
    # differ from the full mean by many posterior sds, so a wrong N/M scaling
    # or a missed observation shows.
    return jnp.asarray(1.0 + np.linspace(-1.0, 1.0, N) + SIGMA * rng.normal(size=N))


def exact_natural(y):
    precision = 1.0 / 100.0 + N / SIGMA**2
    return np.array([float(y.sum()) / SIGMA**2, -0.5 * precision])


def natural_of(result):
    lam = result.natural_params["mu"]
    return np.array([float(lam.x), float(lam.x_sq)])


def test_global_mode_with_one_over_t_is_the_running_average_of_rescaled_targets(data, rng_key):
    steps = 7
    result = blrppl.SVI(subsampled, learning_rate=lambda t: 1.0 / t).run(rng_key, steps, data, M, progress_bar=False)
    key = batch_key(result.state.rng_key)
    targets = []
    for t in range(1, steps + 1):
        batch = np.asarray(minibatch(key, jnp.asarray(t), N, M))
        ys = np.asarray(data)[batch]
        targets.append([N / M * ys.sum() / SIGMA**2, -0.5 * (1.0 / 100.0 + N / M * M / SIGMA**2)])
    np.testing.assert_allclose(natural_of(result), np.mean(targets, 0), rtol=1e-10)


def test_global_mode_after_one_epoch_is_exact(data, rng_key):
    result = blrppl.SVI(subsampled, learning_rate=lambda t: 1.0 / t).run(rng_key, N // M, data, M, progress_bar=False)
    np.testing.assert_allclose(natural_of(result), exact_natural(data), rtol=1e-10)


def test_global_mode_error_shrinks_with_steps(data, rng_key):
    exact = blrppl.ConjugateBayes(full).run(rng_key, 1, data, progress_bar=False).posterior["mu"]
    errors = []
    for steps in (2, 8, 32):
        q = blrppl.SVI(subsampled, learning_rate=lambda t: 1.0 / t).run(rng_key, steps, data, M, progress_bar=False)
        errors.append(abs(float(q.posterior["mu"].loc - exact.loc)))
    # Sampling without replacement: the error falls at least as fast as 1/sqrt(t).
    assert errors[2] < errors[0] / 2.0


def test_local_mode_is_exact_after_one_pass(data, rng_key):
    result = blrppl.SVI(subsampled, mode="local", learning_rate=1.0).run(rng_key, N // M, data, M, progress_bar=False)
    np.testing.assert_allclose(natural_of(result), exact_natural(data), rtol=1e-10)
    # Before the pass is complete, it is the posterior of the data seen so far.
    partial = blrppl.SVI(subsampled, mode="local", learning_rate=1.0).run(rng_key, 3, data, M, progress_bar=False)
    assert abs(natural_of(partial)[1] - (-0.5 * (1.0 / 100.0 + 3 * M / SIGMA**2))) < 1e-8


def mixture_subsampled(y, batch_size):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(3)))
    with numpyro.plate("K", 3):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0], subsample_size=batch_size) as idx:
        z = numpyro.sample("z", dist.Categorical(weights))
        numpyro.sample("y", dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z])), obs=y[idx])


def test_both_modes_reach_the_vmp_fixed_point_on_a_mixture(rng_key):
    entry = ZOO["gaussian_mixture"]
    _, kwargs = entry.data()
    y = kwargs["y"]
    vmp = blrppl.VMP(entry.model).run(rng_key, 300, 3, progress_bar=False, tol=1e-12, y=y)
    target = np.sort(np.asarray(vmp.posterior["mu"].mean))
    for mode, rate in (("local", 1.0), ("global", blrppl.blr.schedules.robbins_monro(1.0, 0.9))):
        result = blrppl.SVI(mixture_subsampled, mode=mode, learning_rate=rate).run(
            rng_key, 600, y, 30, progress_bar=False
        )
        means = np.sort(np.asarray(result.posterior["mu"].mean))
        np.testing.assert_allclose(means, target, atol=0.05)


def test_svi_needs_exactly_one_subsampled_plate(rng_key):
    with pytest.raises(blrppl.ModelError, match="subsample_size"):
        blrppl.SVI(full).run(rng_key, 2, jnp.ones(10), progress_bar=False)
    with pytest.raises(blrppl.ModelError, match="SVI"):
        blrppl.VMP(subsampled).run(rng_key, 2, jnp.ones(10), 5, progress_bar=False)
