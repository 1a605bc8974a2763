"""Compilation budget: the step is traced once per algorithm, and once per data shape.

A plan's data are an argument of the compiled loop, so a second ``run`` of
the same engine on new data of the same shapes reuses the compiled program
(no trace, no compile), and gives the answer a fresh engine gives.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr import driver
from models import ZOO


def counting(algorithm):
    """The algorithm with a step that counts how often it is traced."""
    traces = {"step": 0}

    def step(state, arrays):
        traces["step"] += 1
        return algorithm.step(state, arrays)

    return algorithm._replace(step=step), traces


def test_step_is_traced_once_with_and_without_a_progress_bar(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    plan = engine.plan(*args, **kwargs)
    counted, traces = counting(engine.build(plan))
    state_bar, elbo_bar, _ = driver.run(counted, rng_key, 40, plan.arrays, progress_bar=True, num_updates=7)
    assert traces["step"] == 1
    state, elbo, _ = driver.run(counted, rng_key, 40, plan.arrays, progress_bar=False)
    assert traces["step"] == 1  # the loop is compiled once per algorithm, reused by later runs
    driver.run(counted, rng_key, 13, plan.arrays, progress_bar=True, num_updates=3, tol=1e-3)
    assert traces["step"] == 1  # other lengths, chunkings and tolerances too
    assert jnp.array_equal(elbo, elbo_bar)  # same keys, same result, bit for bit


def test_estimators_are_analysed_once_not_per_step(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    plan = engine.plan(*args, **kwargs)
    calls = {}

    def count(est):
        def estimate(*a, **k):
            calls[est.factor] = calls.get(est.factor, 0) + 1
            return est.estimate(*a, **k)

        return est._replace(estimate=estimate)

    plan = dataclasses.replace(plan, estimators=tuple(count(e) for e in plan.estimators))
    algorithm = blrppl.engines.base.build_blr(plan, engine.config)
    calls.clear()
    driver.run(algorithm, rng_key, 50, plan.arrays, progress_bar=False)
    # Python calls happen while tracing the step (and at init), never per step.
    assert max(calls.values()) < 10


def _glm(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def _data(seed, n=40):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ np.array([1.0, -0.5, 0.2])))).astype(float)
    return jnp.asarray(X), jnp.asarray(y)


def test_a_second_run_on_new_data_of_the_same_shapes_does_not_trace_again(rng_key):
    """Non-conjugate (the model re-run on the data inside the step) and conjugate plans."""
    engine = blrppl.NonConjugateVI(_glm, estimator="mc", num_samples=4)
    X1, y1 = _data(1)
    X2, y2 = _data(2)
    first = engine.run(rng_key, 30, X1, y=y1, progress_bar=False)
    plan = engine.plan(X2, y=y2)
    assert plan.signature == first.plan.signature
    algorithm = engine.build(plan)
    assert algorithm is engine.build(first.plan)
    counted, traces = counting(algorithm)
    engine._algorithms[(plan.signature, False, False, True)] = counted
    second = engine.run(rng_key, 30, X2, y=y2, progress_bar=False)
    assert traces["step"] == 1  # traced for this counting wrapper once ...
    engine.run(rng_key, 30, *_data(3), progress_bar=False)
    assert traces["step"] == 1  # ... and never again for new data
    fresh = blrppl.NonConjugateVI(_glm, estimator="mc", num_samples=4).run(rng_key, 30, X2, y=y2, progress_bar=False)
    np.testing.assert_allclose(second.elbo, fresh.elbo, rtol=1e-10)  # no stale data in the program
