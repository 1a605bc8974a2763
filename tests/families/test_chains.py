"""Chain families: the block-tridiagonal Gaussian and the discrete (HMM-posterior) chain.

Oracles (STYLE.md ladder): the dense inverse of the assembled precision for the
Gaussian chain (dynamax ``joint_posterior_mvn``), K^T enumeration for the
discrete chain (dynamax ``big_log_joint``), numpyro's own ``log_prob``,
``mean_params == grad(log_normalizer)``, sequential ≡ parallel, and Monte Carlo
within k standard errors estimated from the samples. Float32 behaviour is
checked in ``test_float32.py``.
"""

import functools
import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
import scipy.stats

from blrppl.errors import ModelError
from blrppl.families import chain_categorical as cc
from blrppl.families import chain_gaussian as cg
from blrppl.families.base import entropy, family_inner, kl_divergence

METHODS = ["sequential", "parallel"]
GAUSSIAN_FAMILIES = {
    "sequential": cg.CHAIN_GAUSSIAN,
    "parallel": cg.CHAIN_GAUSSIAN_PARALLEL,
}

# Jitted once per module (and per shape): eager calls re-trace every scan, and
# the parallel pass is costly to compile on CPU. Most tests share the (50, 2) shape.
MEAN = {m: jax.jit(partial(cg.mean_params, method=m)) for m in METHODS}
LOG_NORMALIZER = {m: jax.jit(partial(cg.log_normalizer, method=m)) for m in METHODS}
LOG_PROB = jax.jit(lambda natural, x: cg.to_numpyro(natural).log_prob(x))
NUM_SAMPLES = 4000


@functools.cache
def chain_summary(method):
    """One jitted function per method computing everything the (T, d) tests check."""
    family = GAUSSIAN_FAMILIES[method]

    @jax.jit
    def summary(natural, rng_key):
        return {
            "moments": cg.moments(natural, method),
            "mean": family.mean_params(natural),
            "grad": jax.grad(family.log_normalizer)(natural),
            "log_normalizer": family.log_normalizer(natural),
            "entropy": entropy(family, natural),
            "samples": family.sample(rng_key, natural, (NUM_SAMPLES,)),
        }

    return summary


