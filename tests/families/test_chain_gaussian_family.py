"""The chain Gaussian as an exponential family: parametrisations, KL, numpyro interop.

Oracles (STYLE.md ladder): the dense Gaussian (dynamax ``joint_posterior_mvn``)
and scipy's ``multivariate_normal``, numpyro's own ``log_prob``, ``mean`` and
``variance``, ``mean_params == grad(log_normalizer)``, and round trips
λ -> μ -> λ and λ -> usual -> λ. The jitted functions are module level and
take the method as a static argument, so parametrised cases share their
compiles; most cases share one (T, d) shape.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
import scipy.stats

from blrppl.errors import ModelError
from blrppl.families import chain_gaussian as cg
from blrppl.families.base import family_inner, kl_divergence
from tests.compiles import cheap_jit

try:
    from tests.families.chain_oracles import (
        assert_trees_close,
        dense_gaussian,
        dense_moments,
        random_chain,
    )
except ImportError:  # ``tests`` is not a package: tests/families is on sys.path.
    from chain_oracles import (
        assert_trees_close,
        dense_gaussian,
        dense_moments,
        random_chain,
    )

METHODS = ["sequential", "parallel"]
SCALAR_FAMILIES = {
    "sequential": cg.SCALAR_CHAIN_GAUSSIAN,
    "parallel": cg.SCALAR_CHAIN_GAUSSIAN_PARALLEL,
}
NUM_STEPS, DIM = 13, 2

kl = cheap_jit(partial(kl_divergence, cg.CHAIN_GAUSSIAN))


def case(seed):
    """A random chain (T, d) of the shared shape, built when a test asks."""
    return random_chain(jax.random.key(seed), NUM_STEPS, DIM)


@cheap_jit
def round_trips(natural):
    """λ -> μ -> λ -> μ and λ -> state-space form -> λ, sequential passes."""
    mean = cg.mean_params(natural)
    back = cg.natural_params(mean)
    return {
        "mean": mean,
        "back": back,
        "mean_of_back": cg.mean_params(back),
        "usual_back": cg.from_usual(**cg.to_usual(natural)),
    }


@cheap_jit
def distribution_summary(q, x, rng_key):
    """Density, moments and samples of ``q``, a pytree (so jit goes through it)."""
    family = cg.CHAIN_GAUSSIAN
    return {
        "sample": q.sample(rng_key, (5,)),
        "log_prob": q.log_prob(x),
        "mean": q.mean,
        "variance": q.variance,
        "marginal_covariance": q.marginal_covariance,
        "lag_one_covariance": q.lag_one_covariance,
        # The family's inner product gives the same density.
        "inner": family_inner(family, q.natural, cg.sufficient_stats(x[0])),
        "log_normalizer": family.log_normalizer(q.natural),
    }


@partial(cheap_jit, static_argnames="method")
def scalar_family_summary(natural, x, rng_key, method):
    family = SCALAR_FAMILIES[method]
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


def test_chain_gaussian_kl_matches_dense():
    p, q = case(3), case(4)
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
    np.testing.assert_allclose(kl(p, q), expected, rtol=1e-9)


def test_chain_gaussian_natural_mean_natural_round_trip():
    natural = case(12)
    out = round_trips(natural)
    assert_trees_close(out["back"], natural, rtol=1e-9, atol=1e-11)
    assert_trees_close(out["mean_of_back"], out["mean"], rtol=1e-9, atol=1e-11)


def test_chain_gaussian_usual_round_trips():
    natural = case(13)
    assert_trees_close(
        round_trips(natural)["usual_back"], natural, rtol=1e-9, atol=1e-11
    )
    precision, h = dense_gaussian(natural)
    blocks = precision.reshape(NUM_STEPS, DIM, NUM_STEPS, DIM).transpose(0, 2, 1, 3)
    idx = np.arange(NUM_STEPS)
    from_blocks = cg.from_usual(
        precision_diag=blocks[idx, idx],
        precision_offdiag=blocks[idx[:-1], idx[1:]],
        linear=h.reshape(NUM_STEPS, DIM),
    )
    assert_trees_close(from_blocks, natural, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="give either"):
        cg.from_usual(linear=h.reshape(NUM_STEPS, DIM))
    with pytest.raises(ValueError, match="method"):
        cg.mean_params(natural, method="dense")


# numpyro interop.


def test_chain_gaussian_distribution_matches_dense_mvn(rng_key):
    natural = case(16)
    mean, cov = dense_moments(natural)["dense"]
    q = cg.CHAIN_GAUSSIAN.to_numpyro(natural)
    assert q.event_shape == (NUM_STEPS, DIM) and q.batch_shape == ()
    x = jax.random.normal(jax.random.key(1), (5, NUM_STEPS, DIM))
    out = distribution_summary(q, x, rng_key)
    assert out["sample"].shape == (5, NUM_STEPS, DIM)
    expected = scipy.stats.multivariate_normal(mean, cov).logpdf(
        np.asarray(x).reshape(5, -1)
    )
    np.testing.assert_allclose(out["log_prob"], expected, rtol=1e-10)
    np.testing.assert_allclose(out["mean"], mean.reshape(NUM_STEPS, DIM), rtol=1e-9)
    np.testing.assert_allclose(
        out["variance"], np.diag(cov).reshape(NUM_STEPS, DIM), rtol=1e-9
    )
    blocks = dense_moments(natural)
    scale = np.max(np.abs(blocks["cov"]))
    np.testing.assert_allclose(
        out["marginal_covariance"], blocks["cov"], rtol=1e-8, atol=1e-10 * scale
    )
    np.testing.assert_allclose(
        out["lag_one_covariance"], blocks["cross"], rtol=1e-8, atol=1e-10 * scale
    )
    np.testing.assert_allclose(
        out["inner"] - out["log_normalizer"], expected[0], rtol=1e-10
    )


def test_from_numpyro_gaussian_random_walk(rng_key):
    prior = dist.GaussianRandomWalk(scale=jnp.array([0.5, 2.0]), num_steps=6)
    natural = cg.from_numpyro(prior)
    assert natural.x.shape == (2, 6, 1)
    assert cg.CHAIN_GAUSSIAN.batch_shape(natural) == (2,)
    x = prior.sample(rng_key, (4,))
    out = distribution_summary(cg.to_numpyro(natural), x[..., None], rng_key)
    np.testing.assert_allclose(out["log_prob"], prior.log_prob(x), rtol=1e-10)
    np.testing.assert_allclose(out["variance"][..., 0], prior.variance, rtol=1e-10)
    np.testing.assert_allclose(out["mean"], 0.0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_scalar_chain_gaussian_is_the_q_of_a_gaussian_random_walk(method, rng_key):
    family = SCALAR_FAMILIES[method]
    prior = dist.GaussianRandomWalk(scale=jnp.array([0.5, 2.0]), num_steps=6)
    natural = family.from_numpyro(prior)
    assert natural.x.shape == natural.xx.shape == (2, 6)
    assert natural.x_next.shape == (2, 5)
    assert family.batch_shape(natural) == (2,) and family.event_ndim == 1
    x = prior.sample(rng_key, (4,))
    out = scalar_family_summary(natural, x, rng_key, method)
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
        num_steps=NUM_STEPS,
        transition_matrix=jnp.array([[0.9, 0.2], [-0.1, 0.7]]),
        covariance_matrix=jnp.array([[1.0, 0.3], [0.3, 0.5]]),
        initial_value=jnp.array([1.0, -1.0]),
    )
    natural = cheap_jit(cg.from_numpyro)(prior)
    x = prior.sample(rng_key, (5,))
    out = distribution_summary(cg.to_numpyro(natural), x, rng_key)
    np.testing.assert_allclose(out["log_prob"], prior.log_prob(x), rtol=1e-10)


def test_from_numpyro_dense_block_tridiagonal_mvn():
    natural = case(17)
    mean, cov = dense_moments(natural)["dense"]
    mvn = dist.MultivariateNormal(jnp.asarray(mean), jnp.asarray(cov))
    # Eager: the band structure is checked only on a concrete precision.
    assert_trees_close(
        cg.from_numpyro(mvn, state_dim=DIM), natural, rtol=1e-8, atol=1e-9
    )
    with pytest.raises(ModelError, match="block tridiagonal"):
        cg.from_numpyro(
            dist.MultivariateNormal(jnp.zeros(4), jnp.eye(4) + 0.5), state_dim=1
        )
    with pytest.raises(ModelError, match="ChainGaussian"):
        cg.from_numpyro(dist.Normal(0.0, 1.0))
    q = cg.to_numpyro(natural)
    assert_trees_close(cg.from_numpyro(q), natural, rtol=0)
