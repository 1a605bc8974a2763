"""Small data compile with XLA:CPU's cheap settings, larger data with its defaults, same answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blrppl
from blrppl import compile_mode
from blrppl.blr import driver
from models import ZOO


@pytest.fixture
def restore_mode():
    previous = compile_mode.set_compile_mode("auto")  # whatever BLRPPL_COMPILE_MODE says
    yield
    compile_mode.set_compile_mode(previous)


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
