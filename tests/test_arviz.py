"""ArviZ and NumPyro interop: to_arviz groups and dims, LOO, plots, netCDF, Predictive."""

import warnings

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from models import ZOO

NUM_GROUPS = 6


def hierarchical(group, num_groups, *, y=None):
    """Varying intercepts with conjugate priors (radon-style, fitted exactly by VMP)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau_group = numpyro.sample("tau_group", dist.Gamma(2.0, 1.0))
    with numpyro.plate("group", num_groups):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0 / jnp.sqrt(tau_group)))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("obs", group.shape[0]):
        numpyro.sample("y", dist.Normal(theta[group], 1.0 / jnp.sqrt(tau)), obs=y)


@pytest.fixture(scope="module")
def hierarchical_fit():
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(NUM_GROUPS), 5)
    y = rng.normal(1.0, 1.0, NUM_GROUPS)[group] + 0.5 * rng.normal(size=group.size)
    args, kwargs = (jnp.asarray(group), NUM_GROUPS), {"y": jnp.asarray(y)}
    result = blrppl.VMP(hierarchical).run(jax.random.key(0), 50, *args, progress_bar=False, tol=1e-8, **kwargs)
    idata = result.to_arviz(jax.random.key(1), 400, posterior_predictive=True)
    return result, idata


def test_posterior_dims_carry_plate_names(hierarchical_fit):
    _, idata = hierarchical_fit
    assert idata.posterior["theta"].dims == ("chain", "draw", "group")
    assert idata.posterior["mu"].dims == ("chain", "draw")
    assert idata.posterior.sizes["chain"] == 1 and idata.posterior.sizes["draw"] == 400
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "obs")
    assert idata.observed_data["y"].dims == ("obs",)
    assert idata.posterior_predictive["y"].dims == ("chain", "draw", "obs")


def test_summary_loo_and_plot_posterior_succeed(hierarchical_fit):
    result, idata = hierarchical_fit
    summary = az.summary(idata, kind="stats")
    assert "theta[0]" in summary.index and "mu" in summary.index
    np.testing.assert_allclose(summary.loc["mu", "mean"], result.posterior["mu"].mean, atol=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ's high-k warning, if any
        loo = az.loo(idata, pointwise=True)
    assert np.isfinite(loo.elpd_loo) and loo.pareto_k.shape == (30,)
    axes = az.plot_posterior(idata, var_names=["mu", "theta"])
    titled = [ax for ax in np.ravel(axes) if ax.get_title()]
    assert len(titled) == 1 + NUM_GROUPS
    plt.close("all")


def test_posterior_predictive_group_matches_the_observations(hierarchical_fit):
    result, idata = hierarchical_fit
    draws = idata.posterior_predictive["y"].values[0]
    assert draws.shape == (400, 30)
    # Each replicate comes from its own posterior draw: E[y_rep_n] = E_q[theta_group(n)].
    group = np.repeat(np.arange(NUM_GROUPS), 5)
    expected = np.asarray(result.posterior["theta"].mean)[group]
    standard_error = draws.std(0) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - expected) < 5 * standard_error)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        az.plot_ppc(idata, num_pp_samples=20)
    plt.close("all")


def test_netcdf_round_trip(hierarchical_fit, tmp_path):
    _, idata = hierarchical_fit
    path = tmp_path / "fit.nc"
    idata.to_netcdf(str(path))
    loaded = az.from_netcdf(str(path))
    assert set(loaded.groups()) == set(idata.groups())
    np.testing.assert_array_equal(loaded.posterior["theta"].values, idata.posterior["theta"].values)
    assert loaded.posterior["theta"].dims == ("chain", "draw", "group")
    assert loaded.sample_stats["elbo"].dims == ("chain", "step")


@pytest.mark.slow  # compilation-bound: ~6-10 s on 2 cores
def test_predictive_with_the_guide_matches_the_predictive_mean_under_q(rng_key):
    """E[y*] = E_q[alpha] + X E_q[beta] in closed form, within Monte Carlo error."""
    entry = ZOO["linear_regression"]
    (X,), kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    result = engine.run(rng_key, 100, X, progress_bar=False, tol=1e-10, **kwargs)
    num_samples = 2000
    predictive = numpyro.infer.Predictive(entry.model, guide=engine.guide(result), num_samples=num_samples)
    draws = predictive(jax.random.key(3), X)
    assert draws["y"].shape == (num_samples, X.shape[0])
    expected = result.posterior["alpha"].mean + X @ result.posterior["beta"].mean
    y = np.asarray(draws["y"])
    standard_error = y.std(0) / np.sqrt(num_samples)
    z = (y.mean(0) - np.asarray(expected)) / standard_error
    assert np.all(np.abs(z) < 5)
    # numpyro's own log_likelihood works on draws from result.sample.
    samples = result.sample(jax.random.key(4), 10)
    log_lik = numpyro.infer.log_likelihood(entry.model, samples, X, **kwargs)
    assert log_lik["y"].shape == (10, X.shape[0])
