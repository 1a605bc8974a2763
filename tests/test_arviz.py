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
SCHOOLS = [f"school {c}" for c in "ABCDEF"]


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
    idata = result.to_arviz(
        jax.random.key(1), 400, posterior_predictive=True, coords={"group": SCHOOLS}, dims={"tau": []}
    )
    return result, idata


def test_posterior_dims_carry_plate_names(hierarchical_fit):
    _, idata = hierarchical_fit
    assert idata.posterior["theta"].dims == ("chain", "draw", "group")
    assert list(idata.posterior["theta"].coords["group"].values) == SCHOOLS  # coords= as in az.from_numpyro
    assert idata.posterior["mu"].dims == ("chain", "draw")
    assert idata.posterior.sizes["chain"] == 1 and idata.posterior.sizes["draw"] == 400
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "obs")
    assert idata.observed_data["y"].dims == ("obs",)
    assert idata.posterior_predictive["y"].dims == ("chain", "draw", "obs")


def test_summary_loo_and_plot_posterior_succeed(hierarchical_fit):
    result, idata = hierarchical_fit
    summary = az.summary(idata, kind="stats")
    assert "theta[school A]" in summary.index and "mu" in summary.index
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
    draws = jax.jit(predictive)(jax.random.key(3), X)
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


def test_summary_trace_plot_loo_compare_and_netcdf_with_coords_and_dims(hierarchical_fit, tmp_path):
    """The ArviZ workflow on a plated model, with user coords and dims."""
    result, _ = hierarchical_fit
    idata = result.to_arviz(
        jax.random.key(2), 300, coords={"school": SCHOOLS, "obs": np.arange(30) + 100}, dims={"theta": ["school"]}
    )
    assert idata.posterior["theta"].dims == ("chain", "draw", "school")
    assert list(idata.log_likelihood["y"].coords["obs"].values) == list(range(100, 130))
    summary = az.summary(idata, var_names=["mu", "theta"], kind="stats")
    assert "theta[school A]" in summary.index
    axes = az.plot_trace(idata, var_names=["mu", "theta"])
    assert np.shape(axes) == (2, 2)
    plt.close("all")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loo = az.loo(idata, pointwise=True)
        pooled = blrppl.VMP(pooled_model).run(jax.random.key(0), 50, y=_hierarchical_data()[1]["y"], progress_bar=False)
        comparison = az.compare({"hierarchical": idata, "pooled": pooled.to_arviz(jax.random.key(3), 300)})
    assert loo.loo_i.dims == ("obs",) and set(comparison.index) == {"hierarchical", "pooled"}
    path = tmp_path / "fit.nc"
    idata.to_netcdf(str(path))
    loaded = az.from_netcdf(str(path))
    assert set(loaded.groups()) == set(idata.groups())
    assert loaded.posterior["theta"].dims == ("chain", "draw", "school")
    np.testing.assert_array_equal(loaded.log_likelihood["y"].values, idata.log_likelihood["y"].values)
    assert list(loaded.posterior["theta"].coords["school"].values) == SCHOOLS


def pooled_model(*, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def _hierarchical_data():
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(NUM_GROUPS), 5)
    y = rng.normal(1.0, 1.0, NUM_GROUPS)[group] + 0.5 * rng.normal(size=group.size)
    return (jnp.asarray(group), NUM_GROUPS), {"y": jnp.asarray(y)}


def test_elbo_trace_has_its_own_dimension(hierarchical_fit):
    result, idata = hierarchical_fit
    elbo = idata.sample_stats["elbo"]
    assert elbo.dims == ("chain", "step") and elbo.sizes["step"] == len(result.elbo)
    np.testing.assert_allclose(elbo.values[0], result.elbo)
    assert list(elbo.coords["step"].values) == list(range(1, len(result.elbo) + 1))


def test_log_likelihood_opt_out_and_thinning(hierarchical_fit):
    result, idata = hierarchical_fit
    without = result.to_arviz(jax.random.key(1), 400, log_likelihood=False)
    assert "log_likelihood" not in without.groups() and "posterior" in without.groups()
    thinned = result.to_arviz(jax.random.key(1), 400, log_likelihood_thinning=4)
    assert thinned.log_likelihood.sizes["draw"] == 100
    np.testing.assert_array_equal(thinned.log_likelihood["y"].values, idata.log_likelihood["y"].values[:, ::4])
    np.testing.assert_array_equal(thinned.log_likelihood.coords["draw"].values, np.arange(0, 400, 4))
    with pytest.raises(ValueError, match="log_likelihood_thinning"):
        result.to_arviz(jax.random.key(1), 400, log_likelihood_thinning=0)


