"""Small data compile with XLA:CPU's cheap settings, larger data with its defaults, same answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blrppl
from blrppl import compile_mode
from blrppl.blr import driver
from models import ZOO


ON_CPU = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the cheap options are XLA:CPU's; accelerators keep XLA's defaults"
)


@pytest.fixture
def restore_mode():
    previous = compile_mode.set_compile_mode("auto")  # whatever BLRPPL_COMPILE_MODE says
    yield
    compile_mode.set_compile_mode(previous)


@ON_CPU
def test_the_size_of_the_data_chooses_the_options(restore_mode):
    small = {"y": np.zeros(compile_mode.SMALL_DATA_BYTES // 8)}
    large = {"y": np.zeros(compile_mode.SMALL_DATA_BYTES // 8 + 1)}
    assert compile_mode.fast_compile(small) and not compile_mode.fast_compile(large)
    assert compile_mode.fast_compile((jnp.zeros(3), jax.random.key(0), 1.0))

    compile_mode.set_compile_mode("optimized")
    assert not compile_mode.fast_compile(small)
    compile_mode.set_compile_mode("fast")
    assert compile_mode.fast_compile(large)
    with pytest.raises(ValueError, match="compile mode"):
        compile_mode.set_compile_mode("quick")


@ON_CPU
def test_the_driver_compiles_small_fits_with_the_cheap_options(restore_mode):
    entry = ZOO["linear_regression"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    plan = engine.plan(*args, **kwargs)
    algorithm = engine.build(plan)
    start = (algorithm, (), False, jax.random.key(0), plan.arrays, np.zeros((), np.int32))
    assert driver._run_chunk.variant(algorithm, plan.arrays) is driver._run_chunk.fast
    assert driver._init.variant(*start) is driver._init.fast
    compile_mode.set_compile_mode("optimized")
    assert driver._run_chunk.variant(algorithm, plan.arrays) is driver._run_chunk.optimized


@pytest.mark.parametrize("name, engine", [("linear_regression", blrppl.VMP), ("eight_schools_noncentered", blrppl.NonConjugateVI)])
def test_cheap_and_default_compilations_fit_the_same_posterior(restore_mode, name, engine):
    entry = ZOO[name]
    args, kwargs = entry.data()
    results = {}
    for mode in ("fast", "optimized"):
        compile_mode.set_compile_mode(mode)
        results[mode] = engine(entry.model).run(jax.random.key(0), 200, *args, progress_bar=False, tol=1e-10, **kwargs)
    fast, optimized = results["fast"], results["optimized"]
    np.testing.assert_allclose(fast.elbo[-1], optimized.elbo[-1], rtol=1e-10)
    for site, q in optimized.posterior.items():
        np.testing.assert_allclose(fast.posterior[site].mean, q.mean, rtol=1e-7, atol=1e-9, err_msg=site)


def test_a_cheaply_compiled_function_can_be_called_inside_another_program():
    """JAX refuses compiler options on a nested jit: inside a trace the plain variant runs."""
    double = compile_mode.SizeDependentJit(lambda x: 2.0 * x, fast=True)
    assert float(double(jnp.float32(1.5))) == 3.0
    assert float(jax.jit(lambda x: double(x) + 1.0)(1.5)) == 4.0
    assert np.allclose(jax.vmap(double)(jnp.arange(3.0)), [0.0, 2.0, 4.0])


@ON_CPU
def test_one_shot_programs_compile_cheaply_up_to_a_larger_bound(restore_mode):
    """A start runs once per fit: data up to ONE_SHOT_BYTES take the cheap options there."""
    data = {"y": np.zeros(compile_mode.SMALL_DATA_BYTES // 4)}
    assert not compile_mode.fast_compile(data)
    assert compile_mode.fast_compile(data, compile_mode.ONE_SHOT_BYTES)
    assert not compile_mode.fast_compile({"y": np.zeros(compile_mode.ONE_SHOT_BYTES // 8 + 1, np.float64)},
                                         compile_mode.ONE_SHOT_BYTES)
    start = (None, (), False, jax.random.key(0), data, np.zeros((), np.int32))
    assert driver._init.variant(*start) is driver._init.fast
    assert driver._run_chunk.variant(None, data) is driver._run_chunk.balanced  # larger data on a CPU


def test_a_probe_is_one_compiled_program_and_falls_back_where_code_needs_values():
    from tests.compiles import compilations

    def many_ops(x):
        return jnp.sum(jnp.exp(x) * jnp.log1p(x ** 2) - jnp.tanh(x) / 3.0 + jnp.cumsum(x))

    def sorted_ops(x):  # a sort: no numpy rule (blrppl.host_ops), so compiled
        return jnp.sum(jnp.sort(x) * jnp.exp(x))

    x = np.linspace(0.1, 1.0, 7)
    with compilations() as compiled:
        value = compile_mode.probe(jax.grad(many_ops))(x)
    assert len(compiled) == 0  # every equation computed with numpy
    np.testing.assert_allclose(value, jax.grad(many_ops)(x), rtol=1e-12)
    with compilations() as compiled:
        value = compile_mode.probe(jax.grad(sorted_ops))(x)
    assert len(compiled) == 1
    np.testing.assert_allclose(value, jax.grad(sorted_ops)(x), rtol=1e-12)

    def python_branch(x):  # control flow on a value: cannot be traced, runs eagerly
        return x * 2.0 if float(jnp.sum(x)) > 0 else -x

    np.testing.assert_allclose(compile_mode.probe(python_branch)(x), 2.0 * x)
    assert float(jax.jit(lambda v: compile_mode.probe(jnp.sin)(v))(0.5)) == pytest.approx(np.sin(0.5))


def test_to_device_makes_jnp_asarrays_array_without_compiling():
    from tests.compiles import compilations

    values = [np.arange(7.0).reshape(7, 1) + 0.5, np.arange(5, dtype=np.int32), np.float32(2.5), 3.0, True]
    with compilations() as compiled:
        moved = [compile_mode.to_device(v) for v in values]
    assert not compiled  # jnp.asarray of a host value compiles a `stage` program per shape and dtype
    for value, array in zip(values, moved):
        expected = jnp.asarray(value)
        assert isinstance(array, jax.Array)
        assert (array.dtype, array.shape, array.weak_type) == (expected.dtype, expected.shape, expected.weak_type)
        np.testing.assert_array_equal(array, expected)
        put = jax.device_put(value)
        assert (array.committed, array.sharding) == (put.committed, put.sharding)
    strided = np.arange(24.0).reshape(4, 6)[::2, 1::2]  # a view: the transfer reads it as numpy does
    np.testing.assert_array_equal(compile_mode.to_device(strided), strided)
    narrowed = compile_mode.to_device(np.arange(3, dtype=np.int64))  # canonicalised as device_put does
    assert narrowed.dtype == jnp.asarray(np.arange(3, dtype=np.int64)).dtype
    with pytest.raises(TypeError):
        compile_mode.to_device(np.array(["a"]))
    inside = jax.jit(lambda x: compile_mode.to_device(np.ones(3)) + x)(1.0)  # inside a trace: jnp.asarray
    np.testing.assert_array_equal(inside, np.full(3, 2.0))


def test_a_plans_large_host_operands_are_moved_to_the_device_once():
    """A numpy argument is transferred at every compiled call (and transposed where its memory is
    not in C order): a plan's large operands are device arrays, its small ones may stay numpy."""

    def mixture(y):
        import numpyro
        import numpyro.distributions as dist

        with numpyro.plate("K", 2):
            mu = numpyro.sample("mu", dist.MultivariateNormal(jnp.zeros(2), 10.0 * jnp.eye(2)))
        with numpyro.plate("N", y.shape[0]):
            z = numpyro.sample("z", dist.Categorical(jnp.array([0.5, 0.5])))
            numpyro.sample("y", dist.MultivariateNormal(mu[z], jnp.eye(2)), obs=y)

    y = np.random.default_rng(0).normal(size=(6000, 2))
    engine = blrppl.VMP(mixture)
    for plan in (engine.plan(y), engine.plan(y + 1.0)):  # recorded, then replanned
        leaves = jax.tree.leaves(plan.arrays.factors)
        large = [a for a in leaves if np.size(a) * 8 >= compile_mode.RESIDENT_BYTES]
        assert large and all(isinstance(a, jax.Array) for a in large), [type(a) for a in large]
    tree = {"big": np.asfortranarray(np.ones((3000, 4))), "small": np.ones(3), "number": 2.0}
    moved = compile_mode.resident(tree)
    assert isinstance(moved["big"], jax.Array) and not moved["big"].committed
    assert type(moved["small"]) is np.ndarray and moved["number"] == 2.0
    np.testing.assert_array_equal(moved["big"], tree["big"])


