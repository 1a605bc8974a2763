"""A sparse Hessian rebuilt from a few products (blrppl.sparse_hessian)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.sparse_hessian import agrees, compression, hessian_from_products, probe
from tests.compiles import cheap_jit


def symmetric(pattern, rng):
    values = np.where(pattern, rng.normal(size=pattern.shape), 0.0)
    return np.triu(values) + np.triu(values, 1).T


def arrow(groups, dense, rng):
    """A hierarchical model's Hessian: ``groups`` effects that meet only themselves and ``dense``
    hyperparameters that meet everything."""
    dim = groups + dense
    pattern = np.eye(dim, dtype=bool)
    pattern[:, groups:] = pattern[groups:, :] = True
    order = rng.permutation(dim)  # the dense columns anywhere
    return symmetric(pattern[np.ix_(order, order)], rng)


@pytest.mark.parametrize("seed", range(6))
def test_any_pattern_is_rebuilt_exactly_from_its_products(seed):
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(2, 60))
    pattern = rng.random((dim, dim)) < rng.choice([0.02, 0.1, 0.4])
    pattern[rng.integers(0, dim, 3)] = True  # some dense rows
    hessian = symmetric(pattern | pattern.T, rng)
    plan = compression(pattern | pattern.T)
    assert plan.num_products <= dim
    rebuilt = hessian_from_products(jnp.asarray(hessian @ plan.seeds), plan)
    np.testing.assert_array_equal(np.asarray(rebuilt), hessian)


def test_an_arrow_takes_one_product_per_dense_column_and_one_for_the_rest():
    rng = np.random.default_rng(0)
    hessian = arrow(85, 4, rng)
    plan = compression(hessian != 0)
    assert plan.num_products == 5
    np.testing.assert_array_equal(np.asarray(hessian_from_products(jnp.asarray(hessian @ plan.seeds), plan)), hessian)


def test_block_diagonal_effects_share_products():
    rng = np.random.default_rng(1)
    blocks = [rng.normal(size=(3, 3)) for _ in range(20)]
    hessian = np.zeros((60, 60))
    for i, b in enumerate(blocks):
        hessian[3 * i : 3 * i + 3, 3 * i : 3 * i + 3] = b + b.T
    plan = compression(hessian != 0)
    assert plan.num_products == 3
    np.testing.assert_array_equal(np.asarray(hessian_from_products(jnp.asarray(hessian @ plan.seeds), plan)), hessian)


def test_the_probe_catches_a_nonzero_the_pattern_missed():
    rng = np.random.default_rng(2)
    hessian = arrow(30, 2, rng)
    plan = compression(hessian != 0)
    moved = hessian.copy()
    i, j = [k for k in range(32) if abs(hessian[k]).sum() > 0 and np.count_nonzero(hessian[k]) == 3][:2]
    moved[i, j] = moved[j, i] = 0.5  # two effects now meet: a nonzero the pattern has not got
    direction = probe(32, np.float64)
    rebuilt = hessian_from_products(jnp.asarray(moved @ plan.seeds), plan)
    assert not bool(agrees(rebuilt, jnp.asarray(direction), jnp.asarray(moved @ direction)))
    same = hessian_from_products(jnp.asarray(hessian @ plan.seeds), plan)
    assert bool(agrees(same, jnp.asarray(direction), jnp.asarray(hessian @ direction)))


def test_the_rebuilt_hessian_of_a_function_equals_its_dense_hessian():
    """Through automatic differentiation, as the linear-response check pushes it."""
    rng = np.random.default_rng(3)
    index = jnp.asarray(rng.integers(0, 40, 300))
    x = jnp.asarray(rng.normal(size=300))

    def log_joint(u):
        effects, mu, log_scale, beta = u[:40], u[40], u[41], u[42]
        prior = -0.5 * jnp.sum((effects - mu) ** 2) * jnp.exp(-2 * log_scale) - 40 * log_scale
        return prior - 0.5 * jnp.sum((x - effects[index] - beta * x**2) ** 2)

    u = jnp.asarray(rng.normal(size=43))
    dense = np.asarray(cheap_jit(jax.hessian(log_joint))(u))  # (each one program, not op by op)
    plan = compression(dense != 0)
    assert plan.num_products == 4
    products = cheap_jit(jax.vmap(lambda s: jax.jvp(jax.grad(log_joint), (u,), (s,))[1], out_axes=1))(jnp.asarray(plan.seeds.T))
    rebuilt = cheap_jit(lambda p: hessian_from_products(p, plan))(products)
    np.testing.assert_allclose(np.asarray(rebuilt), dense, rtol=1e-12, atol=1e-12)


def test_a_dense_column_is_read_whole_even_where_the_learnt_pattern_had_zeros():
    """A covariate that happened to be 0 in every row of some group leaves zeros in its column at
    the first data; the next data fill them, and the rebuilt Hessian must have them."""
    rng = np.random.default_rng(4)
    hessian = arrow(40, 3, rng)
    learnt = hessian.copy()
    dense = int(np.argmax(np.count_nonzero(hessian, axis=0)))
    effects = [k for k in range(43) if np.count_nonzero(hessian[k]) == 4][:5]
    learnt[effects, dense] = learnt[dense, effects] = 0.0
    plan = compression(learnt != 0)
    assert plan.num_products == 4
    np.testing.assert_array_equal(np.asarray(hessian_from_products(jnp.asarray(hessian @ plan.seeds), plan)), hessian)
