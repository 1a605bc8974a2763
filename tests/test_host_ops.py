"""Planning's small eager operations are computed with numpy: nothing compiles (blrppl.host_ops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import lax

import blrppl
from blrppl.eager_ops import cheap_eager_ops
from tests.compiles import compilations, compiled_names

RNG = np.random.default_rng(0)
A = jnp.asarray(RNG.normal(size=(3, 4)))
B = jnp.asarray(RNG.normal(size=(3, 4)))
P = jnp.asarray(np.abs(np.asarray(A)) + 0.1)
I = jnp.asarray(RNG.integers(-5, 5, size=(3, 4)))
RAW_KEY = jax.random.key_data(jax.random.key(5))

CASES = {
    "add": lambda: jnp.add(A, B),
    "sub mul div": lambda: (A - B) * A / P,
    "scalar weak": lambda: jnp.asarray(A) * 2.0 + 1,
    "integer": lambda: jnp.asarray(I) * 3 - 1,
    "rem max min": lambda: (lax.rem(jnp.asarray(A), jnp.asarray(P)), jnp.maximum(A, B), jnp.minimum(A, B)),
    "pow": lambda: (jnp.power(P, B), lax.integer_pow(jnp.asarray(A), 3), jnp.square(A)),
    "compare": lambda: (A < B, A <= B, A == A, A != B, A > 0, A >= B),
    "logic": lambda: (jnp.logical_and(A > 0, B > 0), jnp.logical_or(A > 0, B > 0), ~(A > 0)),
    "unary": lambda: (jnp.exp(A), jnp.log(P), jnp.log1p(P), jnp.expm1(A), jnp.sqrt(P), lax.rsqrt(jnp.asarray(P))),
    "more unary": lambda: (jnp.tanh(A), jnp.sin(A), jnp.cos(A), jnp.abs(A), jnp.sign(A), -jnp.asarray(A)),
    "special": lambda: (jax.nn.sigmoid(A), jax.scipy.special.gammaln(P), jax.scipy.special.digamma(P)),
    "round": lambda: (jnp.floor(A * 3), jnp.ceil(A * 3), jnp.round(A * 3), jnp.clip(A, -0.5, 0.5)),
    "cast": lambda: (jnp.asarray(A).astype(jnp.float32), jnp.asarray(I).astype(float), (A > 0).astype(int)),
    "shapes": lambda: (jnp.reshape(A, (4, 3)), jnp.transpose(A), A[None, :, None], jnp.broadcast_to(A[0], (5, 4))),
    "iota eye": lambda: (jnp.arange(7), jnp.eye(4), jnp.eye(3, 5, k=1)),
    "where": lambda: jnp.where(A > 0, A, B),
    "slices": lambda: (jnp.asarray(A)[1:, ::2], lax.dynamic_slice(jnp.asarray(A), (1, 2), (2, 2)), jnp.flip(A, 0)),
    "update": lambda: lax.dynamic_update_slice(jnp.asarray(A), jnp.ones((2, 2)), (2, 3)),
    "join": lambda: (jnp.concatenate([A, B], axis=1), jnp.stack([A, B]), jnp.pad(A, ((1, 0), (0, 2)))),
    "reduce": lambda: (jnp.sum(A, axis=0), jnp.max(A), jnp.min(A, axis=1), jnp.prod(P), jnp.all(A > -9), jnp.any(A > 9)),
    "cumulative": lambda: (jnp.cumsum(A, axis=1), jnp.cumprod(P, axis=0)),
    "dot": lambda: (A @ B.T, jnp.einsum("ij,kj->ik", A, B), jnp.einsum("bi,bi->b", A, B), jnp.outer(A[0], B[1])),
    "several outputs": lambda: (jnp.unstack(A), jnp.split(A, [1, 3], axis=1)),
    "raw key split": lambda: (jax.random.split(RAW_KEY), jax.random.split(RAW_KEY, (2, 3))),  # as NumPyro splits
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_operations_in_planning_compile_nothing_and_equal_xla(name):
    expected = jax.jit(CASES[name])()
    with compilations() as compiled, cheap_eager_ops():
        got = CASES[name]()
    assert compiled_names(compiled) == []
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert isinstance(g, jax.Array)
        assert g.shape == e.shape and g.dtype == e.dtype and g.weak_type == e.weak_type, (g, e)
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-13, atol=1e-15)  # (an ulp or two)


def test_float32_operations_keep_their_precision():
    a32 = jnp.asarray(A, jnp.float32)
    expected = jax.jit(lambda: jnp.exp(a32) * 0.5 + a32 @ a32.T[:, :1])()
    with cheap_eager_ops():
        got = jnp.exp(a32) * 0.5 + a32 @ a32.T[:, :1]
    assert got.dtype == jnp.float32 and not got.weak_type
    np.testing.assert_allclose(got, expected, rtol=2e-6)


def test_what_no_rule_covers_compiles_as_before():
    x = jnp.asarray(A)
    with compilations() as compiled, cheap_eager_ops():
        got = jnp.sort(x, axis=1), jax.random.normal(jax.random.key(3), (2,))
    assert compiled_names(compiled)  # sorted, random bits: compiled (cheaply)
    np.testing.assert_array_equal(got[0], np.sort(np.asarray(A), axis=1))
    np.testing.assert_array_equal(got[1], jax.jit(lambda: jax.random.normal(jax.random.key(3), (2,)))())


def kernel_model(x, y=None):
    """A GP-like model whose host trace runs many eager operations on data and latents."""
    var = numpyro.sample("var", dist.LogNormal(0.0, 1.0))
    length = numpyro.sample("length", dist.LogNormal(0.0, 1.0))
    k = var * jnp.exp(-0.5 * ((x[:, None] - x) / length) ** 2) + 0.1 * jnp.eye(x.shape[0])
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k), obs=y)


def test_planning_a_model_compiles_none_of_its_own_operations():
    x = jnp.linspace(-1.0, 1.0, 13)  # shapes no other test uses
    y = jnp.sin(3.0 * x)
    with compilations() as compiled:
        blrppl.NonConjugateVI(kernel_model).plan(x, y=y)
    one_op = [n for n in compiled_names(compiled) if n in {"jit(add)", "jit(multiply)", "jit(exp)", "jit(subtract)",
                                                          "jit(true_divide)", "jit(_power)", "jit(broadcast_in_dim)"}]
    assert one_op == []


GATHERS = {
    "rows": lambda x, i: x[i],
    "cells": lambda x, i: x[i, 1],
    "columns": lambda x, i: x[:, i],
    "pairs": lambda x, i: x[i, i % 4],
    "negative": lambda x, i: x[-i - 1],
    "take clip": lambda x, i: jnp.take(x, i + 7, axis=0, mode="clip"),
    "take fill": lambda x, i: jnp.take(x, i + 2, axis=0, mode="fill", fill_value=-1.0),
    "matrix index": lambda x, i: x[jnp.reshape(i, (2, 2))],
    "dynamic row": lambda x, i: x[i[0]],
}


@pytest.mark.parametrize("name", sorted(GATHERS))
def test_gathers_equal_xla(name):
    x = jnp.asarray(RNG.normal(size=(5, 4)))
    i = jnp.asarray([0, 3, 1, 4])
    expected = jax.jit(GATHERS[name])(x, i)
    with compilations() as compiled, cheap_eager_ops():
        got = GATHERS[name](x, i)
    assert "jit(gather)" not in compiled_names(compiled)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_cholesky_and_triangular_solves_equal_xla():
    m = RNG.normal(size=(4, 4))
    spd = jnp.asarray(m @ m.T + 4 * np.eye(4))
    rhs = jnp.asarray(RNG.normal(size=(4, 2)))

    def linear_algebra():
        chol = jnp.linalg.cholesky(spd)
        return (
            chol,
            jax.scipy.linalg.solve_triangular(chol, rhs, lower=True),
            jax.scipy.linalg.solve_triangular(chol, rhs, lower=True, trans=1),
            jax.lax.linalg.triangular_solve(chol, rhs.T, left_side=False, lower=True),
        )

    expected = jax.jit(linear_algebra)()
    with compilations() as compiled, cheap_eager_ops():
        got = linear_algebra()
    assert compiled_names(compiled) == []
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-12, atol=1e-14)
    with cheap_eager_ops():  # not positive definite: XLA's NaNs, compiled
        assert np.isnan(np.asarray(jnp.linalg.cholesky(-spd))).any()


def test_operands_placed_on_purpose_compile_as_jax_would():
    """A committed operand keeps XLA's placement (numpy's result would land uncommitted)."""
    placed = jax.device_put(A, jax.devices()[0])
    assert placed.committed
    with cheap_eager_ops():
        got = placed * 2.0
    assert got.committed
    np.testing.assert_array_equal(got, np.asarray(A) * 2.0)


SPECIAL = jnp.asarray([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e308, 3.0, -3.0, 1.0, -1.0, -4.0])
OTHER = jnp.asarray([1.0, np.nan, 2.0, 0.0, -0.0, 0.5, 2.0, -1.5, 0.0, 3.0, 2.0, -np.inf, 1.0, 0.0, -2.0, 0.25])
EDGES = {
    "elementwise": lambda: (jnp.sign(SPECIAL), jnp.maximum(SPECIAL, OTHER), jnp.minimum(SPECIAL, OTHER),
                            lax.rem(SPECIAL, OTHER), SPECIAL / OTHER, SPECIAL * OTHER, jnp.power(SPECIAL, OTHER)),
    "rounding": lambda: (jnp.round(SPECIAL), jnp.floor(SPECIAL), jnp.ceil(SPECIAL)),
    "transcendental": lambda: (jnp.exp(SPECIAL), jnp.log(SPECIAL), jnp.log1p(SPECIAL), jnp.sqrt(SPECIAL),
                               jnp.tanh(SPECIAL), jax.nn.sigmoid(SPECIAL), jax.nn.softplus(SPECIAL)),
    "special functions": lambda: (lax.lgamma(SPECIAL), lax.digamma(SPECIAL), lax.erf(SPECIAL), lax.erf_inv(SPECIAL)),
    "saturating casts": lambda: (jnp.where(jnp.isfinite(SPECIAL), SPECIAL, 0.0).astype(jnp.int32), SPECIAL.astype(bool)),
    "composites": lambda: (jnp.logaddexp(SPECIAL, OTHER), jnp.nan_to_num(SPECIAL), jax.scipy.special.xlogy(SPECIAL, OTHER),
                           jax.scipy.special.logsumexp(SPECIAL[3:])),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_special_values_follow_xla_s_conventions(name):
    """NaN, infinities, signed zeros, halves, poles and overflow as XLA computes them (a float cast
    to an integer saturates, lgamma(-inf) is inf, digamma is NaN at its poles)."""
    expected = jax.jit(EDGES[name])()
    with cheap_eager_ops():
        got = EDGES[name]()
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-13, atol=1e-15, equal_nan=True)


def test_debug_nans_still_raises_in_planning():
    with jax.debug_nans(True), cheap_eager_ops(), pytest.raises(FloatingPointError):
        jnp.log(-A)


@pytest.mark.parametrize("shape", [(1,), (2,), (5,), (2, 3)])
def test_threefry_splits_on_the_host_are_jax_s_bit_for_bit(shape):
    from blrppl import host_prng

    rng = np.random.default_rng(len(shape) * 10 + shape[-1])
    for _ in range(20):
        key = jax.random.fold_in(jax.random.key(int(rng.integers(0, 2**31))), int(rng.integers(0, 2**31)))
        expected = np.asarray(jax.random.key_data(jax.random.split(key, shape)))
        got = host_prng.split(host_prng.from_jax(key), shape)
        np.testing.assert_array_equal(got.data, expected)
        np.testing.assert_array_equal(jax.random.key_data(host_prng.to_jax(got)), expected)


def keyed_scan(raw_key, x0, xs, rate, typed_key=None):
    """A scan as NumPyro's ``scan`` runs one: a raw key carried and split at every step (one half
    unused), a state moved by the observations; ``typed_key``: a typed key carried and split too."""

    def step(carry, x):
        raw, typed, state = carry
        raw = jax.random.split(raw)[0]  # a raw (uint32) key, as NumPyro keeps them
        typed = None if typed is None else jax.random.split(typed)[0]
        state = rate * state + jnp.sqrt(1.0 + x * x) - x / 3.0
        return (raw, typed, state), (state, jnp.where(x > 0, state, -state))

    return jax.lax.scan(step, (raw_key, typed_key, x0), xs)


def assert_equal_loops(got, expected):
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        if jax.dtypes.issubdtype(e.dtype, jax.dtypes.extended):
            g, e = jax.random.key_data(g), jax.random.key_data(e)
        assert g.dtype == e.dtype and g.shape == e.shape and g.weak_type == e.weak_type
        np.testing.assert_allclose(g, e, rtol=1e-13)  # bit for bit for the keys (integers)


def test_a_short_scan_runs_by_its_body_in_numpy_and_equals_the_compiled_loop():
    from blrppl.eager_loops import loops_compiled_once

    args = (jax.random.key_data(jax.random.key(7)), jnp.asarray(0.3), jnp.asarray(RNG.normal(size=17)), 0.9)
    with compilations() as compiled, loops_compiled_once(), cheap_eager_ops():
        got = keyed_scan(*args)
    assert "jit(run)" not in compiled_names(compiled)  # the loop program of blrppl.eager_loops
    assert_equal_loops(got, jax.jit(keyed_scan, static_argnums=3)(*args))


def two_input_scan(x0, xs, ys, reverse):
    def step(c, inp):
        x, y = inp
        c = c * 0.5 + x * jnp.sum(y)
        return c, (c, x + 1, y * c)

    return jax.lax.scan(step, x0, (xs, ys), reverse=reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [0, 1, 6])
def test_scans_in_numpy_read_their_inputs_in_order_and_stack_their_outputs(reverse, length):
    from blrppl.eager_loops import loops_compiled_once

    args = (jnp.asarray(0.2), jnp.asarray(RNG.normal(size=length)), jnp.asarray(RNG.normal(size=(length, 3))))
    with compilations() as compiled, loops_compiled_once(), cheap_eager_ops():
        got = two_input_scan(*args, reverse)
    assert compiled_names(compiled) == []
    assert_equal_loops(got, jax.jit(two_input_scan, static_argnums=3)(*args, reverse))


@pytest.mark.parametrize("case", ["long", "typed key"])
def test_a_scan_numpy_does_not_cover_is_compiled_as_before(monkeypatch, case):
    from blrppl import host_ops
    from blrppl.eager_loops import loops_compiled_once

    if case == "long":
        monkeypatch.setattr(host_ops, "MAX_SCAN_EQUATIONS", 10)
    xs = jnp.asarray(RNG.normal(size=23 if case == "long" else 19))  # lengths no other test uses
    args = (jax.random.key_data(jax.random.key(1)), jnp.asarray(0.1), xs, 0.5, jax.random.key(2) if case != "long" else None)
    with compilations() as compiled, loops_compiled_once(), cheap_eager_ops():
        got = keyed_scan(*args)
    assert "jit(run)" in compiled_names(compiled)
    assert_equal_loops(got, jax.jit(keyed_scan, static_argnums=3)(*args))


@pytest.mark.parametrize("name", ["stochastic_volatility", "radon", "logistic_regression"])
def test_planning_compiles_nothing_but_the_replanner(name):
    """A state-space model's scans and key splits, a hierarchical model's Gaussian starts from
    its priors, a GLM's design matrix (its basis cast under an abstract sharding that places
    nothing): all on the host."""
    from models import ZOO

    entry = ZOO[name]
    args, kwargs = entry.data()
    with compilations() as compiled:
        blrppl.NonConjugateVI(entry.model).plan(*args, **kwargs)
    assert set(compiled_names(compiled)) <= {"jit(replan)"}