def test_to_host_reads_a_tree_as_device_get_does():
    tree = {"a": jnp.arange(3.0), "b": (jnp.ones((2, 2), jnp.int32), 1.5, None), "c": np.zeros(2), "k": jnp.asarray(True),
            "key": jax.random.key(0)}
    read, expected = compile_mode.to_host(tree), jax.device_get(tree)
    assert jax.tree.structure(read) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(read), jax.tree.leaves(expected)):
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            assert (got.dtype, got.shape) == (want.dtype, want.shape)
            np.testing.assert_array_equal(got, want)
        else:  # a Python number, or a key array left as it is
            assert got is want or got == want
    assert compile_mode.to_host(()) == () and compile_mode.to_host(2.0) == 2.0


def test_structure_of_reads_a_result_without_running_it():
    import numpyro.distributions as dist
    from tests.compiles import compilations

    def normal(loc):
        return dist.MultivariateNormal(loc, precision_matrix=jnp.eye(3) * 2.0)

    with compilations() as compiled:
        d = compile_mode.structure_of(normal, np.ones(3))
    assert not [m for m in compiled if "cholesky" in m or "triangular" in m]  # the factorisation never ran
    assert isinstance(d, dist.MultivariateNormal) and d.event_shape == (3,)
    assert isinstance(d.loc, jax.core.Tracer)

    def concrete(loc):
        return dist.Normal(loc, 1.0) if float(loc[0]) > 0 else dist.Laplace(loc, 1.0)

    assert isinstance(compile_mode.structure_of(concrete, np.ones(3)), dist.Normal)


