"""Integrated: exact conditionals integrated over hyperparameters, against brute-force quadrature.

The references (``integrated_references.py``) integrate the hyperparameter on a
dense grid of its log with everything else Gaussian algebra in numpy, so they
are exact to ~1e-9; NUTS would carry Monte Carlo error of the size of the bars.
The issue's bars are 0.05 reference sd for means, 5% for sds and 1e-6 for
log p(y); the engine's measured errors are ~1e-5 of an sd and ~1e-7 in log p(y),
so the tests hold it to 1e-3 (moments) and 1e-6 (log p(y)).

Compiled fits are shared by module-scoped fixtures: one engine per model.
"""

import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive

import blrppl
from blrppl.blr.integrate import Diagnostics
from blrppl.blr.integrate.hyper import choose_hyper
from blrppl.blr.integrate.options import make_integrated_config
from blrppl.errors import IntegrationWarning
from models import eight_schools_centered as centred
from models import eight_schools_noncentered as noncentred
from models import hierarchical_logistic, linear_regression, nile
from tests.compiles import compilations
from tests.engines import integrated_references as references

MOMENT_TOL = 1e-3  # of a reference sd (means) and relative (sds); the issue asks 0.05 and 5%
EVIDENCE_TOL = 1e-6  # absolute, on log p(y)
NUM_DRAWS = 2000
MODELS = {"centred": centred, "noncentred": noncentred}


@pytest.fixture(scope="module")
def schools_reference():
    return references.eight_schools(centred.Y, centred.SIGMA)


@pytest.fixture(scope="module")
def schools():
    """Engine and result per parameterisation (each compiles its conditional fit once)."""
    out = {}
    for name, module in MODELS.items():
        engine = blrppl.Integrated(module.model)
        args, kwargs = module.data()
        out[name] = engine, engine.run(jax.random.key(0), 20, *args, **kwargs)
    return out


def assert_moments(posterior, reference, sites):
    for site in sites:
        mean, sd = reference.hyper.get(site) or reference.latent[site]
        np.testing.assert_array_less(np.abs(np.asarray(posterior[site].mean) - mean) / sd, MOMENT_TOL, err_msg=site)
        fitted_sd = np.sqrt(np.asarray(posterior[site].variance))
        np.testing.assert_array_less(np.abs(fitted_sd / sd - 1.0), MOMENT_TOL, err_msg=site)


@pytest.mark.parametrize("name", list(MODELS))
def test_eight_schools_log_marginal_likelihood_is_the_quadrature(schools, schools_reference, name):
    result = schools[name][1]
    assert abs(result.log_marginal_likelihood - schools_reference.log_evidence) < EVIDENCE_TOL


@pytest.mark.parametrize("name", list(MODELS))
def test_eight_schools_moments_are_the_quadrature(schools, schools_reference, name):
    result = schools[name][1]
    sites = ("mu", "tau", "theta") if name == "centred" else ("mu", "tau")
    assert_moments(result.posterior, schools_reference, sites)
    if name == "centred":  # theta's mixture covariance: within-node (joint block) plus between-node parts
        theta = result.posterior["theta"]
        assert theta.event_shape == (8,) and theta.covariance_matrix.shape == (8, 8)
        np.testing.assert_allclose(np.diag(theta.covariance_matrix), theta.variance, rtol=1e-10)
        reference = schools_reference.latent_covariance(slice(1, None))
        scale = np.sqrt(np.outer(np.diag(reference), np.diag(reference)))
        np.testing.assert_array_less(np.abs(np.asarray(theta.covariance_matrix) - reference) / scale, MOMENT_TOL)


def test_noncentred_theta_from_joint_draws_has_the_posterior_spread(schools, schools_reference):
    """theta = mu + tau theta_raw mixes h and c: joint draws (node, then c | h) give its spread."""
    num = NUM_DRAWS
    draws = schools["noncentred"][1].sample(jax.random.key(1), num)
    mean, sd = schools_reference.latent["theta"]
    assert draws["theta"].shape == (num, 8) and draws["tau"].shape == (num,)
    # 4 Monte Carlo standard errors: sd / sqrt(n) for the mean, ~sd / sqrt(2n) for the sd.
    np.testing.assert_array_less(np.abs(draws["theta"].mean(0) - mean) / sd, 4.0 / np.sqrt(num))
    np.testing.assert_array_less(np.abs(draws["theta"].std(0) / sd - 1.0), 4.0 / np.sqrt(2 * num))


