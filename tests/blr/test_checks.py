"""The steady-climb flag, and the error for a collapsed q whose ELBO is numerical noise."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.checks import erratic, improper_posterior_error, steady_climb, unbounded_elbo_error
from blrppl.families import normal


def test_a_linear_climb_is_flagged_and_a_geometric_convergence_is_not():
    steps = np.arange(200.0)
    assert "still rising steadily" in steady_climb(-500.0 + 0.4 * steps, stopped=False)[0]
    assert steady_climb(-500.0 + 40.0 * (1.0 - 0.9**steps), stopped=False) == ()


def test_stopped_short_and_noisy_runs_are_not_flagged():
    steps = np.arange(200.0)
    assert steady_climb(-500.0 + 0.4 * steps, stopped=True) == ()
    assert steady_climb(-500.0 + 0.4 * steps[:30], stopped=False) == ()
    noisy = -500.0 + np.random.default_rng(0).normal(0.0, 1.0, 200)
    assert steady_climb(noisy, stopped=False) == ()
    assert steady_climb(-500.0 + 1e-4 * steps, stopped=False) == ()  # under a nat: a plateau


def test_a_converged_fit_carries_no_flag(rng_key):
    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = jax.random.normal(jax.random.key(1), (20,)) + 1.0
    result = blrppl.VMP(model).run(rng_key, 50, y=y, progress_bar=False)
    assert result.flags == () and jnp.isfinite(result.elbo[-1])


def test_a_collapsed_q_with_an_erratic_elbo_is_an_improper_posterior():
    """A collapsed fit's ELBO is rounding noise (it jumped to 1e8 and fell back): an error,
    naming the scale that ran off towards zero, whatever the trace's final value."""
    from types import SimpleNamespace

    family = SimpleNamespace(gaussian=True, chain=False)
    qs = {"mu": SimpleNamespace(family=family, transform=None), "sigma": SimpleNamespace(family=family, transform="log")}
    natural = {
        "mu": normal.NormalStats(x=np.array(2.0 * 5e23), x_sq=np.array(-0.5 * 5e23)),  # sd 1e-12
        "sigma": normal.NormalStats(x=np.array(-26.0 * 2e7), x_sq=np.array(-0.5 * 2e7)),  # log sigma = -26
    }
    trace = np.array([-38.6, -38.0, 8.0e7, 1.3e8, -36.5, -36.0, 6.7e7, -34.1])
    assert erratic(trace) and not erratic(-500.0 + 40.0 * (1.0 - 0.9 ** np.arange(50.0)))
    error = improper_posterior_error(qs, natural, trace)
    assert error is not None and "site 'sigma'" in str(error) and "improper" in str(error)
    assert improper_posterior_error(qs, natural, -40.0 + 0.01 * np.arange(8.0)) is None  # smooth: a tiny sd is allowed


def test_an_elbo_that_reached_past_any_model_is_a_divergence_wherever_it_ended():
    """A collapsing q whose ELBO climbed past 1e30 and ended below it (a guard rejected every later
    step; where is rounding: single and batched fits ended at 2e28 and at inf) is an error."""
    from types import SimpleNamespace

    family = SimpleNamespace(gaussian=True, chain=False)
    qs = {"mu": SimpleNamespace(family=family, transform=None), "sigma": SimpleNamespace(family=family, transform="log")}
    natural = {
        "mu": normal.NormalStats(x=np.array(2.0 * 5e23), x_sq=np.array(-0.5 * 5e23)),
        "sigma": normal.NormalStats(x=np.array(-50.0 * 1e20), x_sq=np.array(-0.5 * 1e20)),
    }
    trace = np.concatenate([np.geomspace(1e2, 2.5e30, 40), np.full(60, 1.98e28)])
    assert not erratic(trace)
    error = improper_posterior_error(qs, natural, trace)
    assert error is not None and "site 'sigma'" in str(error) and "grows without bound" in str(error)