def test_only_compile_options_that_xla_knows_are_passed(monkeypatch):
    from blrppl import compile_mode

    probed = compile_mode.probe_cpu_options()
    assert set(probed) <= set(compile_mode.FAST_CPU_OPTIONS)
    assert "xla_backend_optimization_level" in probed
    compile_mode.fast_cpu_options.cache_clear()
    try:
        # The table of known jaxlib releases says what the probe finds (no probe at run time).
        assert compile_mode.fast_cpu_options() == probed
        unknown = {**compile_mode.FAST_CPU_OPTIONS, "xla_cpu_no_such_option_anywhere": True}
        monkeypatch.setattr(compile_mode, "FAST_CPU_OPTIONS", unknown)
        assert "xla_cpu_no_such_option_anywhere" not in compile_mode.probe_cpu_options()
        assert "xla_backend_optimization_level" in compile_mode.probe_cpu_options()
        # An unknown jaxlib release is probed.
        monkeypatch.setattr(compile_mode, "ACCEPTED_BY_JAXLIB", {})
        compile_mode.fast_cpu_options.cache_clear()
        assert "xla_cpu_no_such_option_anywhere" not in compile_mode.fast_cpu_options()
    finally:
        compile_mode.fast_cpu_options.cache_clear()


def test_engines_trace_their_matrix_products_at_full_precision():
    """On GPUs JAX's default float32 matmul rounds to TF32; a fit's programs must not (CPUs ignore it)."""
    import numpyro
    import numpyro.distributions as dist

    import blrppl
    from blrppl.compile_mode import full_precision

    seen = []

    @full_precision
    def traced():
        seen.append(jax.config.jax_default_matmul_precision)
        return str(jax.make_jaxpr(lambda a: a @ a)(jnp.ones((2, 2), jnp.float32)))

    assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in traced() and seen == ["highest"]
    with jax.default_matmul_precision("bfloat16"):  # a precision the user chose is kept
        assert "HIGHEST" not in traced()

    def model(X, y=None):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
        numpyro.sample("y", dist.Normal(X @ beta, 1.0), obs=y)

    engine = blrppl.VMP(model)
    X, y = jnp.ones((5, 2)), jnp.arange(5.0)
    seen.clear()
    original = blrppl.engines.base.record_plan
    try:
        blrppl.engines.base.record_plan = lambda *a: (seen.append(jax.config.jax_default_matmul_precision), original(*a))[1]
        engine.run(jax.random.key(0), 3, X, y=y, progress_bar=False)
    finally:
        blrppl.engines.base.record_plan = original
    assert seen == ["highest"]