def test_eight_schools_chooses_tau_and_reports_the_search(schools):
    for name in MODELS:
        result = schools[name][1]
        assert result.hyper == ("tau",) and result.inner == "exact"
        assert result.diagnostics.ok, result.diagnostics.problems
        assert set(result.estimators.values()) <= {"exact", "delta"}
        elbo = np.asarray(result.elbo)
        assert elbo.shape == (result.fit.mode.num_steps,) and np.all(np.diff(elbo) >= -1e-9)
        assert "exact" in result.method
        assert result.flags == () and result.converged and "converged" in result.converged.reason


def test_the_common_run_signature_is_accepted(schools):
    """``tol`` as for every engine (was passed on to the model as a keyword it does not take);
    ``init_state`` and ``num_restarts`` have no meaning here and say so."""
    engine, _ = schools["centred"]
    args, kwargs = centred.data()
    result = engine.run(jax.random.key(0), 50, *args, progress_bar=False, tol=1e-8, **kwargs)
    assert result.converged and result.flags == ()
    with pytest.raises(ValueError, match="takes no num_restarts"):
        engine.run(jax.random.key(0), 50, *args, num_restarts=2, **kwargs)


def test_hyper_named_by_the_user_is_the_automatic_choice():
    args, kwargs = centred.data()
    auto, plan = choose_hyper(centred.model, args, kwargs, make_integrated_config())
    named, named_plan = choose_hyper(centred.model, args, kwargs, make_integrated_config(hyper=["tau"]))
    assert auto.sites == named.sites == ("tau",) and named.inner == "exact"
    assert named_plan.signature == plan.signature and "mu+theta" in plan.qs


def test_log_prob_of_the_mixture_and_of_h(schools, schools_reference):
    posterior = schools["centred"][1].posterior
    mu = np.linspace(-5.0, 15.0, 5)
    np.testing.assert_allclose(posterior["mu"].log_prob(jnp.asarray(mu)), schools_reference.latent_log_density(0, mu), atol=1e-6)
    tau = np.array([0.5, 2.0, 5.0, 12.0])
    np.testing.assert_allclose(posterior["tau"].log_prob(jnp.asarray(tau)), schools_reference.hyper_log_density(tau), atol=1e-5)


def test_new_data_of_the_same_shapes_reuse_the_compiled_fit(schools):
    engine = schools["centred"][0]
    y = centred.Y * 1.5 + 2.0
    result = engine.run(jax.random.key(0), 20, centred.SIGMA, y=y)
    reference = references.eight_schools(y, centred.SIGMA)
    assert abs(result.log_marginal_likelihood - reference.log_evidence) < EVIDENCE_TOL
    assert_moments(result.posterior, reference, ("mu", "tau", "theta"))
    compiled = [k for k in engine._conditionals if k[:1] != ("plan",)]
    assert len(compiled) == 2  # one compiled conditional fit and one choice of h (plus plans by data digest)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_new_data_of_the_same_shapes_compile_nothing(schools, name):
    """Grid node counts change with the data; they stay on the host (or padded to a bucket), so
    a fit and its posterior moments on new data run programs compiled for the first data."""
    engine = schools[name][0]
    # A first fit on new data compiles the re-planning path's few shape-free programs (once per
    # process); the second, whose grid has other node counts, must compile nothing.
    warm = engine.run(jax.random.key(0), 20, centred.SIGMA, y=np.asarray(centred.Y) * 0.7 - 1.0)
    jax.block_until_ready((warm.posterior["mu"].mean, warm.posterior["tau"].variance))
    y = np.asarray(centred.Y) * 1.6 + 3.0  # numpy: no device op of our own in the count
    with compilations() as compiled:
        result = engine.run(jax.random.key(0), 20, centred.SIGMA, y=y)
        posterior = result.posterior
        jax.block_until_ready((posterior["mu"].mean, posterior["tau"].variance))
    assert result.fit.grid.num_evaluated != warm.fit.grid.num_evaluated  # the test bites
    assert compiled == []


def test_draws_arviz_and_predictive(schools):
    engine, result = schools["noncentred"]
    draws = result.sample(jax.random.key(2), NUM_DRAWS)  # one compiled sampler for the module
    n = NUM_DRAWS
    assert {k: v.shape for k, v in draws.items()} == {"mu": (n,), "tau": (n,), "theta_raw": (n, 8), "theta": (n, 8)}
    idata = result.to_arviz(jax.random.key(3), num_samples=NUM_DRAWS)
    assert idata.posterior["theta"].shape == (1, n, 8) and "y" in idata.log_likelihood
    predictive = Predictive(noncentred.model, guide=engine.guide(result), num_samples=7)
    samples = predictive(jax.random.key(4), centred.SIGMA)
    assert samples["y"].shape == (7, 8) and samples["theta"].shape == (7, 8)


