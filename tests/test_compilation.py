"""Compilation budget: the step is traced once per run, chunks share one compilation."""

import dataclasses

import jax

import blrppl
from blrppl.blr.driver import run
from models import ZOO


def test_step_is_traced_once_with_and_without_a_progress_bar(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    plan = engine.plan(*args, **kwargs)
    algorithm = engine.build(plan)
    traces = 0

    def counting_step(key, state):
        nonlocal traces
        traces += 1
        return algorithm.step(key, state)

    counted = algorithm._replace(step=counting_step)
    state_bar, elbo_bar = run(counted, rng_key, 40, progress_bar=True, num_updates=7)
    assert traces == 1
    state, elbo = run(counted, rng_key, 40, progress_bar=False)
    assert traces == 1  # the loop is compiled once per algorithm, reused by later runs
    run(counted, rng_key, 13, progress_bar=True, num_updates=3, tol=1e-3)
    assert traces == 1  # other lengths, chunkings and tolerances too
    assert jax.numpy.array_equal(elbo, elbo_bar)  # same keys, same result, bit for bit


def test_estimators_are_analysed_once_not_per_step(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    plan = engine.plan(*args, **kwargs)
    calls = {}

    def counting(est):
        def estimate(*a, **k):
            calls[est.factor] = calls.get(est.factor, 0) + 1
            return est.estimate(*a, **k)

        return est._replace(estimate=estimate)

    plan = dataclasses.replace(plan, estimators=tuple(counting(e) for e in plan.estimators))
    algorithm = engine.build(plan)
    calls.clear()
    run(algorithm, rng_key, 50, progress_bar=False)
    # Python calls happen while tracing the step (and at init), never per step.
    assert max(calls.values()) < 10