@pytest.mark.skipif(jax.default_backend() == "cpu", reason="needs an accelerator")
def test_accelerators_keep_xlas_defaults(restore_mode):
    """Run where the default device is an accelerator (checked on an H200)."""
    small = {"y": jnp.zeros(8)}
    assert not compile_mode.fast_compile(small) and not compile_mode.fast_compile(small, compile_mode.ONE_SHOT_BYTES)
    compile_mode.set_compile_mode("fast")
    assert not compile_mode.fast_compile(small)
    on_cpu = {"y": jax.device_put(np.zeros(8), jax.devices("cpu")[0])}
    assert compile_mode.fast_compile(on_cpu)  # data committed to the host CPU still compile cheaply there


def _random_walk(y=None):
    import numpyro
    import numpyro.distributions as dist

    x = numpyro.sample("x", dist.GaussianRandomWalk(1.0, num_steps=y.shape[0]))
    numpyro.sample("y", dist.Normal(x, 1.0), obs=y)


def _loop_args(engine, *args, **kwargs):
    """The step loop's arguments for a fit of ``engine`` on the data (the state abstract)."""
    plan = engine.plan(*args, **kwargs)
    algorithm = engine.build(plan)
    state = jax.eval_shape(algorithm.init, jax.random.key(0), plan.arrays)
    threshold, buffer, previous, hits = driver._loop_inputs(200, None)
    zero = np.zeros((), np.int32)
    return plan, (algorithm, plan.arrays, state, buffer, zero, zero, previous, hits, threshold)


@ON_CPU
def test_a_loop_over_larger_data_compiles_cheaply_where_its_run_is_short(restore_mode):
    """Over SMALL_DATA_BYTES, a step loop takes the cheap options where its estimated work (XLA's
    operation count per step times the steps asked for) is within LOOP_FLOP_BUDGET; not for a
    long run, not outside a run (no step count), and not for a chain, whose passes the estimate
    cannot see."""
    from models import styles

    model, data = styles.MODELS["logistic_random_intercepts"]  # 600 rows, 15 groups
    data_args, data_kwargs = data()
    plan, args = _loop_args(blrppl.NonConjugateVI(model), *data_args, **data_kwargs)
    assert not compile_mode.fast_compile(plan.arrays)  # over the size bound
    loop = driver._run_chunk
    with compile_mode.planned_steps(200):
        assert loop.variant(*args) is loop.fast
    with compile_mode.planned_steps(10**7):
        assert loop.variant(*args) is loop.balanced
    assert loop.variant(*args) is loop.balanced
    compile_mode.set_compile_mode("optimized")
    with compile_mode.planned_steps(200):
        assert loop.variant(*args) is loop.optimized

    compile_mode.set_compile_mode("auto")
    rng = np.random.default_rng(0)
    plan, args = _loop_args(blrppl.VMP(_random_walk), y=rng.normal(size=10_000))
    assert args[0].chained and not compile_mode.fast_compile(plan.arrays)
    with compile_mode.planned_steps(2):
        assert loop.variant(*args) is loop.balanced


