"""Importance weights flag a joint Gaussian fit whose spread is too small (blrppl.importance_spread)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.stats import norm

import blrppl
from blrppl import importance_spread
from blrppl.importance_spread import UNDERSTATED_SD, checked_sites, understated, weighted_spread

Y = jnp.array([28.0, 8, -3, 7, -1, 1, 18, 12])
SIGMA = jnp.array([15.0, 10, 16, 11, 9, 11, 10, 18])


def centred_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def gamma_glm(x, y=None):
    """A Gamma GLM with a latent shape: its posterior is close to Gaussian on q's space (NUTS's
    standard deviations within 5% of the joint fit's)."""
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    shape = numpyro.sample("shape", dist.Gamma(1.0, 0.1))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("y", dist.Gamma(shape, shape / jnp.exp(a + b * x)), obs=y)


def _gamma_data():
    rng = np.random.default_rng(24)
    x = rng.normal(size=40)
    y = rng.gamma(3.0, np.exp(0.7 + 0.4 * x) / 3.0)
    return jnp.asarray(x), jnp.asarray(y)


def test_equal_weights_read_a_ratio_of_one():
    x = np.random.default_rng(0).normal(size=(500, 3))
    ratios, ess = weighted_spread(np.zeros(500), {"x": x})
    np.testing.assert_allclose(ratios, [1.0], rtol=1e-12)
    np.testing.assert_allclose(ess, 500.0, rtol=1e-12)


def test_weights_toward_a_wider_target_read_a_ratio_between_one_and_its_factor():
    """Draws from N(0, 1) weighted toward N(0, 2²): the truncated weights' sd is below 2 (a lower
    bound), well above 1."""
    x = np.random.default_rng(1).normal(size=4000)
    log_ratio = np.asarray(norm.logpdf(x, 0.0, 2.0) - norm.logpdf(x, 0.0, 1.0))
    (ratio,), ess = weighted_spread(log_ratio, {"x": x})
    assert 1.4 < ratio < 2.0
    assert ess < 4000


def test_points_and_lost_draws_are_no_evidence():
    """A site whose draws do not vary reads 0; draws whose log ratio is NaN weigh nothing."""
    x = np.random.default_rng(2).normal(size=200)
    log_ratio = np.where(np.arange(200) < 100, np.nan, 0.0)
    ratios, ess = weighted_spread(log_ratio, {"point": np.full((200, 2), 3.0), "x": x})
    assert ratios[0] == 0.0
    np.testing.assert_allclose(ratios[1], np.std(x[100:]) / np.std(x), rtol=1e-10)
    np.testing.assert_allclose(ess, 100.0, rtol=1e-10)
    assert weighted_spread(np.full(200, np.nan), {"x": x}) == ([0.0], 0.0)


def test_centred_eight_schools_joint_fit_is_flagged():
    """One full Gaussian over (mu, log tau, theta) puts tau's sd at a third of NUTS's, converged:
    the flag names tau."""
    result = blrppl.NonConjugateVI(centred_schools, blocks="all").run(
        jax.random.key(0), 30, SIGMA, y=Y, progress_bar=False, tol=1e-8
    )
    assert understated(result)
    (flag,) = [f for f in result.flags if f.startswith(importance_spread.FLAG)]
    assert "'tau'" in flag and "Integrated" in flag


def test_a_near_gaussian_joint_fit_is_not_flagged():
    x, y = _gamma_data()
    result = blrppl.NonConjugateVI(gamma_glm, blocks="all").run(
        jax.random.key(0), 100, x, y=y, progress_bar=False, tol=1e-8
    )
    assert checked_sites(result.plan) == ("a", "b", "shape")
    found = importance_spread.dispatch(result.plan, result.state.natural, result.state.params).read()
    assert max(found.ratio.values()) < 1.1 < UNDERSTATED_SD
    assert not understated(result)


