"""The operation count on a jaxpr (blrppl/flops.py) against XLA's own cost analysis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blrppl
from blrppl.blr import driver
from blrppl.flops import jaxpr_flops

X = np.ones((1000, 20))
B = np.ones(20)


def _both(fun, *args):
    traced = jax.jit(fun).trace(*args)
    return jaxpr_flops(traced.jaxpr), traced.lower().cost_analysis()["flops"]


@pytest.mark.parametrize(
    "fun, args",
    [
        (lambda x, b: x @ b, (X, B)),
        (lambda x: jnp.einsum("ni,nj->ij", x, x), (X,)),
        (lambda x: x + 1.0, (X,)),
        (lambda x: jnp.sum(x * x, axis=-1), (X,)),
        (lambda x: jnp.where(x > 0, x, 0.0), (X,)),
        (lambda x, b: x * b / 3.0, (X, B)),
    ],
    ids=["matvec", "gram", "add", "sum_of_squares", "where", "broadcast"],
)
def test_the_count_of_plain_operations_is_xlas(fun, args):
    mine, xla = _both(fun, *args)
    assert mine == pytest.approx(xla, rel=0.05)  # (a reduction of n: XLA counts n - 1)


def test_loops_count_their_body_once_and_a_cond_its_dearest_branch():
    def body(c):
        i, x = c
        return i + 1, x @ x

    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 10, body, (0, x))[1]

    m = np.ones((50, 50))
    assert jaxpr_flops(jax.make_jaxpr(loop)(m)) == pytest.approx(2 * 50**3 + 2, rel=0.01)
    scanned = jax.make_jaxpr(lambda x: jax.lax.scan(lambda c, _: (c @ c, None), x, None, length=7)[0])(m)
    assert jaxpr_flops(scanned) == pytest.approx(2 * 50**3, rel=0.01)
    branches = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, lambda y: y @ y, lambda y: y + 1.0, x))(True, m)
    assert jaxpr_flops(branches) == pytest.approx(2 * 50**3, rel=0.01)


def test_a_factorisation_costs_lapacks_count():
    m = np.eye(60)
    count = jaxpr_flops(jax.make_jaxpr(jnp.linalg.cholesky)(m))
    assert 60**3 / 3 <= count < 2 * 60**3 / 3  # the factorisation, and the symmetrisation around it


def test_a_fits_step_loop_is_counted_within_2x_of_xla():
    """The count that chooses a loop's compile options (compile_mode.LOOP_FLOP_BUDGET), on a real
    loop: a hierarchical logistic regression's, which the budget takes cheap at 200 steps."""
    from models import styles

    model, data = styles.MODELS["logistic_random_intercepts"]
    args, kwargs = data()
    engine = blrppl.NonConjugateVI(model)
    plan = engine.plan(*args, **kwargs)
    algorithm = engine.build(plan)
    state = jax.eval_shape(algorithm.init, jax.random.key(0), plan.arrays)
    threshold, buffer, previous, hits = driver._loop_inputs(200, None)
    zero = np.zeros((), np.int32)
    traced = driver._run_chunk.optimized.trace(algorithm, plan.arrays, state, buffer, zero, zero, previous, hits, threshold)
    mine, xla = jaxpr_flops(traced.jaxpr), traced.lower().cost_analysis()["flops"]
    assert 0.5 * xla <= mine <= 2 * xla