def random_chain(key, num_steps, dim, batch=()):
    """A random stable linear-Gaussian chain in natural parameters."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    trans = (
        0.6 * jax.random.normal(k1, batch + (num_steps - 1, dim, dim)) / np.sqrt(dim)
    )
    noise = jax.random.normal(k2, batch + (num_steps - 1, dim, dim))
    noise = noise @ jnp.swapaxes(noise, -1, -2) / dim + 0.3 * jnp.eye(dim)
    return cg.from_usual(
        initial_mean=jax.random.normal(k3, batch + (dim,)),
        initial_covariance=2.0 * jnp.eye(dim),
        transition_matrices=trans,
        transition_offsets=jax.random.normal(k4, batch + (num_steps - 1, dim)),
        transition_covariances=noise,
    )


def dense_gaussian(natural):
    """(J, h) of one chain as dense (T d, T d) and (T d,) numpy arrays."""
    h = np.asarray(natural.x)
    j_diag = -np.asarray(natural.xx + np.swapaxes(natural.xx, -1, -2))
    j_off = -np.asarray(natural.x_next)
    num_steps, d = h.shape
    precision = np.zeros((num_steps * d, num_steps * d))
    for t in range(num_steps):
        precision[t * d : (t + 1) * d, t * d : (t + 1) * d] = j_diag[t]
    for t in range(num_steps - 1):
        precision[t * d : (t + 1) * d, (t + 1) * d : (t + 2) * d] = j_off[t]
        precision[(t + 1) * d : (t + 2) * d, t * d : (t + 1) * d] = j_off[t].T
    return precision, h.reshape(-1)


def dense_moments(natural):
    """Means (T, d), marginal and lag-one covariances, A and H from the dense inverse."""
    precision, h = dense_gaussian(natural)
    num_steps, d = natural.x.shape
    cov = np.linalg.inv(precision)
    mean = cov @ h
    _, log_det = np.linalg.slogdet(precision)
    n = num_steps * d
    blocks = cov.reshape(num_steps, d, num_steps, d)
    idx = np.arange(num_steps)
    return {
        "mean": mean.reshape(num_steps, d),
        "cov": blocks[idx, :, idx, :],
        "cross": blocks[idx[:-1], :, idx[1:], :],
        "log_normalizer": 0.5 * h @ mean - 0.5 * log_det + 0.5 * n * np.log(2 * np.pi),
        "entropy": 0.5 * n * (1 + np.log(2 * np.pi)) - 0.5 * log_det,
        "dense": (mean, cov),
    }


def assert_trees_close(actual, expected, rtol, atol=0.0):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


# Chain Gaussian: exactness against the dense Gaussian.


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [1, 2])
def test_chain_gaussian_matches_dense_conditioning(dim, method, rng_key):
    natural = random_chain(jax.random.key(dim), 50, dim)
    expected = dense_moments(natural)
    out = chain_summary(method)(natural, rng_key)
    (means, covs, cross), mean = out["moments"], out["mean"]
    scale = np.max(np.abs(expected["cov"]))
    np.testing.assert_allclose(means, expected["mean"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(covs, expected["cov"], rtol=1e-8, atol=1e-10 * scale)
    np.testing.assert_allclose(cross, expected["cross"], rtol=1e-8, atol=1e-10 * scale)
    np.testing.assert_allclose(
        out["log_normalizer"], expected["log_normalizer"], rtol=1e-10
    )
    np.testing.assert_allclose(out["entropy"], expected["entropy"], rtol=1e-10)
    np.testing.assert_allclose(
        mean.xx,
        expected["cov"] + expected["mean"][:, :, None] * expected["mean"][:, None, :],
        rtol=1e-8,
        atol=1e-10 * scale,
    )


def test_chain_gaussian_kl_matches_dense():
    p = random_chain(jax.random.key(3), 12, 2)
    q = random_chain(jax.random.key(4), 12, 2)
    (m_p, cov_p), (m_q, cov_q) = dense_moments(p)["dense"], dense_moments(q)["dense"]
    prec_q = np.linalg.inv(cov_q)
    n = m_p.size
    expected = 0.5 * (
        np.trace(prec_q @ cov_p)
        + (m_q - m_p) @ prec_q @ (m_q - m_p)
        - n
        + np.linalg.slogdet(cov_q)[1]
        - np.linalg.slogdet(cov_p)[1]
    )
    kl = jax.jit(partial(kl_divergence, cg.CHAIN_GAUSSIAN))(p, q)
    np.testing.assert_allclose(kl, expected, rtol=1e-9)


@pytest.mark.slow
def test_sequential_and_parallel_agree_on_a_long_chain():
    natural = random_chain(jax.random.key(7), 10_000, 1)
    assert_trees_close(
        MEAN["parallel"](natural), MEAN["sequential"](natural), rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(
        LOG_NORMALIZER["parallel"](natural),
        LOG_NORMALIZER["sequential"](natural),
        rtol=1e-10,
    )


@pytest.mark.parametrize("method", METHODS)
def test_chain_gaussian_mean_params_are_gradient_of_log_normalizer(method, rng_key):
    natural = random_chain(jax.random.key(11), 50, 2)
    out = chain_summary(method)(natural, rng_key)
    assert_trees_close(out["mean"], out["grad"], rtol=1e-9, atol=1e-11)


def test_chain_gaussian_natural_mean_natural_round_trip():
    natural = random_chain(jax.random.key(12), 50, 2)
    mean = MEAN["sequential"](natural)
    back = jax.jit(cg.natural_params)(mean)
    assert_trees_close(back, natural, rtol=1e-9, atol=1e-11)
    assert_trees_close(MEAN["sequential"](back), mean, rtol=1e-9, atol=1e-11)


def test_chain_gaussian_usual_round_trips():
    natural = random_chain(jax.random.key(13), 15, 2)
    assert_trees_close(
        cg.from_usual(**cg.to_usual(natural)), natural, rtol=1e-9, atol=1e-11
    )
    precision, h = dense_gaussian(natural)
    blocks = precision.reshape(15, 2, 15, 2).transpose(0, 2, 1, 3)
    idx = np.arange(15)
    from_blocks = cg.from_usual(
        precision_diag=blocks[idx, idx],
        precision_offdiag=blocks[idx[:-1], idx[1:]],
        linear=h.reshape(15, 2),
    )
    assert_trees_close(from_blocks, natural, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="give either"):
        cg.from_usual(linear=h.reshape(15, 2))
    with pytest.raises(ValueError, match="method"):
        cg.mean_params(natural, method="dense")


# Chain Gaussian: samples.


@pytest.mark.parametrize("method", METHODS)
def test_chain_gaussian_samples_match_moments(method, rng_key):
    natural = random_chain(jax.random.key(14), 50, 2)
    out = chain_summary(method)(natural, rng_key)
    means, covs, cross = out["moments"]
    num = NUM_SAMPLES
    xs = np.asarray(out["samples"])
    assert xs.shape == (num, 50, 2)
    centred = xs - np.asarray(means)
    products = {
        "mean": xs,
        "cov": centred[..., :, None] * centred[..., None, :],
        "cross": centred[:, :-1, :, None] * centred[:, 1:, None, :],
    }
    truth = {"mean": means, "cov": covs, "cross": cross}
    for name, values in products.items():
        standard_error = values.std(axis=0) / np.sqrt(num)
        # ~500 statistics at 5 standard errors: failure chance ~3e-4, no seed tuning.
        assert np.all(np.abs(values.mean(axis=0) - truth[name]) < 5 * standard_error), (
            name
        )


def test_sequential_and_parallel_samplers_draw_the_same_paths(rng_key):
    natural = random_chain(jax.random.key(15), 50, 2)
    np.testing.assert_allclose(
        chain_summary("parallel")(natural, rng_key)["samples"],
        chain_summary("sequential")(natural, rng_key)["samples"],
        rtol=1e-9,
        atol=1e-11,
    )


# Chain Gaussian: numpyro interop.


def test_chain_gaussian_distribution_matches_dense_mvn(rng_key):
    natural = random_chain(jax.random.key(16), 50, 2)
    mean, cov = dense_moments(natural)["dense"]
    q = cg.CHAIN_GAUSSIAN.to_numpyro(natural)
    assert q.event_shape == (50, 2) and q.batch_shape == ()

    @jax.jit
    def summary(q, key):  # A pytree: jit through the distribution object.
        x = q.sample(key, (5,))
        return x, q.log_prob(x), q.mean, q.variance

    x, log_prob, loc, variance = summary(q, rng_key)
    assert x.shape == (5, 50, 2)
    expected = scipy.stats.multivariate_normal(mean, cov).logpdf(
        np.asarray(x).reshape(5, -1)
    )
    np.testing.assert_allclose(log_prob, expected, rtol=1e-10)
    np.testing.assert_allclose(loc, mean.reshape(50, 2), rtol=1e-9)
    np.testing.assert_allclose(variance, np.diag(cov).reshape(50, 2), rtol=1e-9)
    # The family's inner product gives the same density.
    log_prob = family_inner(cg.CHAIN_GAUSSIAN, natural, cg.sufficient_stats(x[0]))
    np.testing.assert_allclose(
        log_prob - LOG_NORMALIZER["sequential"](natural), expected[0], rtol=1e-10
    )


def test_from_numpyro_gaussian_random_walk(rng_key):
    prior = dist.GaussianRandomWalk(scale=jnp.array([0.5, 2.0]), num_steps=6)
    natural = cg.from_numpyro(prior)
    assert natural.x.shape == (2, 6, 1) and cg.CHAIN_GAUSSIAN.batch_shape(natural) == (
        2,
    )
    x = prior.sample(rng_key, (4,))
    log_prob, loc, variance = jax.jit(
        lambda n, v: (LOG_PROB(n, v), cg.to_numpyro(n).mean, cg.to_numpyro(n).variance)
    )(natural, x[..., None])
    np.testing.assert_allclose(log_prob, prior.log_prob(x), rtol=1e-10)
    np.testing.assert_allclose(variance[..., 0], prior.variance, rtol=1e-10)
    np.testing.assert_allclose(loc, 0.0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_scalar_chain_gaussian_is_the_q_of_a_gaussian_random_walk(method, rng_key):
    family = {
        "sequential": cg.SCALAR_CHAIN_GAUSSIAN,
        "parallel": cg.SCALAR_CHAIN_GAUSSIAN_PARALLEL,
    }[method]
    prior = dist.GaussianRandomWalk(scale=jnp.array([0.5, 2.0]), num_steps=6)
    natural = family.from_numpyro(prior)
    assert natural.x.shape == natural.xx.shape == (2, 6) and natural.x_next.shape == (
        2,
        5,
    )
    assert family.batch_shape(natural) == (2,) and family.event_ndim == 1
    x = prior.sample(rng_key, (4,))

    @jax.jit
    def everything(natural):
        q = family.to_numpyro(natural)
        return {
            "log_prob": q.log_prob(x),
            "variance": q.variance,
            "sample": q.sample(rng_key, (3,)),
            "mean": family.mean_params(natural),
            "grad": jax.grad(lambda n: family.log_normalizer(n).sum())(natural),
            "back": family.natural_params(family.mean_params(natural)),
            "inner": family_inner(family, natural, family.sufficient_stats(x[0])),
            "log_normalizer": family.log_normalizer(natural),
        }

    out = everything(natural)
    np.testing.assert_allclose(out["log_prob"], prior.log_prob(x), rtol=1e-10)
    np.testing.assert_allclose(
        out["inner"] - out["log_normalizer"], prior.log_prob(x[0]), rtol=1e-10
    )
    np.testing.assert_allclose(out["variance"], prior.variance, rtol=1e-10)
    assert out["sample"].shape == (3, 2, 6)
    assert_trees_close(out["mean"], out["grad"], rtol=1e-10, atol=1e-12)
    assert_trees_close(out["back"], natural, rtol=1e-10, atol=1e-12)


def test_from_numpyro_gaussian_state_space(rng_key):
    prior = dist.GaussianStateSpace(
        num_steps=7,
        transition_matrix=jnp.array([[0.9, 0.2], [-0.1, 0.7]]),
        covariance_matrix=jnp.array([[1.0, 0.3], [0.3, 0.5]]),
        initial_value=jnp.array([1.0, -1.0]),
    )
    natural = cg.from_numpyro(prior)
    x = prior.sample(rng_key, (3,))
    np.testing.assert_allclose(LOG_PROB(natural, x), prior.log_prob(x), rtol=1e-10)


def test_from_numpyro_dense_block_tridiagonal_mvn(rng_key):
    natural = random_chain(jax.random.key(17), 6, 2)
    mean, cov = dense_moments(natural)["dense"]
    mvn = dist.MultivariateNormal(jnp.asarray(mean), jnp.asarray(cov))
    assert_trees_close(cg.from_numpyro(mvn, state_dim=2), natural, rtol=1e-8, atol=1e-9)
    with pytest.raises(ModelError, match="block tridiagonal"):
        cg.from_numpyro(
            dist.MultivariateNormal(jnp.zeros(4), jnp.eye(4) + 0.5), state_dim=1
        )
    with pytest.raises(ModelError, match="ChainGaussian"):
        cg.from_numpyro(dist.Normal(0.0, 1.0))
    q = cg.to_numpyro(natural)
    assert_trees_close(cg.from_numpyro(q), natural, rtol=0)


def test_chain_gaussian_is_valid():
    natural = random_chain(jax.random.key(18), 10, 2)
    is_valid = jax.jit(cg.is_valid)
    assert bool(is_valid(natural))
    # J_55 -> -J_55 makes a pivot indefinite.
    flipped = natural._replace(xx=natural.xx.at[5].multiply(-1.0))
    assert not bool(is_valid(flipped))
    assert not bool(is_valid(natural._replace(x=natural.x.at[0, 0].set(jnp.nan))))


@pytest.mark.parametrize("method", METHODS)
def test_chain_gaussian_batch_jit_and_vmap(method, rng_key):
    natural = random_chain(jax.random.key(19), 12, 2, batch=(3,))
    family = GAUSSIAN_FAMILIES[method]
    assert family.batch_shape(natural) == (3,)

    @jax.jit
    def everything(natural):
        return {
            "batched": family.mean_params(natural),
            "mapped": jax.vmap(family.mean_params)(natural),
            "single": family.mean_params(jax.tree.map(lambda a: a[1], natural)),
            "log_normalizer": family.log_normalizer(natural),
            "sample": family.sample(rng_key, natural, (4, 5)),
            "is_valid": family.is_valid(natural),
            "entropy": entropy(family, natural),
        }

    out = everything(natural)
    assert_trees_close(out["batched"], out["mapped"], rtol=1e-12)
    assert_trees_close(
        jax.tree.map(lambda a: a[1], out["batched"]), out["single"], rtol=1e-12
    )
    assert (
        out["log_normalizer"].shape
        == out["is_valid"].shape
        == out["entropy"].shape
        == (3,)
    )
    assert out["sample"].shape == (4, 5, 3, 12, 2)


# Chain Categorical: exactness against enumeration.


def random_potentials(key, num_steps, num_categories, batch=()):
    k1, k2 = jax.random.split(key)
    return cc.ChainCategoricalStats(
        one_hot=jax.random.normal(k1, batch + (num_steps, num_categories)),
        pair=1.5
        * jax.random.normal(
            k2, batch + (num_steps - 1, num_categories, num_categories)
        ),
    )


def enumerate_chain(natural):
    num_steps, k = natural.one_hot.shape
    paths = np.array(list(itertools.product(range(k), repeat=num_steps)))
    stats = cc.sufficient_stats(paths, k)
    log_joint = np.zeros(len(paths))
    # A -inf potential on an unused state contributes 0, not -inf * 0 = nan.
    for stat, lam in zip(stats, natural):
        stat, lam = np.asarray(stat), np.asarray(lam)
        terms = stat * np.where(stat > 0, lam, 0.0)
        log_joint = log_joint + np.sum(terms, axis=tuple(range(1, terms.ndim)))
    log_z = scipy.special.logsumexp(log_joint)
    probs = np.exp(log_joint - log_z)
    return {
        "paths": paths,
        "log_prob": log_joint - log_z,
        "log_normalizer": log_z,
        "marginals": np.einsum("n,ntk->tk", probs, stats.one_hot),
        "pair": np.einsum("n,ntij->tij", probs, stats.pair),
        "entropy": -np.sum(probs * np.where(probs > 0, log_joint - log_z, 0.0)),
    }


def test_chain_categorical_matches_enumeration():
    natural = random_potentials(jax.random.key(20), 5, 3)
    expected = enumerate_chain(natural)
    mean = cc.mean_params(natural)
    np.testing.assert_allclose(
        cc.log_normalizer(natural), expected["log_normalizer"], rtol=1e-12
    )
    np.testing.assert_allclose(
        mean.one_hot, expected["marginals"], rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(mean.pair, expected["pair"], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(
        entropy(cc.CHAIN_CATEGORICAL, natural), expected["entropy"], rtol=1e-10
    )
    q = cc.to_numpyro(natural)
    assert q.event_shape == (5,) and q.batch_shape == ()
    np.testing.assert_allclose(
        q.log_prob(expected["paths"]), expected["log_prob"], rtol=1e-10
    )
    values = np.arange(3.0)
    np.testing.assert_allclose(q.mean, expected["marginals"] @ values, rtol=1e-10)
    np.testing.assert_allclose(
        q.variance,
        expected["marginals"] @ values**2 - (expected["marginals"] @ values) ** 2,
        rtol=1e-10,
    )


def test_chain_categorical_mean_params_are_gradient_of_log_normalizer():
    natural = random_potentials(jax.random.key(21), 30, 4)
    expected = jax.grad(cc.log_normalizer)(natural)
    assert_trees_close(cc.mean_params(natural), expected, rtol=1e-10, atol=1e-14)


def test_chain_categorical_round_trips_up_to_gauge():
    natural = random_potentials(jax.random.key(22), 12, 3)
    mean = cc.mean_params(natural)
    canonical = cc.natural_params(mean)
    np.testing.assert_allclose(cc.log_normalizer(canonical), 0.0, atol=1e-12)
    assert_trees_close(cc.mean_params(canonical), mean, rtol=1e-10, atol=1e-14)
    markov = cc.from_usual(**cc.to_usual(natural))
    assert_trees_close(cc.mean_params(markov), mean, rtol=1e-10, atol=1e-14)
    potentials = cc.from_usual(unary_logits=natural.one_hot, pair_logits=natural.pair)
    assert_trees_close(potentials, natural, rtol=0)
    assert_trees_close(cc.from_numpyro(cc.to_numpyro(natural)), natural, rtol=0)
    with pytest.raises(ModelError, match="ChainCategorical"):
        cc.from_numpyro(dist.Categorical(probs=jnp.ones(3) / 3))


def test_chain_categorical_with_forbidden_transitions():
    # A left-to-right chain: z_{t+1} ∈ {z_t, z_t + 1}; zero probabilities are -inf potentials.
    trans = jnp.array([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4], [0.0, 0.0, 1.0]])
    natural = cc.from_usual(
        initial_probs=jnp.array([1.0, 0.0, 0.0]), transition_probs=trans, num_steps=5
    )
    assert bool(cc.is_valid(natural))
    expected = enumerate_chain(natural)
    mean = cc.mean_params(natural)
    np.testing.assert_allclose(
        mean.one_hot, expected["marginals"], rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(mean.pair, expected["pair"], rtol=1e-10, atol=1e-14)
    q = cc.to_numpyro(natural)
    assert q.log_prob(jnp.array([0, 1, 0, 1, 2])) == -jnp.inf
    np.testing.assert_allclose(
        q.log_prob(jnp.array([0, 0, 1, 2, 2])), np.log(0.7 * 0.3 * 0.4 * 1.0)
    )
    assert_trees_close(
        cc.mean_params(cc.natural_params(mean)), mean, rtol=1e-10, atol=1e-14
    )
    assert not bool(cc.is_valid(natural._replace(one_hot=jnp.full((5, 3), -jnp.inf))))


def test_chain_categorical_samples_match_marginals(rng_key):
    natural = random_potentials(jax.random.key(23), 6, 3)
    mean = cc.mean_params(natural)
    num = 20_000
    zs = cc.sample(rng_key, natural, (num,))
    assert zs.shape == (num, 6) and jnp.issubdtype(zs.dtype, jnp.integer)
    stats = cc.sufficient_stats(zs, 3)
    for empirical, truth in zip(stats, mean):
        empirical = np.asarray(empirical)
        standard_error = np.sqrt(np.asarray(truth) * (1 - np.asarray(truth)) / num)
        assert np.all(
            np.abs(empirical.mean(axis=0) - truth) < 5 * standard_error + 1e-12
        )


def test_chain_categorical_batch_jit_and_vmap(rng_key):
    natural = random_potentials(jax.random.key(24), 7, 3, batch=(2, 3))
    assert cc.CHAIN_CATEGORICAL.batch_shape(natural) == (2, 3)

    @jax.jit
    def everything(natural):
        return {
            "batched": cc.mean_params(natural),
            "mapped": jax.vmap(jax.vmap(cc.mean_params))(natural),
            "log_normalizer": cc.log_normalizer(natural),
            "sample": cc.sample(rng_key, natural, (4,)),
            "numpyro_sample": cc.to_numpyro(natural).sample(rng_key),
            "entropy": entropy(cc.CHAIN_CATEGORICAL, natural),
        }

    out = everything(natural)
    assert_trees_close(out["batched"], out["mapped"], rtol=1e-12)
    assert out["log_normalizer"].shape == out["entropy"].shape == (2, 3)
    assert out["sample"].shape == (4, 2, 3, 7)
    assert out["numpyro_sample"].shape == (2, 3, 7)
