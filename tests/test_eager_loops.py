"""Eager loops in planning compile once per structure (blrppl.eager_loops), and compute what JAX computes."""

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.eager_loops import loops_compiled_once
from tests.compiles import compilations


def cumulative(weights, xs, scale):
    """A scan whose body closes over an array (a constant of the body) and a Python float (a literal)."""

    def step(carry, x):
        new = carry + scale * jnp.sum(weights) * x
        return new, new

    return jax.lax.scan(step, jnp.zeros(()), xs)[1]


def test_a_loop_of_the_same_structure_compiles_once_and_computes_on_its_own_inputs():
    rng = np.random.default_rng(0)
    with loops_compiled_once():
        cumulative(jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=7)), 1.5)
        weights, xs = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=7))
        with compilations() as messages:
            out = cumulative(weights, xs, 1.5)
    assert messages == []
    np.testing.assert_allclose(out, np.cumsum(1.5 * np.sum(weights) * np.asarray(xs)), rtol=1e-12)


def test_loops_that_differ_in_a_literal_or_a_shape_are_different_programs():
    xs = jnp.arange(1.0, 5.0)
    weights = jnp.ones(2)
    with loops_compiled_once():
        once = cumulative(weights, xs, 1.0)
        twice = cumulative(weights, xs, 2.0)
        longer = cumulative(weights, jnp.arange(1.0, 7.0), 1.0)
    np.testing.assert_allclose(once, 2.0 * np.cumsum(np.arange(1.0, 5.0)))
    np.testing.assert_allclose(twice, 4.0 * np.cumsum(np.arange(1.0, 5.0)))
    np.testing.assert_allclose(longer, 2.0 * np.cumsum(np.arange(1.0, 7.0)))


def test_while_loops_are_looked_up_too_and_outside_the_context_jax_compiles_as_usual():
    def count(limit):
        return jax.lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] + 1, c[1] * 2.0), (0, jnp.ones(())))

    with loops_compiled_once():
        count(jnp.asarray(3))
        with compilations() as inside:
            steps, value = count(jnp.asarray(5))
    assert inside == [] and int(steps) == 5 and float(value) == 32.0
    with compilations() as outside:
        count(jnp.asarray(5))
    assert outside, "outside the context an eager loop's fresh body is JAX's own business"


def test_a_second_plan_of_a_model_with_a_scan_compiles_nothing(rng_key):
    import blrppl
    from models import ZOO

    entry = ZOO["nile"]
    args, kwargs = entry.data()
    engine = blrppl.EM(entry.model)
    engine.plan(*args, **kwargs)
    with compilations() as messages:
        engine.plan(*args, y=np.asarray(kwargs["y"]) * 1.01)
    assert messages == []


def test_a_loop_bound_eagerly_under_disable_jit_still_runs():
    """The symbolic interpreter binds equations itself; under ``jax.disable_jit`` a looked-up
    loop must run its compiled program, not recurse into its own binding."""
    closed = jax.make_jaxpr(lambda xs: cumulative(jnp.ones(2), xs, 1.0))(jnp.arange(3.0))
    with loops_compiled_once(), jax.disable_jit():
        (out,) = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, jnp.arange(3.0))
    np.testing.assert_allclose(out, 2.0 * np.cumsum(np.arange(3.0)))
