"""Planning's eager primitives compile with cheap settings on a CPU (blrppl.eager_ops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl import compile_mode, eager_ops
from blrppl.eager_ops import cheap_eager_ops


def cheap_lookups() -> int:
    """How often an eager primitive took the cheap route (cache hits and misses)."""
    info = eager_ops._cheap_callable.cache_info()
    return info.hits + info.misses


def test_small_eager_primitives_inside_the_context_take_the_cheap_program():
    x = jnp.linspace(0.1, 2.0, 37)
    before = cheap_lookups()
    with cheap_eager_ops():
        inside = jax.lax.reduce_precision(x, exponent_bits=7, mantissa_bits=13)
    assert cheap_lookups() == before + 1
    program = eager_ops._cheap_callable(jax.lax.reduce_precision_p, exponent_bits=7, mantissa_bits=13)
    assert program._cache_size() >= 1  # compiled with FAST_CPU_OPTIONS
    outside = jax.lax.reduce_precision(x, exponent_bits=7, mantissa_bits=13)  # JAX's own program
    assert cheap_lookups() == before + 2  # the line above looked the program up; the call did not
    np.testing.assert_array_equal(inside, outside)


def test_large_operands_optimized_mode_and_outside_keep_jax_settings():
    big = jnp.ones(eager_ops.CHEAP_OPERAND_BYTES // 4 + 1, jnp.float32)
    with cheap_eager_ops():
        assert eager_ops.options_for((big,)) is None
        assert eager_ops.options_for((big[:3],)) == compile_mode.fast_cpu_options()
        previous = compile_mode.set_compile_mode("optimized")
        try:
            assert eager_ops.options_for((big[:3],)) is None
        finally:
            compile_mode.set_compile_mode(previous)
    assert eager_ops.options_for((big[:3],)) is None


def regression(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Normal(jax.lax.mul(w, x) + 1.0, 1.0 / jnp.sqrt(tau)), obs=y)


def test_planning_runs_the_model_s_eager_primitives_cheaply_and_fits_as_before():
    x = jnp.linspace(-1.0, 1.0, 29)  # shapes no other test uses
    y = 0.3 * x + jnp.cos(x)
    before = cheap_lookups()
    cheap = blrppl.VMP(regression).run(jax.random.key(0), 200, x, y=y, progress_bar=False, tol=1e-12)
    assert cheap_lookups() > before  # the model's own eager primitives, in its host trace
    previous = compile_mode.set_compile_mode("optimized")  # XLA's defaults everywhere
    try:
        default = blrppl.VMP(regression).run(jax.random.key(0), 200, x, y=y, progress_bar=False, tol=1e-12)
    finally:
        compile_mode.set_compile_mode(previous)
    for site in ("w", "tau"):
        np.testing.assert_allclose(cheap.posterior[site].mean, default.posterior[site].mean, rtol=1e-9)
    np.testing.assert_allclose(cheap.elbo[-1], default.elbo[-1], rtol=1e-10)


_XLA_COMPILES: list = []


def xla_compiles() -> int:
    """XLA compilations in this process so far (JAX logs "Compiling" once per lowering, and one
    lowering may compile twice, with two sets of options)."""
    from jax._src import monitoring

    if not _XLA_COMPILES:
        _XLA_COMPILES.append(0)
        monitoring.register_event_duration_secs_listener(
            lambda event, seconds, **_: _XLA_COMPILES.append(event)
            if event == "/jax/core/compile/backend_compile_duration" else None
        )
    return len(_XLA_COMPILES)


def test_jitted_functions_inside_the_context_compile_cheaply_and_stay_there():
    """A jitted function called eagerly (jnp functions are jitted as a whole) that numpy does not
    compute (:mod:`blrppl.host_ops`: a sort) runs a program of its own inside the context
    (compiled with the cheap settings), which never serves calls outside: there the same call
    compiles XLA's default program (without the route, it would reuse the program compiled
    inside)."""

    @jax.jit
    def scaled(a, b):
        return jnp.sort(a) * 2.0 + b

    x = jnp.linspace(0.0, 1.0, 41)
    start = xla_compiles()
    with cheap_eager_ops():
        inside = scaled(x, x)
        again = scaled(x, x)  # cached for planning's calls
    middle = xla_compiles()
    outside = scaled(x, x)
    scaled(x, x)
    assert middle - start == 1 and xla_compiles() - middle == 1
    np.testing.assert_allclose(inside, outside, rtol=1e-15)
    np.testing.assert_array_equal(inside, again)