def test_a_collapsing_q_whose_elbo_fell_before_it_was_not_finite_is_a_divergence_not_an_improper_posterior():
    """UCBadmit with blocks="all" on counts one higher: the first Monte Carlo step from the Laplace
    start fell to -1e4, then -5e70, then nan, as q collapsed (reported as an improper posterior before)."""
    from types import SimpleNamespace

    family = SimpleNamespace(gaussian=True, chain=False)
    qs = {"mu": SimpleNamespace(family=family, transform=None), "sigma": SimpleNamespace(family=family, transform="log")}
    natural = {
        "mu": normal.NormalStats(x=np.array(2.0 * 5e23), x_sq=np.array(-0.5 * 5e23)),
        "sigma": normal.NormalStats(x=np.array(-50.0 * 1e20), x_sq=np.array(-0.5 * 1e20)),
    }
    trace = np.concatenate([[-1.04e4, -5.2e70, -5.2e70], np.full(20, np.nan)])
    error = improper_posterior_error(qs, natural, trace)
    assert error is not None and "diverged" in str(error) and "improper" not in str(error).split("which")[0]
    rising = np.concatenate([-40.0 + np.geomspace(1.0, 1e20, 30), np.full(5, np.nan)])  # climbed until it overflowed
    assert "grows without bound" in str(improper_posterior_error(qs, natural, rising))


def test_an_elbo_that_ended_orders_of_magnitude_below_its_best_is_a_divergence():
    """UCBadmit's joint block by Monte Carlo (16 draws, key 1): the ELBO fell from -7.9e3 to -1.4e29
    in one step and stayed there, finite; the fit was returned with flags (sigma's mean 5e14)."""
    from types import SimpleNamespace

    family = SimpleNamespace(gaussian=True, chain=False)
    qs = {"mu": SimpleNamespace(family=family, transform=None)}
    natural = {"mu": normal.NormalStats(x=np.array(70.0 * 4.0), x_sq=np.array(-0.5 * 4.0))}  # sd 0.5: not collapsed
    trace = np.concatenate([[-7.9e3], np.full(50, -1.4e29)])
    error = improper_posterior_error(qs, natural, trace)
    assert error is not None and "diverged" in str(error) and "ended there" in str(error)
    rng = np.random.default_rng(0)
    noisy = -68.0 * (1.0 + 0.05 * rng.normal(size=200))  # a Monte Carlo fit's trace
    recovered = np.concatenate([[-100.0, -1e9], np.linspace(-1e5, -60.0, 20)])  # fell, then climbed back
    assert improper_posterior_error(qs, natural, noisy) is None
    assert improper_posterior_error(qs, natural, recovered) is None


def test_a_deterministic_run_that_ended_far_below_its_best_elbo_is_flagged():
    from blrppl.blr.checks import fell_from_best

    settled = np.array([-120.0, -101.0, -100.2, -100.0, -100.0004, -100.0])  # wobbles within rounding: fine
    assert fell_from_best({}, {}, settled) == ()
    fell = np.array([86.8, 169.8, 884.6, 163.7, 103.9])
    (flag,) = fell_from_best({}, {}, fell)
    assert "781 below the best" in flag and "step 3" in flag and "not at an optimum" in flag


def test_a_q_centred_at_the_lower_boundary_is_flagged_whatever_the_elbo():
    from blrppl.blr.checks import vanishing_sites
    from blrppl.families.normal import NormalStats

    class Q:  # a Gaussian q of a positive site, on the log scale
        class family:
            gaussian, chain = True, False

        transform = object()

    def natural(loc, precision):
        return {"sigma": NormalStats(x=np.asarray(loc * precision), x_sq=np.asarray(-0.5 * precision))}

    assert "'sigma'" in vanishing_sites({"sigma": Q}, natural(-16.4, 2e9))[0]
    assert vanishing_sites({"sigma": Q}, natural(-3.0, 10.0)) == ()
    assert vanishing_sites({"sigma": Q}, natural(16.0, 10.0)) == ()  # large values: data in big units


def test_an_elbo_without_a_maximum_is_an_error_only_where_a_step_reported_it():
    # +inf is what a step reports for an exact coordinate update outside its family; a fit
    # with no such variable, or whose last step found a maximum, raises nothing here.
    assert unbounded_elbo_error(frozenset({"mu"}), np.array([-3.0, -2.5])) is None
    assert unbounded_elbo_error(frozenset(), np.array([-3.0, np.inf])) is None
    assert unbounded_elbo_error(frozenset({"mu"}), np.array([np.inf, -2.5])) is None
    error = unbounded_elbo_error(frozenset({"mu"}), np.array([-3.0, np.inf]))
    assert isinstance(error, blrppl.ModelError) and "site 'mu': the ELBO has no maximum" in str(error)
    assert "one of ['a', 'b']" in str(unbounded_elbo_error(frozenset({"b", "a"}), np.array([np.inf], np.float32)))


X_SEPARABLE = np.linspace(-2.0, 2.0, 20)
Y_SEPARABLE = (X_SEPARABLE > 0).astype(float)