def em_model(*, y=None):
    """A Normal mean with a numpyro.param noise scale: EM's answer is the scale."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.param("sigma", 1.0, constraint=dist.constraints.positive)
    shifts = numpyro.param("shifts", jnp.zeros(2))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu + shifts[jnp.arange(y.shape[0]) % 2], sigma), obs=y)


@pytest.fixture(scope="module")
def em_fit():
    y = 2.0 + 0.5 * jax.random.normal(jax.random.key(5), (40,))
    return blrppl.EM(em_model).run(jax.random.key(0), 100, y=y, progress_bar=False, tol=1e-10)


def test_parameters_are_in_constant_data(em_fit):
    result = em_fit
    idata = result.to_arviz(jax.random.key(1), 100)
    data = idata.constant_data
    np.testing.assert_allclose(float(data["sigma"]), float(result.params["sigma"]))
    assert data["shifts"].dims == ("shifts_dim_0",)
    assert "numpyro.param" in data.attrs["description"]


def test_vector_event_dims_are_named():
    def regression(X, *, y=None):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("N", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ beta, 1.0), obs=y)

    X = jax.random.normal(jax.random.key(0), (20, 3))
    result = blrppl.VMP(regression).run(jax.random.key(1), 5, X, y=X @ jnp.ones(3), progress_bar=False)
    idata = result.to_arviz(jax.random.key(2), 50)
    assert idata.posterior["beta"].dims == ("chain", "draw", "beta_event")
    renamed = result.to_arviz(jax.random.key(2), 50, dims={"beta": ["covariate"]}, coords={"covariate": ["a", "b", "c"]})
    assert list(renamed.posterior["beta"].coords["covariate"].values) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="site 'beta'"):
        result.to_arviz(jax.random.key(2), 50, dims={"beta": ["a", "b"]})


T = 30


def local_level(num_steps=None, *, y=None):
    """A scan local level with known noise: its posterior is a chain Gaussian (one exact step)."""
    from numpyro.contrib.control_flow import scan

    level0 = numpyro.sample("level0", dist.Normal(0.0, 5.0))

    def transition(prev, y_t):
        level = numpyro.sample("level", dist.Normal(prev, 0.3))
        numpyro.sample("y", dist.Normal(level, 0.5), obs=y_t)
        return level, None

    scan(transition, level0, y, length=num_steps if y is None else y.shape[0])


def test_predictive_takes_get_samples_of_a_chain_model(rng_key):
    y = jnp.cumsum(0.3 * jax.random.normal(jax.random.key(7), (T,))) + 0.5 * jax.random.normal(jax.random.key(8), (T,))
    result = blrppl.ConjugateBayes(local_level).run(rng_key, 1, y=y, progress_bar=False)
    samples = result.get_samples(jax.random.key(1), 400)
    assert samples["level"].shape == (400, T) and samples["level0"].shape == (400,)  # the model's sites
    predictive = numpyro.infer.Predictive(local_level, posterior_samples=samples)
    draws = jax.jit(lambda key: predictive(key, num_steps=T))(jax.random.key(2))  # jitted, as numpyro advises
    assert draws["y"].shape == (400, T)
    z = (draws["y"].mean(0) - samples["level"].mean(0)) / (0.5 / np.sqrt(400))
    assert np.all(np.abs(z) < 5)  # y_t ~ Normal(level_t, 0.5) around the posterior draws
    log_lik = jax.jit(lambda s: numpyro.infer.log_likelihood(local_level, s, y=y))(samples)
    assert log_lik["y"].shape == (400, T)
    idata = result.to_arviz(jax.random.key(3), 400)  # the same number of draws: the sampler compiled once
    assert idata.posterior["level"].dims == ("chain", "draw", "time")
    assert idata.observed_data["y"].dims == ("time",) and idata.log_likelihood["y"].dims == ("chain", "draw", "time")


def test_print_summary_lists_every_site_and_the_parameters(em_fit, capsys):
    em_fit.print_summary(num_samples=100)
    out = capsys.readouterr().out
    for text in ("mean", "std", "median", "5.0%", "95.0%", "mu", "Point estimates", "sigma =", "shifts", "ELBO after"):
        assert text in out, text
