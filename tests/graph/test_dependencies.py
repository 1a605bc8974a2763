"""Dependency analysis on jaxprs: per output, precise through control flow."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan

import blrppl
from blrppl.graph.dependencies import ScanTag, output_dependencies


def _inputs(analysis):
    return [analysis.inputs_of(k) for k in range(len(analysis.outputs))]


def test_straight_line_code():
    def f(a, b, c):
        return a + b, jnp.sin(c) * 2.0, jnp.ones(3), a[None] @ jnp.ones((1, 1))

    analysis = output_dependencies(f, 1.0, 2.0, 3.0)
    assert _inputs(analysis) == [{0, 1}, {2}, set(), {0}]


def test_scan_is_per_output_and_reaches_a_fixed_point():
    def f(a, b, c):
        def body(carry, x):
            first, second = carry
            # ``first`` takes ``second``'s dependencies only after one step.
            return (second, b), first * x

        (first, second), ys = jax.lax.scan(body, (a, c), jnp.arange(3.0))
        return first, second, ys

    analysis = output_dependencies(f, 1.0, 2.0, 3.0)
    assert _inputs(analysis) == [{0, 1, 2}, {1, 2}, {0, 1, 2}]
    tags = {analysis.scans_of(k) for k in range(3)}
    assert tags == {frozenset({ScanTag(0)})}
    assert analysis.scan_init == {ScanTag(0): frozenset({0, 2})}


def test_scan_keeps_independent_carries_apart():
    def f(a, b):
        def body(carry, _):
            x, y = carry
            return (x + 1.0, y * 2.0), x

        (x, y), xs = jax.lax.scan(body, (a, b), None, length=4)
        return x, y, xs

    assert _inputs(output_dependencies(f, 1.0, 2.0)) == [{0}, {1}, {0}]


def test_while_cond_and_calls():
    def f(a, b, c):
        w = jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * a), (0, b))
        branch = jax.lax.cond(c > 0, lambda x: x + 1.0, lambda x: x * 2.0, a)
        called = jax.jit(lambda x: x * 2.0)(b)
        smooth = jax.nn.softplus(c)  # custom_jvp inside jit
        return w[1], branch, called, smooth

    assert _inputs(output_dependencies(f, 1.0, 2.0, 3.0)) == [{0, 1}, {0, 2}, {1}, {2}]


def test_scan_model_neighbours_are_precise():
    """Two unrelated series in one scan body stay unrelated (get_model_relations joins them)."""

    def model(obs):
        def step(x_prev, o_t):
            x = numpyro.sample("x", dist.Normal(x_prev, 1.0))
            w = numpyro.sample("w", dist.Normal(0.0, 1.0))
            numpyro.sample("o", dist.Normal(x, 1.0), obs=o_t)
            return x, w

        scan(step, 0.0, obs)

    fg = blrppl.trace(model, jnp.zeros(5))
    assert fg.factors["o"].neighbours == ("x",)
    assert fg.factors["w"].neighbours == ("w",)
    assert fg.factors["x"].neighbours == ("x",)
    assert fg.variables["x"].family == "ChainGaussian"
    assert fg.variables["w"].family == "Normal"
    assert fg.variables["w"].chain is None
