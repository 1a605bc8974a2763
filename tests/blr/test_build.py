"""The built step's tracing: each estimator's and the ELBO's Python code runs once per shapes."""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl

CALLS = []


def counted_schools(sigma, y=None):
    """Eight schools, centred, counting how often its Python code runs."""
    CALLS.append(1)
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def test_a_step_traced_again_runs_no_model_code_and_the_fit_is_unchanged(rng_key):
    engine = blrppl.NonConjugateVI(counted_schools)
    plan = engine.plan(SIGMA, y=Y)
    algorithm = engine.build(plan)
    CALLS.clear()
    state = jax.jit(algorithm.init)(rng_key, plan.arrays)  # compiled, as the driver runs it
    first = jax.make_jaxpr(algorithm.step)(state, plan.arrays)
    # A coordinate-wise step estimates the theta factor once per variable it touches
    # (mu, tau, theta): traced once, reused twice; the start's ELBO and the step's site
    # parameters call the same jitted estimators, so the start's traces serve the step.
    assert 0 < len(CALLS)
    CALLS.clear()
    again = jax.make_jaxpr(algorithm.step)(state, plan.arrays)  # e.g. the loop after the start
    assert CALLS == []
    assert len(again.eqns) == len(first.eqns)
    # The cached traces are the same program: the compiled step equals the step run eagerly.
    np.testing.assert_allclose(
        jax.jit(algorithm.step)(state, plan.arrays)[1].elbo, algorithm.step(state, plan.arrays)[1].elbo, rtol=1e-12
    )


def test_a_newton_start_judged_by_the_mode_never_evaluates_the_delta_elbo(monkeypatch, rng_key):
    """The start's steps judge, report and carry log p̄(m) (``build_blr(by_merit=True)``): its
    program holds one objective, and the only ELBO traced in ``init`` is the fit's own first one."""
    from dataclasses import replace

    from blrppl.blr import build
    from models import ZOO

    args, kwargs = ZOO["logistic_regression"].data()
    engine = blrppl.NonConjugateVI(ZOO["logistic_regression"].model)
    plan = engine.plan(*args, **kwargs)
    assert plan.start_estimators and build.judged_by_mode(replace(plan, estimators=plan.start_estimators))
    traced, original = [], build.elbo_terms
    monkeypatch.setattr(build, "elbo_terms", lambda *a, **k: traced.append(a[2]) or original(*a, **k))
    jax.make_jaxpr(engine.build(plan).init)(rng_key, plan.arrays)
    assert traced == [plan.estimators]
