"""A first call compiles its start and its step loop side by side (``blrppl.blr.ahead``).

The loop is compiled from the start's abstract outputs while the start
compiles in a thread; these tests show that the programs compiled ahead are
the ones the run then uses (no second compilation), for a plain run and for
restarts, and that a run on committed data (where ahead-compiling is skipped)
still compiles each program once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr import ahead, driver
from blrppl.engines.base import start_tests
from models import ZOO
from tests.compiles import compilations, compiled_names


def _model(y):  # defined here: no other test has compiled its programs
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def _mixture(y):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
    with numpyro.plate("n", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(w))
        numpyro.sample("y", dist.Normal(mu[z], 1.0), obs=y)


def _y(n=23, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(1.0, 0.7, n))


def test_the_loop_compiled_beside_the_start_is_the_one_the_run_uses(rng_key):
    engine = blrppl.VMP(_model)
    plan = engine.plan(_y(29))
    algorithm = engine.build(plan)
    tests = start_tests(plan.qs)
    init_args = (algorithm, tests, algorithm.exact, rng_key, plan.arrays, np.asarray(40, np.int32))
    threshold, buffer, previous, hits = driver._loop_inputs(40, 1e-8)

    def chunk_args(outputs):
        state, _, stop = outputs
        return algorithm, plan.arrays, driver._lean(algorithm, state), buffer, np.asarray(0, np.int32), stop, \
            previous, hits, threshold

    with compilations() as ahead_of_time:
        ahead.compile_side_by_side(driver._init, init_args, driver._run_chunk, chunk_args)
    assert sorted(compiled_names(ahead_of_time)) == ["jit(_chunk)", "jit(_init)"]
    with compilations() as during_the_run:
        state, elbo, converged, valid = driver.checked_run(algorithm, rng_key, 40, plan.arrays, tests, tol=1e-8,
                                                           progress_bar=False)
    assert compiled_names(during_the_run) == []
    assert bool(np.all(valid)) and converged and np.all(np.isfinite(np.asarray(elbo)))


def test_a_first_call_compiles_each_program_once(rng_key):
    def model(y):  # a fresh function: a fresh plan, algorithm and programs
        _model(y)

    with compilations() as messages:
        result = blrppl.VMP(model).run(rng_key, 60, _y(31), progress_bar=False, tol=1e-8)
    names = compiled_names(messages)
    assert names.count("jit(_init)") == 1 and names.count("jit(_chunk)") == 1, names
    assert bool(result.convergence)


def test_restarts_run_the_single_fits_loop_compiled_beside_one_start_program(rng_key):
    """Restarts of one data set, one after another (blrppl.blr.serial_restarts): one start
    program for every restart and the single fit's loop, compiled side by side with the
    stacking and the best restart's take; no vmapped program; a refit compiles nothing, and a
    single fit of the same plan shares the loop."""
    y = jnp.concatenate([_y(20, 1) - 3.0, _y(20, 2) + 3.0])

    def mixture(y):  # a fresh function: fresh programs
        _mixture(y)

    engine = blrppl.VMP(mixture)
    with compilations() as first:
        result = engine.run(rng_key, 50, y, progress_bar=False, tol=1e-8, num_restarts=3)
    names = compiled_names(first)
    for name in ("jit(_start)", "jit(_chunk)", "jit(_stack_rows)", "jit(_take_rows)"):
        assert names.count(name) == 1, names
    assert not any("restarts" in n or "chunks" in n for n in names), names
    assert result.num_restarts == 3 and result.restarts.elbo.shape[0] == 3
    moved = y + 0.1
    with compilations() as again:
        engine.run(jax.random.key(7), 50, moved, progress_bar=False, tol=1e-8, num_restarts=3)
    assert compiled_names(again) == []
    with compilations() as single:
        alone = engine.run(rng_key, 50, y, progress_bar=False, tol=1e-8, num_restarts=1)
    assert "jit(_chunk)" not in compiled_names(single)
    np.testing.assert_allclose(np.asarray(result.restarts.elbo[0, : len(alone.elbo)]), np.asarray(alone.elbo), rtol=1e-12)


def test_the_other_restarts_start_while_the_loop_compiles_and_fit_as_without(rng_key, monkeypatch):
    """Restarts 1..C-1's starts are dispatched with restart 0's program as soon as it is compiled
    (a core is free while the loop compiles), and the fit is the one made without ahead-compiling."""
    from blrppl.blr import serial_restarts

    y = jnp.concatenate([_y(20, 3) - 3.0, _y(20, 4) + 3.0])
    dispatched = []

    def spy(*args):
        more = args[5] if len(args) > 5 else None
        watched = None if more is None else (lambda program: (more(program), dispatched.append(True)))
        return ahead.compile_side_by_side(*args[:5], **({} if watched is None else {"more": watched}))

    def fit(model, patched):
        if patched is not None:
            monkeypatch.setattr(serial_restarts, "compile_side_by_side", patched)
        result = blrppl.VMP(model).run(rng_key, 50, y, progress_bar=False, tol=1e-8, num_restarts=3)
        monkeypatch.undo()
        return result

    def first(y):  # fresh functions: fresh programs, compiled ahead or not
        _mixture(y)

    def second(y):
        _mixture(y)

    ahead_of_time, plain = fit(first, spy), fit(second, lambda *args: None)
    assert dispatched == [True]
    np.testing.assert_array_equal(np.asarray(ahead_of_time.restarts.elbo), np.asarray(plain.restarts.elbo))


def test_committed_data_are_compiled_once_without_ahead_compiling(rng_key):
    def model(y):
        _model(y)

    y = jax.device_put(_y(37), jax.devices()[0])
    assert y.committed
    with compilations() as messages:
        committed = blrppl.VMP(model).run(rng_key, 60, y, progress_bar=False, tol=1e-8)
    names = compiled_names(messages)
    assert names.count("jit(_init)") == 1 and names.count("jit(_chunk)") == 1, names
    plain = blrppl.VMP(model).run(rng_key, 60, _y(37), progress_bar=False, tol=1e-8)
    np.testing.assert_array_equal(np.asarray(committed.elbo), np.asarray(plain.elbo))


def test_weakly_typed_outputs_keep_their_type():
    """A point estimate passed through a start stays weakly typed: the loop compiled ahead
    must take it so (read from the lowering's own output types, it compiled twice)."""
    from blrppl.compile_mode import SizeDependentJit

    first = SizeDependentJit(lambda x, p: (x * 2.0, p), data_argnum=0)
    second = SizeDependentJit(lambda y, p: y + p, data_argnum=0)
    x = jnp.linspace(0.0, 1.0, 7)
    with compilations() as ahead_of_time:
        started = ahead.compile_side_by_side(first, (x, 1.5), second, lambda outputs: outputs)
    assert len(ahead_of_time) == 2  # the start was run too, by the program compiled here
    np.testing.assert_array_equal(started[0], 2.0 * np.asarray(x))
    assert started[1].weak_type and float(started[1]) == 1.5
    with compilations() as during_the_run:
        y, p = first(x, 1.5)
        assert p.weak_type
        result = second(y, p)
    np.testing.assert_allclose(result, 2.0 * np.asarray(x) + 1.5)
    assert compiled_names(during_the_run) == []


def _point_estimate(y):  # EM: a weakly typed point estimate passes through the start
    sigma = numpyro.param("sigma", 1.0, constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def _poisson(y):  # NonConjugateVI: a guarded Newton start
    log_rate = numpyro.sample("log_rate", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(log_rate)), obs=y)


@pytest.mark.parametrize("model, engine_name, y", [
    (_point_estimate, "EM", _y(21)),
    (ZOO["beta_bernoulli"].model, "ConjugateBayes", None),
    (_poisson, "NonConjugateVI", jnp.asarray(np.random.default_rng(5).poisson(3.0, 17), float)),
])
def test_compiling_ahead_adds_no_compilation(model, engine_name, y, rng_key, monkeypatch):
    """Point estimates (EM), lean exact states (conjugate Bayes), Newton starts: the programs
    compiled ahead are the ones the fit runs, so it compiles what it compiled without them."""
    args, kwargs = ((y,), {}) if y is not None else ZOO["beta_bernoulli"].data()

    def counts(ahead_on: bool) -> dict:
        def fresh(*a, **k):  # a fresh model: fresh programs
            return model(*a, **k)

        if not ahead_on:
            monkeypatch.setattr(driver, "compile_side_by_side", lambda *a: None)
        with compilations() as messages:
            getattr(blrppl, engine_name)(fresh).run(rng_key, 100, *args, progress_bar=False, tol=1e-8, **kwargs)
        monkeypatch.undo()
        names = compiled_names(messages)
        return {n: names.count(n) for n in ("jit(_init)", "jit(_chunk)")}

    assert counts(True) == counts(False)


@pytest.mark.parametrize("restarts", [None, 3])
def test_batched_fits_compile_their_loop_beside_their_starts(rng_key, monkeypatch, restarts):
    ys = jnp.stack([_y(19, seed) for seed in range(4)])
    start = "jit(_init_many)" if restarts is None else "jit(_init_batched_restarts)"

    def counts(ahead_on: bool) -> dict:
        def model(y):  # a fresh model: fresh programs
            _model(y)

        ahead_of_time = []

        def spy(*args):
            start = len(messages)
            ahead.compile_side_by_side(*args)
            ahead_of_time.extend(m for m in messages[start:] if m.startswith("Compiling"))

        monkeypatch.setattr(driver, "compile_side_by_side", spy if ahead_on else lambda *a: None)
        with compilations() as messages:
            batch = blrppl.VMP(model).run_batched(rng_key, 80, ys, tol=1e-8, num_restarts=restarts)
        monkeypatch.undo()
        names = compiled_names(messages)
        if ahead_on:  # both programs compiled inside compile_side_by_side
            assert sorted(compiled_names(ahead_of_time)) == sorted([start, "jit(_run_chunks)"])
        return {n: names.count(n) for n in (start, "jit(_run_chunks)")}, batch

    (with_ahead, batch), (without, plain) = counts(True), counts(False)
    assert with_ahead == without == {start: 1, "jit(_run_chunks)": 1}
    np.testing.assert_array_equal(np.asarray(batch.elbo), np.asarray(plain.elbo))


def test_a_second_run_does_not_compile_ahead_again(rng_key, monkeypatch):
    """Later runs of the same signature skip it (lowering again costs milliseconds per call)."""
    import threading

    def model(y):
        _model(y)

    mixture_data = jnp.concatenate([_y(20, 1) - 3.0, _y(20, 2) + 3.0])
    fits = [(blrppl.VMP(model), _y(33, 3), _y(33, 4), {}),
            (blrppl.VMP(_mixture), mixture_data, mixture_data[::-1], {"num_restarts": 3})]
    for engine, first, second, options in fits:
        engine.run(rng_key, 50, first, progress_bar=False, tol=1e-8, **options)
        started = []
        thread = threading.Thread
        monkeypatch.setattr(threading, "Thread", lambda *a, **k: started.append(1) or thread(*a, **k))
        engine.run(jax.random.fold_in(rng_key, 1), 50, second, progress_bar=False, tol=1e-8, **options)
        monkeypatch.undo()
        assert started == []


def test_work_for_idle_time_waits_for_it_and_is_done_by_the_end():
    done = []
    ahead.when_idle(lambda: done.append("outside"))  # no idle_time block: at once
    assert done == ["outside"]
    with ahead.idle_time():
        ahead.when_idle(lambda: done.append("first"))
        with ahead.idle_time():  # nested: the outer block's work
            ahead.when_idle(lambda: done.append("second"))
        assert done == ["outside"]
        ahead.do_idle_work()
        assert done == ["outside", "first", "second"]
        ahead.when_idle(lambda: done.append("last"))
    assert done == ["outside", "first", "second", "last"]
    with pytest.raises(RuntimeError):  # a failed call leaves its work to whoever needs it
        with ahead.idle_time():
            ahead.when_idle(lambda: done.append("dropped"))
            raise RuntimeError
    assert done[-1] == "last"


def test_a_first_call_lowers_what_it_does_not_run_after_its_fit(rng_key):
    """The refit's planner and the linear-response check are lowered in the wait for the step
    loop's compilation, not before the fit's programs (on the first call's critical path), and
    compiled by the time the call returns: the second call compiles nothing."""
    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()

    def model(*a, **k):  # a fresh model: fresh programs
        return entry.model(*a, **k)

    engine = blrppl.NonConjugateVI(model)
    with compilations() as first:
        engine.run(rng_key, 60, *args, progress_bar=False, tol=1e-8, **kwargs)
    names = compiled_names(first)
    assert names.index("jit(replan)") > names.index("jit(_chunk)"), names
    assert names.index("jit(program)") > names.index("jit(_chunk)"), names
    moved = {k: v + 0.5 if k == "y" else v for k, v in kwargs.items()}
    with compilations() as second:
        engine.run(rng_key, 60, *args, progress_bar=False, tol=1e-8, **moved)
    assert compiled_names(second) == []