@pytest.mark.parametrize("engine", ["mean_field", "exact_joint"])
def test_only_estimated_joint_blocks_are_checked(engine):
    """Mean-field q is linear response's to check; a joint block whose factors are all exact
    (a conjugate regression's coefficients) is the posterior's own conditional."""
    if engine == "mean_field":
        plan = blrppl.NonConjugateVI(centred_schools).plan(SIGMA, y=Y)
    else:
        def regression(x, y=None):
            alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
            beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
            with numpyro.plate("N", x.shape[0]):
                numpyro.sample("y", dist.Normal(alpha + beta * x, 1.0), obs=y)

        x, y = _gamma_data()
        plan = blrppl.VMP(regression, blocks="gaussian").plan(x, y=y)
        assert any(q.joint for q in plan.qs.values())
    assert checked_sites(plan) == ()


def test_a_clear_first_thousand_draws_end_the_check_and_an_unclear_draw_more(monkeypatch):
    """A near-Gaussian fit reads 1,000 draws; the funnel's 4,000; past MAX_FLOPS no check is made."""
    x, y = _gamma_data()
    result = blrppl.NonConjugateVI(gamma_glm, blocks="all").run(jax.random.key(0), 100, x, y=y, progress_bar=False, tol=1e-8)
    found = importance_spread.dispatch(result.plan, result.state.natural, result.state.params).read()
    assert found.num_samples == importance_spread.CHUNK
    funnel = blrppl.NonConjugateVI(centred_schools, blocks="all").run(
        jax.random.key(0), 30, SIGMA, y=Y, progress_bar=False, tol=1e-8
    )
    found = importance_spread.dispatch(funnel.plan, funnel.state.natural, funnel.state.params).read()
    assert found.num_samples == importance_spread.NUM_SAMPLES and found.ratio["tau"] >= UNDERSTATED_SD
    args = (importance_spread.natural_shapes(result.plan), dict(result.plan.arrays.params), result.plan.arrays.data)
    sites = checked_sites(result.plan)
    assert importance_spread.affordable(result.plan, sites, args)
    monkeypatch.setattr(importance_spread, "MAX_FLOPS", 1.0)
    assert not importance_spread.affordable(result.plan, sites, args)


def test_weights_on_a_few_draws_are_a_flag_whatever_the_ratios():
    """A draw where the density is infinite outweighs the others: the weighted spread of one draw
    is 0, no evidence by ratio, but an effective sample size of 1 says q misses the posterior."""
    x = np.random.default_rng(3).normal(size=4000)
    log_ratio = np.where(np.abs(x) == np.max(np.abs(x)), np.inf, 0.0)
    ratios, ess = weighted_spread(log_ratio, {"x": x})
    assert ratios[0] < 0.1 and ess < 1.01
    (flag,) = importance_spread.understated_spread_flag(importance_spread.Weighted({"x": ratios[0]}, ess, 4000))
    assert flag.startswith(importance_spread.FLAG) and "concentrate on 1 of them" in flag
    assert importance_spread.understated_spread_flag(importance_spread.Weighted({"x": 1.1}, 300.0, 4000)) == ()


FLOAT32_SCHOOLS = """
import json, jax, blrppl
from blrppl import importance_spread
from tests.test_importance_spread import SIGMA, Y, centred_schools
funnel = blrppl.NonConjugateVI(centred_schools, blocks="all").run(jax.random.key(0), 30, SIGMA, y=Y, progress_bar=False, tol=1e-6)
read = importance_spread.dispatch(funnel.plan, funnel.state.natural, funnel.state.params).read()
print(json.dumps({"dtype": str(funnel.elbo.dtype), "ratio": read.ratio, "flagged": importance_spread.understated(funnel)}))
"""


def test_the_check_reads_the_same_in_float32():
    """Float32's draws flag the funnel's tau too, and leave its mean (not in the funnel) alone."""
    from tests.float32 import run_in_float32

    out = json.loads(run_in_float32(FLOAT32_SCHOOLS).strip().splitlines()[-1])
    assert out["dtype"] == "float32" and out["flagged"]
    assert out["ratio"]["tau"] >= UNDERSTATED_SD > out["ratio"]["mu"]
