"""A full Gaussian block with Monte Carlo site parameters starts from a Newton step, and an
average of Monte Carlo iterates that an early iterate dominates is flagged.

A non-centred Poisson hierarchy, ``y ~ Poisson(exp(mu + sd * eff[g]))``: ``blrppl.choose``
fits it with one full Gaussian over (mu, log sd, eff) and a Monte Carlo estimate of the
likelihood (the product sd * eff is no linear predictor). From the prior, E_q[exp(sd * eff)]
is astronomically large (it is infinite for any Gaussian q on log sd), the first step's
precision for mu and log sd was 1e22-1e25, and the reported average of the iterates stayed
pinned at the start (mu = 0 and sd = 1, sds of 1e-4) with no flag, while NUTS gives
mu = 0.59 +- 0.15 and sd = 0.23 +- 0.18.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl

GROUPS = np.repeat(np.arange(6), 10)
_rng = np.random.default_rng(1)
COUNTS = _rng.poisson(np.exp(0.5 + 0.3 * _rng.normal(size=6))[GROUPS])
NUTS_MU, NUTS_SD = (0.59, 0.146), (0.231, 0.18)
"""NumPyro NUTS on these data (4,000 draws after 1,000 warm-up, target_accept_prob 0.95, no divergences)."""


def poisson_hierarchy(g, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sd = numpyro.sample("sd", dist.HalfNormal(1.0))
    with numpyro.plate("grp", 6):
        eff = numpyro.sample("eff", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", g.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(mu + sd * eff[g])), obs=y)


@pytest.fixture(scope="module")
def joint_plan():
    engine = blrppl.NonConjugateVI(poisson_hierarchy, blocks="all")
    return engine, engine.plan(GROUPS, y=COUNTS)


def summary(result):
    draws = result.sample(jax.random.key(2), 4000)
    return {v: (float(np.mean(draws[v])), float(np.std(draws[v]))) for v in ("mu", "sd")}


def test_the_joint_block_starts_from_a_newton_step_and_finds_the_posterior(joint_plan, rng_key):
    engine, plan = joint_plan
    assert "y" in {e.factor for e in plan.estimators if e.method.estimator == "mc"}
    assert plan.start_estimators  # the delta-method start
    result = engine.fit(plan, rng_key, 600, progress_bar=False)
    moments = summary(result)
    assert abs(moments["mu"][0] - NUTS_MU[0]) < 0.25 * NUTS_MU[1]
    assert 0.5 * NUTS_MU[1] < moments["mu"][1] < 1.5 * NUTS_MU[1]  # not collapsed
    assert abs(moments["sd"][0] - NUTS_SD[0]) < 0.5 * NUTS_SD[1]
    assert not any("average" in flag for flag in result.flags)


def test_an_average_pinned_by_an_early_iterate_is_flagged(joint_plan, rng_key):
    """The same fit from the prior (the plan without its Newton start): the average is no answer."""
    engine, plan = joint_plan
    result = engine.fit(dataclasses.replace(plan, start_estimators=()), rng_key, 600, progress_bar=False)
    assert summary(result)["mu"][1] < 1e-2  # pinned where the first step put it
    assert any("early iterates dominate the average" in flag for flag in result.flags)


def test_a_converged_cubature_block_is_not_flagged_as_stalled(rng_key):
    """A robust regression (Student-t likelihood, HalfCauchy scale, Gamma degrees of freedom), as
    ``choose`` fits it: one full Gaussian with cubature, converged in 10 steps with NUTS's means.
    Its last full step lowered the ELBO by 5e-6 nats and every halving by less; that is no stall."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=50)
    y = 1.0 + 2.0 * x + rng.standard_t(3, size=50)

    def robust(x, y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 10.0))
        b = numpyro.sample("b", dist.Normal(0.0, 10.0))
        s = numpyro.sample("s", dist.HalfCauchy(2.0))
        nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.StudentT(nu, a + b * x, s), obs=y)

    result = blrppl.NonConjugateVI(robust, blocks="all").run(rng_key, 200, x, y=y, progress_bar=False, tol=1e-6)
    assert result.converged and not result.converged.monte_carlo
    assert result.flags == ()
    draws = result.sample(jax.random.key(2), 4000)
    # NumPyro NUTS on these data: a 0.644 +- 0.177, b 2.095 +- 0.198, s 1.151 +- 0.144.
    for site, (mean, sd) in {"a": (0.644, 0.177), "b": (2.095, 0.198), "s": (1.151, 0.144)}.items():
        assert abs(float(np.mean(draws[site])) - mean) < 0.25 * sd, site
