"""Constants of the symbolic analysis evaluated in numpy (``blrppl.graph.host``).

numpy's transcendental functions and sums agree with XLA's to 1e-13 (edge
values exactly; XLA:CPU's own log1p is up to ~70 ulps off near -0.4, where
numpy's is correctly rounded), and an analysis whose constants are logs, powers and
log-gammas of data compiles no program for them, with the same expected log
factor as XLA's evaluation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammaln

from blrppl.symbolic import canonical as C
from blrppl.graph import host
from blrppl.symbolic import interpret
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value
from tests.compiles import compilations

_EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, 1e300, -3.5, 7.25, 710.0, -745.5, np.inf, -np.inf, np.nan])


@pytest.mark.parametrize(
    "name, jax_fn, params",
    [
        ("exp", jnp.exp, {}), ("log", jnp.log, {}), ("log1p", jnp.log1p, {}), ("expm1", jnp.expm1, {}),
        ("tanh", jnp.tanh, {}), ("logistic", jax.nn.sigmoid, {}), ("sin", jnp.sin, {}), ("cos", jnp.cos, {}),
        ("lgamma", gammaln, {}), ("exp2", jnp.exp2, {}),
        ("integer_pow", lambda x: x**3, {"y": 3}), ("integer_pow", lambda x: x**-2, {"y": -2}),
    ],
)
def test_numpy_functions_agree_with_xla(name, jax_fn, params):
    rng = np.random.default_rng(0)
    x = np.concatenate([_EDGES, rng.normal(0.0, 3.0, 200), rng.uniform(0.0, 50.0, 200)])
    mine = host.evaluate(name, params, [x], np.float64, x.shape, approximate=True)
    theirs = np.asarray(jax.jit(jax_fn)(x))
    assert mine is not None and mine.dtype == np.float64
    np.testing.assert_array_equal(np.isnan(mine), np.isnan(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_array_equal(mine[~finite], theirs[~finite])
    np.testing.assert_allclose(mine[finite], theirs[finite], rtol=1e-13, atol=1e-15)  # lgamma near its roots: absolute
    assert host.evaluate(name, params, [x], np.float64, x.shape) is None  # only where asked for


def test_sums_and_integer_arithmetic():
    x = np.random.default_rng(1).normal(size=(7, 300))
    total = host.evaluate("reduce_sum", {"axes": (1,), "out_sharding": None}, [x], np.float64, (7,), approximate=True)
    np.testing.assert_allclose(total, np.asarray(jnp.sum(x, axis=1)), rtol=1e-14)
    big = np.array([2**62, -(2**62)], np.int64)
    wrapped = host.evaluate("add", {}, [big, big], np.int64, (2,))
    np.testing.assert_array_equal(wrapped, np.asarray(jax.lax.add(big, big)))  # wraps as XLA does
    # Integer division and remainder truncate toward zero, as XLA's (numpy's // floors); a zero
    # divisor is left to XLA.
    a, b = np.array([7, -7, 7, -7, 0]), np.array([2, 2, -2, -2, 3])
    for name, reference in (("div", jax.lax.div), ("rem", jax.lax.rem)):
        got = host.evaluate(name, {}, [a, b], np.int64, (5,))
        np.testing.assert_array_equal(got, np.asarray(reference(jnp.asarray(a), jnp.asarray(b))))
    assert host.evaluate("div", {}, [a, np.array([2, 0, 1, 1, 1])], np.int64, (5,)) is None


def test_an_analysis_with_transcendental_constants_compiles_no_program_for_them():
    rng = np.random.default_rng(2)
    counts = rng.poisson(3.0, 41).astype(float)  # a shape no other test evaluates eagerly
    weights = rng.uniform(0.5, 2.0, 41)

    def log_factor(values):  # constants: log of data, a power, lgamma, exp and a sum
        rate = values["a"] * jnp.exp(jnp.log(weights) ** 2) * jnp.sum(weights)
        return jnp.sum(C._poisson(counts, rate) - gammaln(counts + 1.0) * weights**3)

    infos = {"a": VarInfo("gamma", (), 0)}
    examples = {"a": jnp.asarray(1.3)}
    with compilations() as messages:
        analysis = analyse(log_factor, examples, infos)
    names = [m.split()[1] for m in messages]
    assert not [n for n in names if n in ("jit(log)", "jit(exp)", "jit(lgamma)", "jit(integer_pow)")], names
    stats = {"a": {"x": jnp.asarray(1.7), "log_x": jnp.asarray(0.41)}}
    mine = expected_value(analysis, stats, None)

    bound = interpret._bind  # XLA's evaluation of every constant, as before
    try:
        interpret.host_bind = lambda *a: None
        xla = analyse(log_factor, examples, infos)
    finally:
        interpret.host_bind = host.host_bind
    assert interpret._bind is bound
    np.testing.assert_allclose(mine, expected_value(xla, stats, None), rtol=1e-14)


def test_constant_calls_are_evaluated_in_numpy_or_compiled_whole():
    x = np.linspace(0.1, 2.0, 43)
    scaled_log = jax.jit(lambda a: jnp.log(a) * 2.0 + 1.0)  # numpy evaluates every equation
    matrix = np.eye(5) * 2.0 + 0.1  # its inverse needs XLA (an LU factorisation)
    infos = {"a": VarInfo("gaussian", (), 0)}
    stats = {"a": {"x": jnp.asarray(0.3), "xx": jnp.asarray(0.5)}}

    def log_factor(values):
        inverse = jnp.linalg.inv(matrix)
        return jnp.sum(C._normal(x, values["a"] * scaled_log(x), 1.0)) + values["a"] * jnp.sum(inverse)

    with compilations() as messages:
        analysis = analyse(log_factor, {"a": jnp.asarray(0.3)}, infos)
    names = [m.split()[1] for m in messages]
    assert "jit(<lambda>)" not in names and "jit(log)" not in names, names
    assert names.count("jit(inv)") <= 1 and "jit(lu)" not in names, names  # one program, not one per operation
    expected = jnp.sum(-0.5 * (x - 0.3 * (np.log(x) * 2.0 + 1.0)) ** 2 - 0.5 * np.log(2 * np.pi))
    linear_coefficient = float(np.sum(np.linalg.inv(matrix)))
    value = expected_value(analysis, stats, None)
    # E[log f] at a point mass mean 0.3 (xx = 0.5 adds the variance term of the quadratic)
    variance = 0.5 - 0.3**2
    quadratic = 0.5 * variance * np.sum((np.log(x) * 2.0 + 1.0) ** 2)
    np.testing.assert_allclose(value, expected - quadratic + 0.3 * linear_coefficient, rtol=1e-12)


@pytest.mark.parametrize("name, jax_fn", [("exp", jnp.exp), ("log", jnp.log), ("lgamma", gammaln),
                                          ("logistic", jax.nn.sigmoid), ("tanh", jnp.tanh)])
def test_float32_constants_stay_float32_and_agree(name, jax_fn):
    x = np.random.default_rng(3).uniform(0.05, 20.0, 300).astype(np.float32)
    mine = host.evaluate(name, {}, [x], np.float32, x.shape, approximate=True)
    assert mine.dtype == np.float32
    # float32 ulps; XLA:CPU's own lgamma is up to 8e-6 off near its roots, numpy's 2e-6
    np.testing.assert_allclose(mine, np.asarray(jax.jit(jax_fn)(x)), rtol=2e-6, atol=1e-5)


_GATHERS = {
    "rows": lambda x, i: x[i],
    "columns": lambda x, i: x[:, i % 4],
    "pairs": lambda x, i: x[i, i % 4],
    "around a slice": lambda x, i: x[i, :, i % 3],
    "last axis": lambda x, i: x[..., i % 3],
    "broadcast indices": lambda x, i: x[i[:2, None], i % 4],
    "scalar index": lambda x, i: x.ravel()[i[1]],
    "fill out of bounds": lambda x, i: x.at[i + 3].get(mode="fill"),
    "fill value": lambda x, i: x.at[i + 3].get(mode="fill", fill_value=-1),
    "clip": lambda x, i: x.at[i - 2].get(mode="clip"),
    "dynamic slice": lambda x, i: jax.lax.dynamic_slice(x, (i[1], 1, 0), (2, 2, 3)),
    "vmapped rows": lambda x, i: jax.vmap(lambda row, j: row[j])(x, i[:5] % 4),
    "vmapped columns": lambda x, i: jax.vmap(lambda row, j: row[:, j])(x, i[:5] % 3),
    "vmapped pairs": lambda x, i: jax.vmap(lambda row, j: row[j, j % 3])(x, i[:5] % 4),
    "vmapped twice": lambda x, i: jax.vmap(jax.vmap(lambda r, j: r[j], in_axes=(0, None)))(x, i[:5] % 3),
    "vmapped fill": lambda x, i: jax.vmap(lambda row, j: row.at[j + 2].get(mode="fill", fill_value=-7))(x, i[:5]),
}


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_gathers_and_dynamic_slices_equal_xla(dtype):
    """Index remapping (a model's ``x[idx]``, vmapped in a scan body) in numpy, bit for bit."""
    operand = np.random.default_rng(3).normal(size=(5, 4, 3)).astype(dtype)
    indices = np.array([0, 4, 2, 1, 3, 2])
    checked = set()
    for name, fn in _GATHERS.items():
        closed = jax.make_jaxpr(fn)(operand, indices)
        env = dict(zip(closed.jaxpr.invars, (operand, indices)))
        env.update(zip(closed.jaxpr.constvars, map(np.asarray, closed.consts)))
        for eqn in closed.jaxpr.eqns:
            args = [np.asarray(v.val) if hasattr(v, "val") else env[v] for v in eqn.invars]
            outs = eqn.primitive.bind(*map(jnp.asarray, args), **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            if eqn.primitive.name in ("gather", "dynamic_slice"):
                (out,) = eqn.outvars
                mine = host.evaluate(eqn.primitive.name, eqn.params, args, np.dtype(out.aval.dtype), out.aval.shape)
                assert mine is not None, name
                np.testing.assert_array_equal(mine, np.asarray(outs[0]), err_msg=name)
                checked.add(name)
            env.update(zip(eqn.outvars, map(np.asarray, outs)))
    assert checked == set(_GATHERS)
