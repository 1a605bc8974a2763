"""The chain Categorical family (an HMM posterior) against K^T enumeration.

Oracles (STYLE.md ladder): brute-force enumeration of every path (dynamax
``big_log_joint``), ``mean_params == grad(log_normalizer)``, round trips up to
the gauge freedom of the potentials, and Monte Carlo within k standard errors.
Every check on one chain reads the module-level jitted :func:`summary`, so the
forward-backward passes compile once for the shared (T, K) shape.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from blrppl.errors import ModelError
from blrppl.families import chain_categorical as cc
from blrppl.families.base import entropy
from tests.compiles import cheap_jit

try:
    from tests.families.chain_oracles import (
        assert_trees_close,
        enumerate_chain,
        random_potentials,
    )
except ImportError:  # ``tests`` is not a package: tests/families is on sys.path.
    from chain_oracles import assert_trees_close, enumerate_chain, random_potentials

NUM_STEPS, NUM_CATEGORIES = 6, 3  # 3^6 = 729 paths to enumerate
NUM_SAMPLES = 20_000


def case(seed):
    """Random potentials (T, K) of the shared shape, built when a test asks."""
    return random_potentials(jax.random.key(seed), NUM_STEPS, NUM_CATEGORIES)


@cheap_jit
def summary(natural, paths, rng_key):
    """Everything the tests read from one chain; ``paths`` are values to score."""
    mean = cc.mean_params(natural)
    canonical = cc.natural_params(mean)
    q = cc.to_numpyro(natural)
    return {
        "log_normalizer": cc.log_normalizer(natural),
        "mean": mean,
        "grad": jax.grad(cc.log_normalizer)(natural),
        "entropy": entropy(cc.CHAIN_CATEGORICAL, natural),
        "log_prob": q.log_prob(paths),
        "q_mean": q.mean,
        "q_variance": q.variance,
        "canonical_log_normalizer": cc.log_normalizer(canonical),
        "canonical_mean": cc.mean_params(canonical),
        "markov_mean": cc.mean_params(cc.from_usual(**cc.to_usual(natural))),
        "is_valid": cc.is_valid(natural),
        "samples": cc.sample(rng_key, natural, (NUM_SAMPLES,)),
    }


@cheap_jit
def batch_summary(natural, rng_key):
    return {
        "batched": cc.mean_params(natural),
        "mapped": jax.vmap(jax.vmap(cc.mean_params))(natural),
        "log_normalizer": cc.log_normalizer(natural),
        "sample": cc.sample(rng_key, natural, (4,)),
        "numpyro_sample": cc.to_numpyro(natural).sample(rng_key),
        "entropy": entropy(cc.CHAIN_CATEGORICAL, natural),
    }


def test_chain_categorical_matches_enumeration(rng_key):
    natural = case(20)
    expected = enumerate_chain(natural)
    out = summary(natural, expected["paths"], rng_key)
    np.testing.assert_allclose(
        out["log_normalizer"], expected["log_normalizer"], rtol=1e-12
    )
    mean = out["mean"]
    np.testing.assert_allclose(
        mean.one_hot, expected["marginals"], rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(mean.pair, expected["pair"], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(out["entropy"], expected["entropy"], rtol=1e-10)
    q = cc.to_numpyro(natural)
    assert q.event_shape == (NUM_STEPS,) and q.batch_shape == ()
    np.testing.assert_allclose(out["log_prob"], expected["log_prob"], rtol=1e-10)
    values = np.arange(float(NUM_CATEGORIES))
    np.testing.assert_allclose(
        out["q_mean"], expected["marginals"] @ values, rtol=1e-10
    )
    np.testing.assert_allclose(
        out["q_variance"],
        expected["marginals"] @ values**2 - (expected["marginals"] @ values) ** 2,
        rtol=1e-10,
    )


def test_chain_categorical_mean_params_are_gradient_of_log_normalizer(rng_key):
    natural = case(21)
    out = summary(natural, enumerate_chain(natural)["paths"], rng_key)
    assert_trees_close(out["mean"], out["grad"], rtol=1e-10, atol=1e-14)


def test_chain_categorical_round_trips_up_to_gauge(rng_key):
    natural = case(22)
    out = summary(natural, enumerate_chain(natural)["paths"], rng_key)
    mean = out["mean"]
    np.testing.assert_allclose(out["canonical_log_normalizer"], 0.0, atol=1e-12)
    assert_trees_close(out["canonical_mean"], mean, rtol=1e-10, atol=1e-14)
    assert_trees_close(out["markov_mean"], mean, rtol=1e-10, atol=1e-14)
    potentials = cc.from_usual(unary_logits=natural.one_hot, pair_logits=natural.pair)
    assert_trees_close(potentials, natural, rtol=0)
    assert_trees_close(cc.from_numpyro(cc.to_numpyro(natural)), natural, rtol=0)
    with pytest.raises(ModelError, match="ChainCategorical"):
        cc.from_numpyro(dist.Categorical(probs=jnp.ones(3) / 3))


def test_chain_categorical_with_forbidden_transitions(rng_key):
    # A left-to-right chain: z_{t+1} ∈ {z_t, z_t + 1}; zero probabilities are -inf
    # potentials.
    trans = jnp.array([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4], [0.0, 0.0, 1.0]])
    natural = cc.from_usual(
        initial_probs=jnp.array([1.0, 0.0, 0.0]),
        transition_probs=trans,
        num_steps=NUM_STEPS,
    )
    expected = enumerate_chain(natural)
    paths = expected["paths"]
    out = summary(natural, paths, rng_key)
    assert bool(out["is_valid"])
    mean = out["mean"]
    np.testing.assert_allclose(
        mean.one_hot, expected["marginals"], rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(mean.pair, expected["pair"], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(out["log_prob"], expected["log_prob"], rtol=1e-10)
    index = {tuple(path): i for i, path in enumerate(paths.tolist())}
    assert out["log_prob"][index[0, 1, 0, 1, 2, 2]] == -jnp.inf
    np.testing.assert_allclose(
        out["log_prob"][index[0, 0, 1, 2, 2, 2]], np.log(0.7 * 0.3 * 0.4 * 1.0 * 1.0)
    )
    assert_trees_close(out["canonical_mean"], mean, rtol=1e-10, atol=1e-14)
    impossible = natural._replace(one_hot=jnp.full_like(natural.one_hot, -jnp.inf))
    assert not bool(cc.is_valid(impossible))
    # A step of the rule reads μ, A and the verdict off one forward-backward pass.
    both = jax.tree.map(lambda a, b: np.stack([a, b]), natural, impossible)
    checked_mean, checked_log_norm, checked_valid = cheap_jit(cc.checked_moments)(both)
    np.testing.assert_array_equal(checked_valid, [True, False])
    assert_trees_close(jax.tree.map(lambda a: a[0], checked_mean), mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(checked_log_norm[0], out["log_normalizer"], rtol=1e-12, atol=1e-14)  # A = 0 here


def test_chain_categorical_samples_match_marginals(rng_key):
    natural = case(23)
    out = summary(natural, enumerate_chain(natural)["paths"], rng_key)
    zs = out["samples"]
    assert zs.shape == (NUM_SAMPLES, NUM_STEPS)
    assert jnp.issubdtype(zs.dtype, jnp.integer)
    stats = cc.sufficient_stats(zs, NUM_CATEGORIES)
    for empirical, truth in zip(stats, out["mean"]):
        empirical = np.asarray(empirical)
        truth = np.asarray(truth)
        standard_error = np.sqrt(truth * (1 - truth) / NUM_SAMPLES)
        assert np.all(
            np.abs(empirical.mean(axis=0) - truth) < 5 * standard_error + 1e-12
        )


def test_chain_categorical_batch_jit_and_vmap(rng_key):
    natural = random_potentials(jax.random.key(24), NUM_STEPS, NUM_CATEGORIES, (2, 3))
    assert cc.CHAIN_CATEGORICAL.batch_shape(natural) == (2, 3)
    out = batch_summary(natural, rng_key)
    assert_trees_close(out["batched"], out["mapped"], rtol=1e-12)
    assert out["log_normalizer"].shape == out["entropy"].shape == (2, 3)
    assert out["sample"].shape == (4, 2, 3, NUM_STEPS)
    assert out["numpyro_sample"].shape == (2, 3, NUM_STEPS)


def test_float64_recursions_on_probabilities_equal_log_space_at_extreme_potentials():
    """In float64 forward-backward runs on probabilities (each step's potentials less their
    maximum): equal to the log-space recursion (float32's) where emissions differ by 500 nats
    between states, transitions are forbidden (-inf) and the chain is long."""
    rng = np.random.default_rng(4)
    length, k = 400, 4
    unary = rng.normal(size=(length, k)) * 3.0
    unary[rng.random(length) < 0.05] *= 150.0  # outliers: hundreds of nats between states
    trans = np.log(rng.dirichlet(np.ones(k), k))
    trans[np.triu_indices(k, 2)] = -np.inf  # at most one state up per step
    pair = np.broadcast_to(trans, (length - 1, k, k)) + rng.normal(size=(length - 1, k, k))
    natural = cc.ChainCategoricalStats(jnp.asarray(unary), jnp.asarray(pair))
    assert cc._in_probabilities(natural)
    (mean, log_norm), (reference, ref_norm) = cc._mean_and_norm_scaled(natural), cc._mean_and_norm_log(natural)
    np.testing.assert_allclose(mean.one_hot, reference.one_hot, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(mean.pair, reference.pair, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(log_norm, ref_norm, rtol=1e-12)
    np.testing.assert_allclose(cc.log_normalizer(natural), ref_norm, rtol=1e-12)
    single = jax.tree.map(lambda a: a.astype(np.float32), natural)
    assert not cc._in_probabilities(single)  # float32 keeps log space (87 nats of range)


def test_float64_marginals_are_normalised_without_a_reduction_over_categories():
    """The pairwise marginal's normaliser is the forward scale times the backward pass's
    Σ_k α_t β_t (no sum over K x K per step, a slow reduction over two tiny trailing axes on a
    CPU), and the marginals' is that same per-step number: no per-step sum in the program
    reads a (T-1, K, K) or (T, K) array (the shifts' per-step maxima remain), yet every
    marginal sums to one."""
    rng = np.random.default_rng(5)
    natural = cc.ChainCategoricalStats(jnp.asarray(rng.normal(size=(50, 3))), jnp.asarray(rng.normal(size=(49, 3, 3))))
    jaxpr = jax.make_jaxpr(cc.mean_and_log_normalizer)(natural).jaxpr
    over_time = [
        e for e in jaxpr.eqns
        if e.primitive.name == "reduce_sum" and len(e.invars[0].aval.shape) >= 2
        and e.invars[0].aval.shape[0] >= 49 and 0 not in e.params["axes"]
    ]
    assert not over_time
    mean, _ = cc.mean_and_log_normalizer(natural)
    np.testing.assert_allclose(mean.one_hot.sum(-1), 1.0, rtol=1e-13)
    np.testing.assert_allclose(mean.pair.sum((-2, -1)), 1.0, rtol=1e-13)
    np.testing.assert_allclose(mean.pair.sum(-1), mean.one_hot[:-1], rtol=1e-12)
