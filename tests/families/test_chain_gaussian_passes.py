"""Chain Gaussian passes: sequential (``lax.scan``), parallel (associative scan), d = 1.

Oracles (STYLE.md ladder): the dense inverse of the assembled precision
(dynamax ``joint_posterior_mvn``), ``mean_params == grad(log_normalizer)``,
sequential ≡ parallel, batched ≡ ``vmap``-ed ≡ one chain, and Monte Carlo within
k standard errors estimated from the samples.

Compiling the passes, above all the associative scan, is what these tests cost.
So every check on a batch of short chains reads one module-level jitted
:func:`pass_summary`, compiled once per (method, d) and shared by all tests and
parametrised cases here; the properties checked on it do not depend on the
chain length. One long chain checks sequential ≡ parallel.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.families import chain_gaussian as cg
from blrppl.families.base import entropy
from tests.compiles import cheap_jit

try:
    from tests.families.chain_oracles import (
        assert_trees_close,
        dense_moments,
        random_chain,
        take,
    )
except ImportError:  # ``tests`` is not a package: tests/families is on sys.path.
    from chain_oracles import assert_trees_close, dense_moments, random_chain, take

METHODS = ["sequential", "parallel"]
GAUSSIAN_FAMILIES = {
    "sequential": cg.CHAIN_GAUSSIAN,
    "parallel": cg.CHAIN_GAUSSIAN_PARALLEL,
}
# Odd and not a power of two, so the associative scan meets odd lengths at
# several levels; 13 steps of d = 2 still give ~400 statistics per sampling check.
NUM_STEPS = 13
BATCH = 3
SAMPLE_SHAPE = (2, 2000)


def batch_case(dim):
    """Three random chains (3, T, d) for the pass tests, built when a test asks."""
    return random_chain(jax.random.key(dim), NUM_STEPS, dim, (BATCH,))


@partial(cheap_jit, static_argnames="method")
def pass_summary(natural, rng_key, method):
    """Everything the tests read from a batch of chains, in one compiled call."""
    family = GAUSSIAN_FAMILIES[method]
    return {
        "moments": cg.moments(natural, method),
        "mean": family.mean_params(natural),
        "mapped_mean": jax.vmap(family.mean_params)(natural),
        "single_mean": family.mean_params(take(natural, 1)),
        "grad": jax.grad(lambda n: family.log_normalizer(n).sum())(natural),
        "log_normalizer": family.log_normalizer(natural),
        "entropy": entropy(family, natural),
        "samples": family.sample(rng_key, natural, SAMPLE_SHAPE),
        "is_valid": family.is_valid(natural),
    }


@partial(cheap_jit, static_argnames="method")
def mean_and_log_normalizer(natural, method):
    return cg.mean_params(natural, method), cg.log_normalizer(natural, method)


# Exactness against the dense Gaussian.


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [1, 2])
def test_chain_gaussian_matches_dense_conditioning(dim, method, rng_key):
    natural = batch_case(dim)
    out = pass_summary(natural, rng_key, method)
    for b in range(BATCH):
        expected = dense_moments(take(natural, b))
        (means, covs, cross), mean = take(out["moments"], b), take(out["mean"], b)
        scale = np.max(np.abs(expected["cov"]))
        np.testing.assert_allclose(means, expected["mean"], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(covs, expected["cov"], rtol=1e-8, atol=1e-10 * scale)
        np.testing.assert_allclose(
            cross, expected["cross"], rtol=1e-8, atol=1e-10 * scale
        )
        np.testing.assert_allclose(
            out["log_normalizer"][b], expected["log_normalizer"], rtol=1e-10
        )
        np.testing.assert_allclose(out["entropy"][b], expected["entropy"], rtol=1e-10)
        outer = expected["mean"][:, :, None] * expected["mean"][:, None, :]
        np.testing.assert_allclose(
            mean.xx, expected["cov"] + outer, rtol=1e-8, atol=1e-10 * scale
        )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [1, 2])
def test_chain_gaussian_mean_params_are_gradient_of_log_normalizer(
    dim, method, rng_key
):
    out = pass_summary(batch_case(dim), rng_key, method)
    assert_trees_close(out["mean"], out["grad"], rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_sequential_and_parallel_agree_on_a_long_chain():
    natural = random_chain(jax.random.key(7), 10_000, 1)
    mean_par, log_norm_par = mean_and_log_normalizer(natural, "parallel")
    mean_seq, log_norm_seq = mean_and_log_normalizer(natural, "sequential")
    assert_trees_close(mean_par, mean_seq, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(log_norm_par, log_norm_seq, rtol=1e-10)


# Samples.


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [1, 2])
def test_chain_gaussian_samples_match_moments(dim, method, rng_key):
    out = pass_summary(batch_case(dim), rng_key, method)
    means, covs, cross = out["moments"]
    xs = np.asarray(out["samples"]).reshape((-1, BATCH, NUM_STEPS, dim))
    num = xs.shape[0]
    centred = xs - np.asarray(means)
    products = {
        "mean": xs,
        "cov": centred[..., :, None] * centred[..., None, :],
        "cross": centred[:, :, :-1, :, None] * centred[:, :, 1:, None, :],
    }
    truth = {"mean": means, "cov": covs, "cross": cross}
    for name, values in products.items():
        standard_error = values.std(axis=0) / np.sqrt(num)
        # <= ~400 statistics at 5 standard errors: failure chance ~3e-4, no seed tuning.
        assert np.all(np.abs(values.mean(axis=0) - truth[name]) < 5 * standard_error), (
            name
        )


@pytest.mark.parametrize("dim", [1, 2])
def test_sequential_and_parallel_samplers_draw_the_same_paths(dim, rng_key):
    natural = batch_case(dim)
    np.testing.assert_allclose(
        pass_summary(natural, rng_key, "parallel")["samples"],
        pass_summary(natural, rng_key, "sequential")["samples"],
        rtol=1e-9,
        atol=1e-11,
    )


# Validity, batching, jit and vmap.


def test_chain_gaussian_is_valid():
    natural = random_chain(jax.random.key(18), NUM_STEPS, 2)
    is_valid = cheap_jit(cg.is_valid)
    assert bool(is_valid(natural))
    # J_55 -> -J_55 makes a pivot indefinite.
    flipped = natural._replace(xx=natural.xx.at[5].multiply(-1.0))
    assert not bool(is_valid(flipped))
    assert not bool(is_valid(natural._replace(x=natural.x.at[0, 0].set(jnp.nan))))


def test_checked_moments_are_the_moments_and_the_verdict_of_one_pass():
    """``checked_moments`` (what a BLR step reads: μ, A(λ) and is_valid from one
    forward-backward pass, here the scalar-state passes) equals the dense oracle
    on a valid chain and says invalid for one with an indefinite pivot or a NaN."""
    natural = jax.tree.map(np.array, batch_case(1))  # edited in numpy: no eager jax ops to compile
    natural.xx[1, 5] *= -1.0
    natural.x[2, 0, 0] = np.nan
    mean, log_norm, valid = cheap_jit(cg.checked_moments)(natural)
    np.testing.assert_array_equal(valid, [True, False, False])
    dense = dense_moments(jax.tree.map(lambda a: a[0], natural))
    np.testing.assert_allclose(mean.x[0], dense["mean"], rtol=1e-10)
    np.testing.assert_allclose(mean.xx[0], dense["cov"] + dense["mean"][:, :, None] * dense["mean"][:, None, :], rtol=1e-10)
    np.testing.assert_allclose(
        mean.x_next[0], dense["cross"] + dense["mean"][:-1, :, None] * dense["mean"][1:, None, :], rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(log_norm[0], dense["log_normalizer"], rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_chain_gaussian_batch_jit_and_vmap(method, rng_key):
    natural = batch_case(2)
    family = GAUSSIAN_FAMILIES[method]
    assert family.batch_shape(natural) == (BATCH,)
    out = pass_summary(natural, rng_key, method)
    assert_trees_close(out["mean"], out["mapped_mean"], rtol=1e-12)
    assert_trees_close(take(out["mean"], 1), out["single_mean"], rtol=1e-12)
    assert (
        out["log_normalizer"].shape
        == out["is_valid"].shape
        == out["entropy"].shape
        == (BATCH,)
    )
    assert bool(jnp.all(out["is_valid"]))
    assert out["samples"].shape == SAMPLE_SHAPE + (BATCH, NUM_STEPS, 2)