@ON_CPU
def test_larger_data_compile_with_the_balanced_options_and_fit_as_xla_defaults_do(restore_mode):
    """Over the size bound a CPU program takes BALANCED_CPU_OPTIONS (mode "auto"), XLA's defaults
    in mode "optimized": the same posterior to rounding."""
    assert set(compile_mode.balanced_cpu_options()) == set(compile_mode.fast_cpu_options())
    y = np.cumsum(np.random.default_rng(2).normal(size=10_000)) * 0.1
    engine = blrppl.VMP(_random_walk)
    loop = driver._run_chunk
    before = loop.balanced._cache_size()
    auto = engine.run(jax.random.key(0), 50, y=y, progress_bar=False, tol=1e-10)
    assert loop.balanced._cache_size() == before + 1  # the chain's loop, over 80 kB of data
    compile_mode.set_compile_mode("optimized")
    default = blrppl.VMP(_random_walk).run(jax.random.key(0), 50, y=y, progress_bar=False, tol=1e-10)
    assert len(auto.elbo) == len(default.elbo)
    np.testing.assert_allclose(auto.elbo, default.elbo, rtol=1e-12)
    np.testing.assert_allclose(auto.posterior["x"].mean, default.posterior["x"].mean, rtol=1e-9, atol=1e-9)


@ON_CPU
def test_a_fit_after_a_newton_start_takes_its_first_steps_in_the_cheap_loop(restore_mode, monkeypatch):
    """After a Newton start the first FIRST_STEPS steps run in the cheaply compiled loop whatever
    the planned steps call for (here, by a zero budget, the balanced loop): a fit converged by
    then never compiles the balanced loop; a longer run goes on in it, to the same bits with and
    without a progress bar."""
    from models import styles

    monkeypatch.setattr(compile_mode, "LOOP_FLOP_BUDGET", 0.0)
    model, data = styles.MODELS["logistic_random_intercepts"]  # 600 rows: over SMALL_DATA_BYTES
    data_args, data_kwargs = data()
    engine = blrppl.NonConjugateVI(lambda *a, **k: model(*a, **k))  # a fresh model: fresh programs
    plan = engine.plan(*data_args, **data_kwargs)
    assert engine.build(plan).newton_started and not compile_mode.fast_compile(plan.arrays)
    loop, chosen = driver._run_chunk, []
    variant = loop.variant
    monkeypatch.setattr(loop, "variant", lambda *args: chosen.append(variant(*args)) or chosen[-1])
    short = engine.fit(plan, jax.random.key(0), 50, progress_bar=False, tol=1e-6)
    assert short.convergence.stopped and len(short.elbo) <= compile_mode.FIRST_STEPS
    assert chosen and all(v is loop.fast for v in chosen)
    steps, chosen[:] = compile_mode.FIRST_STEPS + 4, []
    plain = engine.fit(plan, jax.random.key(0), steps, progress_bar=False)
    assert chosen[-2:] == [loop.fast, loop.balanced] and len(plain.elbo) == steps
    chosen[:] = []
    bars = engine.fit(plan, jax.random.key(0), steps, progress_bar=True)
    assert chosen[-steps:] == [loop.fast] * compile_mode.FIRST_STEPS + [loop.balanced] * 4  # a call per step
    np.testing.assert_array_equal(plain.elbo, bars.elbo)
    np.testing.assert_allclose(plain.elbo[: len(short.elbo)], short.elbo, rtol=1e-13)