def cancelled_prior_logistic(x, y=None):
    """A logistic regression whose prior a factor cancels: flat, on data that separate (improper)."""
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    numpyro.factor("flat", 0.5 * b**2)
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=b * x), obs=y)


@pytest.mark.parametrize("options", [{}, {"estimator": "mc"}, {"laplace": True}], ids=["cubature", "mc", "laplace"])
def test_an_elbo_that_is_rounding_noise_is_an_error(options, rng_key):
    """q runs off to a mean of 1e19 (or an sd of 1e36) where the prior and the factor, ±1e39, cancel:
    the ELBO reads 0, 32 or 84 and the run "converges". The fit must not be returned (Monte Carlo
    draws from so wide a q may also end it with an ELBO that is not finite: an error too)."""
    options = dict(options)
    engine = blrppl.Laplace if options.pop("laplace", False) else blrppl.NonConjugateVI
    message = "'b': the fit('s ELBO .* is rounding noise| ended with an ELBO that is not finite)"
    with pytest.raises(blrppl.ModelError, match=message):
        engine(cancelled_prior_logistic, **options).run(
            rng_key, 2000, X_SEPARABLE, y=Y_SEPARABLE, progress_bar=False, tol=1e-4 if options else 1e-6
        )


def test_a_batched_member_whose_elbo_is_noise_fails_alone(rng_key):
    """Of two data sets, the separable one fails with the error as its flag; the other is fitted."""
    mixed = np.where(np.arange(20) % 3 == 0, 1.0 - Y_SEPARABLE, Y_SEPARABLE)
    batch = blrppl.NonConjugateVI(cancelled_prior_logistic).run_batched(
        rng_key, 300, np.stack([X_SEPARABLE, X_SEPARABLE]), y=np.stack([Y_SEPARABLE, mixed]), tol=1e-6
    )
    assert "rounding noise" in " ".join(batch[0].flags)
    assert not any("rounding noise" in f or "failed" in f for f in batch[1].flags)


def test_a_proper_fit_knows_the_size_of_its_elbo_terms_and_is_not_doubted(rng_key):
    def model(x, y=None):
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=b * x), obs=y)

    result = blrppl.NonConjugateVI(model).run(rng_key, 300, X_SEPARABLE, y=Y_SEPARABLE, progress_bar=False, tol=1e-6)
    assert result.state.elbo_scale is not None
    assert float(result.state.elbo_scale) >= abs(float(result.elbo[-1])) > 0


def test_an_em_fits_boundary_check_compiles_beside_the_fit_not_after_it(rng_key, monkeypatch):
    """The check of point estimates at a boundary of their support (its E-steps from moved
    estimates, one compiled program) is lowered with the fit's programs and compiled beside them
    (``driver.checked_run(after=...)``): a first call compiles nothing once the fit has run (an
    AR(1)'s first call 1.8 -> 1.5 s), and the flag is the same (tau's MLE is 0 here)."""
    from blrppl.engines import base
    from tests.compiles import compilations, compiled_names
    from tests.engines.test_em_joint import Y, eight_schools

    compiled_after = []
    checks = base.boundary_estimates

    def watched(*args, **kwargs):
        with compilations() as messages:
            out = checks(*args, **kwargs)
        compiled_after.extend(compiled_names(messages))
        return out

    monkeypatch.setattr(base, "boundary_estimates", watched)

    def model(y=None):  # a model of its own: no program compiled by other tests
        eight_schools(y)

    result = blrppl.EM(model).run(rng_key, 200, y=jnp.asarray(Y), progress_bar=False, tol=1e-13)
    assert compiled_after == []
    assert "'tau'" in result.flags[0] and "boundary" in result.flags[0]

    def mixture(y=None):  # discrete latents: restarts, the best one's check compiled beside them
        sigma = numpyro.param("sigma", 1.0, constraint=dist.constraints.positive)
        loc = numpyro.param("loc", jnp.array([-1.0, 1.0]))
        with numpyro.plate("N", 12):
            z = numpyro.sample("z", dist.Categorical(probs=jnp.array([0.5, 0.5])))
            numpyro.sample("y", dist.Normal(loc[z], sigma), obs=y)

    data = jnp.asarray(np.concatenate([np.full(6, -2.0), np.full(6, 2.0)]) + np.linspace(-0.3, 0.3, 12))
    result = blrppl.EM(mixture).run(rng_key, 100, y=data, progress_bar=False, tol=1e-10)
    assert result.restarts is not None and compiled_after == []