def test_an_untrustworthy_grid_warns_and_says_why(schools):
    engine = schools["centred"][0]
    capped = blrppl.Integrated(centred.model, max_nodes=5)
    capped._conditionals = engine._conditionals  # share the compiled fit (test budget)
    args, kwargs = centred.data()
    with pytest.warns(IntegrationWarning, match="cut off"):
        result = capped.run(jax.random.key(0), 20, *args, **kwargs)
    assert not result.trustworthy and any("cut off" in p for p in result.diagnostics.problems)


def test_diagnostics_name_each_problem():
    fine = Diagnostics(True, True, 0.0, 1, 0.0, False, True)
    assert fine.ok and fine.problems == []
    bad = Diagnostics(False, False, 0.1, 2, 3.0, True, False, experimental=True, num_non_finite=3, unsettled_weight=0.02, num_unsettled=4)
    text = " ".join(bad.problems)
    words_each = ("did not converge", "not negative definite", "edge", "cut off", "2 local maxima", "above the mode", "4 grid nodes, carrying 0.02",
                  "not finite at 3", "Laplace approximations")
    assert len(bad.problems) == len(words_each)
    for words in words_each:
        assert words in text


def test_linear_regression_noise_scale_is_the_quadrature():
    args, kwargs = linear_regression.data()
    reference = references.linear_regression(args[0], kwargs["y"])
    result = blrppl.Integrated(linear_regression.noise_scale_model).run(jax.random.key(0), 20, *args, **kwargs)
    assert result.hyper == ("sigma",) and result.inner == "exact" and result.diagnostics.ok
    assert abs(result.log_marginal_likelihood - reference.log_evidence) < EVIDENCE_TOL
    assert_moments(result.posterior, reference, ("alpha", "beta", "sigma"))


