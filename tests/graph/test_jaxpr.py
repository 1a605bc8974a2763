"""The shared jaxpr layer: the primitive table, call bodies, walking and liveness."""

import jax
import jax.numpy as jnp

from blrppl.graph.jaxpr import (
    PRIMITIVES,
    call_body,
    input_dependencies,
    is_call,
    linearity,
    live_equations,
    param,
    structural_data_args,
    walk,
)


@jax.custom_jvp
def _smooth(x):
    return jnp.sin(x)


_smooth.defjvp(lambda primals, tangents: (_smooth(primals[0]), jnp.cos(primals[0]) * tangents[0]))


@jax.custom_vjp
def _clipped(x):
    return jnp.cos(x)


_clipped.defvjp(lambda x: (_clipped(x), x), lambda x, g: (g,))


def _eqns(fn, *args):
    return jax.make_jaxpr(fn)(*args).jaxpr.eqns


def test_table_classifies_by_role_data_arguments_and_linearity():
    assert structural_data_args("reshape", 1) == (0,)
    assert structural_data_args("concatenate", 3) == (0, 1, 2)
    assert structural_data_args("select_n", 3) == (1, 2)
    assert structural_data_args("add", 2) is None
    assert linearity("dot_general") == "bilinear" and linearity("gather") == "linear_in_first"
    assert linearity("sin") is None and "sin" not in PRIMITIVES
    assert is_call("jit") and is_call("custom_jvp_call") and not is_call("custom_jvp_call", wrapped=False)
    assert not is_call("scan")


def test_call_bodies_are_found_under_every_parameter_name():
    def fn(x):
        y = jax.jit(lambda a: a * 2.0)(x)
        y = jax.checkpoint(lambda a: a + 1.0)(y)
        return _smooth(y) + _clipped(y)

    calls = [e for e in _eqns(fn, 1.0) if is_call(e.primitive.name)]
    assert {e.primitive.name for e in calls} >= {"custom_jvp_call", "custom_vjp_call"}
    for eqn in calls:
        body = call_body(eqn)
        assert body is not None, eqn.primitive.name
        assert param(eqn, "jaxpr", "call_jaxpr") is body
    plain = [e for e in calls if call_body(e, wrapped=False) is not None]
    assert [e.primitive.name for e in plain] == [calls[0].primitive.name]
    assert call_body(_eqns(jnp.sin, 1.0)[0]) is None


def test_walk_and_liveness():
    def fn(a, b):
        dead = jnp.exp(b)  # noqa: F841 (never used: not live)
        return a * 2.0, jnp.sin(a) + b

    jaxpr = jax.make_jaxpr(fn)(1.0, 2.0).jaxpr
    live, read = live_equations(jaxpr)
    assert [e.primitive.name for e in live] == ["mul", "sin", "add"]
    assert all(v in read for v in jaxpr.outvars)
    names = walk(jaxpr, [], ["a", "b"], lambda eqn, ins: [f"{eqn.primitive.name}({','.join(map(str, ins))})"],
                 literal=lambda v: str(v.val), equations=live)
    assert names == ["mul(a,2.0)", "add(sin(a),b)"]
    assert input_dependencies(jaxpr) == [{0}, {0, 1}]


def test_map_batch_maps_lapack_code_one_row_at_a_time_and_vmaps_the_rest():
    """Batched LAPACK calls can deadlock jaxlib 0.10 on CPU: map_batch never makes one."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from blrppl.graph.jaxpr import lapack_primitives, map_batch

    def chol(scale, shift):
        return jnp.linalg.cholesky(scale * jnp.eye(3) + shift)

    scales = jnp.arange(1.0, 5.0)
    shift = jnp.full((3, 3), 0.1)
    batched = jax.make_jaxpr(lambda s: map_batch(lambda x: chol(x, shift), s))(scales)
    primitives = {e.primitive.name for e in batched.jaxpr.eqns}
    assert "scan" in primitives and lapack_primitives(batched) == {"cholesky"}  # inside the loop body only
    np.testing.assert_allclose(map_batch(lambda x: chol(x, shift), scales), jax.vmap(lambda x: chol(x, shift))(scales))
    plain = jax.make_jaxpr(lambda s: map_batch(lambda x: jnp.sin(x) * shift, s))(scales)
    assert "scan" not in {e.primitive.name for e in plain.jaxpr.eqns}
    inside_jit = jax.jit(lambda s, m: map_batch(lambda x: chol(x, m), s))(scales, shift)  # closes over a tracer
    np.testing.assert_allclose(inside_jit, jax.vmap(lambda x: chol(x, shift))(scales))