def scales_per_school(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("J", sigma.shape[0]):
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def with_a_param(sigma, y=None):
    tau = numpyro.param("tau", 1.0, constraint=dist.constraints.positive)
    with numpyro.plate("J", sigma.shape[0]):
        numpyro.sample("y", dist.Normal(numpyro.sample("theta", dist.Normal(0.0, tau)), sigma), obs=y)


@pytest.mark.parametrize(
    "model, options, words",
    [
        (scales_per_school, {}, ["'tau'", "8 dimensions", "NonConjugateVI"]),
        (centred.model, {"hyper": ["mu", "tau", "theta"]}, ["'mu'", "10 dimensions", "NonConjugateVI"]),
        (centred.model, {"hyper": ["nope"]}, ["'nope'", "not a latent"]),
        (with_a_param, {}, ["'tau'", "numpyro.param", "EM"]),
    ],
    ids=["scales-per-school", "hyper-too-large", "unknown-site", "param-site"],
)
def test_model_errors_name_the_site_and_the_remedy(model, options, words):
    args, kwargs = centred.data()
    with pytest.raises(blrppl.ModelError) as error:
        blrppl.Integrated(model, **options).run(jax.random.key(0), 5, *args, **kwargs)
    for word in words:
        assert word in str(error.value)



def test_nile_with_both_scales_unknown_is_the_quadrature():
    """Two hyperparameters (half-normal sds) over exact Kalman smoothers: a 2-D grid."""
    args, kwargs = nile.data()
    log_evidence, moments = references.local_level(kwargs["y"], 200.0, 100.0, nile.INITIAL_MEAN, nile.INITIAL_SD)
    result = blrppl.Integrated(nile.scales_model).run(jax.random.key(0), 30, *args, **kwargs)
    assert result.hyper == ("obs_sd", "level_sd") and result.inner == "exact" and result.diagnostics.ok
    assert abs(result.log_marginal_likelihood - log_evidence) < EVIDENCE_TOL
    for site in ("obs_sd", "level_sd", "level"):
        mean, sd = moments[site]
        posterior = result.posterior[site]
        np.testing.assert_array_less(np.abs(np.asarray(posterior.mean) - mean) / sd, MOMENT_TOL, err_msg=site)
        np.testing.assert_array_less(np.abs(np.sqrt(np.asarray(posterior.variance)) / sd - 1.0), MOMENT_TOL, err_msg=site)


def test_stored_nile_reference_is_the_quadrature():
    """``tests/data/nile_reference.json`` (the Nile benchmark's exact reference: a finer, wider grid,
    ``level0`` and ``level`` as the model's sites) is this file's 2-D quadrature."""
    stored = json.loads((pathlib.Path(__file__).parents[1] / "data" / "nile_reference.json").read_text())
    args, kwargs = nile.data()
    log_evidence, moments = references.local_level(kwargs["y"], 200.0, 100.0, nile.INITIAL_MEAN, nile.INITIAL_SD)
    assert abs(stored["log_evidence"] - log_evidence) < EVIDENCE_TOL
    joined = {key: np.r_[stored[key]["level0"], stored[key]["level"]] for key in ("mean", "sd")}
    for site in ("obs_sd", "level_sd", "level"):
        mean, sd = moments[site]
        got_mean, got_sd = (joined[k] if site == "level" else stored[k][site] for k in ("mean", "sd"))
        np.testing.assert_array_less(np.abs(got_mean - mean) / sd, 1e-5, err_msg=site)  # measured 1.5e-7
        np.testing.assert_array_less(np.abs(got_sd / sd - 1.0), 1e-5, err_msg=site)  # measured 7e-7


def test_laplace_inner_fits_of_a_gaussian_conditional_give_the_exact_evidence(schools_reference):
    """Given tau the centred schools are Gaussian, so Laplace is exact there. The delta ELBO was
    log f(m) + entropy, whose guard stalled the inner Newton steps: log p(y) came out as 4.3e9."""
    args, kwargs = centred.data()
    with pytest.warns(IntegrationWarning, match="not yet validated"):
        result = blrppl.Integrated(centred.model, inner="laplace").run(jax.random.key(0), 20, *args, **kwargs)
    assert result.fit.choice.inner == "laplace"
    assert abs(result.log_marginal_likelihood - schools_reference.log_evidence) < EVIDENCE_TOL


def test_no_exact_conditional_is_a_model_error_that_names_the_alternatives():
    """A logistic likelihood: no small h makes the rest conjugate (Laplace inner fits only on request)."""
    args, kwargs = hierarchical_logistic.data()
    with pytest.raises(blrppl.ModelError) as error:
        blrppl.Integrated(hierarchical_logistic.model).run(jax.random.key(0), 5, *args, **kwargs)
    for word in ("'sigma'", "cannot be exact", "inner='laplace'", "NonConjugateVI"):
        assert word in str(error.value)


def test_the_same_data_reuse_the_plan(schools):
    engine, first = schools["centred"]
    args, kwargs = centred.data()
    again = engine.run(jax.random.key(0), 20, *args, **kwargs)
    assert again.fit.plan is first.fit.plan  # no tracing or symbolic analysis on the host the second time
    np.testing.assert_allclose(again.log_marginal_likelihood, first.log_marginal_likelihood, rtol=1e-12)


def test_hierarchical_logistic_with_variational_inner_fits_matches_nuts():
    """INLA with variational inner fits: sigma on a grid, one full Gaussian over (mu, alpha, beta) given
    sigma by non-conjugate VI (Gauss-Hermite on each linear predictor). Against NUTS
    (tests/data/hierarchical_logistic_reference.json, 4 x 5000 draws): the issue's bar is 0.1 sd / 15%;
    measured 0.021 sd / 1.9%. Laplace inner fits miss beta's mean by 0.24 sd (the mode is not the mean)."""
    import json
    import pathlib

    reference = json.loads((pathlib.Path(__file__).parents[1] / "data" / "hierarchical_logistic_reference.json").read_text())
    args, kwargs = hierarchical_logistic.data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", IntegrationWarning)  # a far-tail node's unsettled fit is no reason to warn
        result = blrppl.Integrated(hierarchical_logistic.model, inner="vi").run(jax.random.key(0), 30, *args, **kwargs)
    assert result.fit.choice.inner == "vi" and not result.diagnostics.experimental
    d = result.diagnostics
    assert d.converged and d.hessian_definite and d.num_modes == 1 and d.edge_weight < 1e-6
    assert d.ok and d.unsettled_weight < 1e-6  # measured: 1 of ~30 nodes unsettled, at log weight -16
    for site in ("mu", "sigma", "alpha", "beta"):
        mean, sd = np.asarray(result.posterior[site].mean), np.sqrt(np.asarray(result.posterior[site].variance))
        ref_mean, ref_sd = np.asarray(reference["mean"][site]), np.asarray(reference["sd"][site])
        np.testing.assert_array_less(np.abs(mean - ref_mean) / ref_sd, 0.05, err_msg=site)
        np.testing.assert_array_less(np.abs(sd / ref_sd - 1.0), 0.05, err_msg=site)
