"""The Gamma sampler of ``families/gamma_draws.py``: its draws follow Gamma(a, 1), Dirichlet and
Beta (Kolmogorov-Smirnov at a fixed seed), also under vmap, and stay finite in float32 and in log
space for tiny shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from blrppl.families import beta
from blrppl.families.gamma_draws import dirichlet_draws, gamma_draws, log_gamma_draws
from tests.compiles import cheap_jit

NUM = 20_000


@pytest.mark.parametrize("shape", [0.02, 0.4, 1.0, 2.5, 60.0])
def test_gamma_draws_follow_the_gamma_distribution(shape):
    x = np.asarray(cheap_jit(lambda a: gamma_draws(jax.random.key(3), a, (NUM,), jnp.float64))(shape))
    assert stats.kstest(x, stats.gamma(shape).cdf).pvalue > 1e-3


def test_draws_under_vmap_follow_each_batch_members_shape():
    # vmapped (restarts), the rounds run until every member's variates are accepted
    keys = jax.random.split(jax.random.key(4), NUM)
    draws = np.asarray(cheap_jit(jax.vmap(lambda k: gamma_draws(k, jnp.array([0.5, 7.0]), (2,), jnp.float64)))(keys))
    for j, shape in enumerate((0.5, 7.0)):
        assert stats.kstest(draws[:, j], stats.gamma(shape).cdf).pvalue > 1e-3


def test_tiny_shapes_stay_finite_in_log_space_and_float32():
    log_x = cheap_jit(lambda a: log_gamma_draws(jax.random.key(0), a, (NUM,), jnp.float64))(1e-3)
    assert bool(jnp.all(jnp.isfinite(log_x)))
    x32 = cheap_jit(lambda a: gamma_draws(jax.random.key(0), a, (NUM,), jnp.float32))(jnp.float32(0.5))
    assert x32.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(x32) & (x32 >= 0)))
    assert abs(float(jnp.mean(x32)) - 0.5) < 5 * np.sqrt(0.5 / NUM)


def test_dirichlet_and_beta_marginals():
    alpha = np.array([0.3, 1.0, 4.0])
    draws = np.asarray(cheap_jit(lambda a: dirichlet_draws(jax.random.key(1), a, (NUM,), jnp.float64))(alpha))
    np.testing.assert_allclose(draws.sum(-1), 1.0, rtol=1e-12)
    for k in range(3):  # marginal k of Dirichlet(alpha) is Beta(alpha_k, sum - alpha_k)
        assert stats.kstest(draws[:, k], stats.beta(alpha[k], alpha.sum() - alpha[k]).cdf).pvalue > 1e-3
    natural = beta.from_usual(2.0, 0.5)
    x = np.asarray(cheap_jit(lambda n: beta.sample(jax.random.key(2), n, (NUM,)))(natural))
    assert stats.kstest(x, stats.beta(2.0, 0.5).cdf).pvalue > 1e-3


def test_draws_are_differentiable_in_the_concentration_like_jax_gamma():
    # implicit reparameterisation: d E[X] / d a = 1 and d E[log X] / d a = trigamma(a) for Gamma(a, 1)
    from scipy.special import polygamma

    def means(a):
        x = gamma_draws(jax.random.key(5), a, (NUM,), jnp.float64)
        return jnp.stack([jnp.mean(x), jnp.mean(jnp.log(x))])

    # reverse mode, as NonConjugateVI's Monte Carlo takes it; one cheaply compiled program
    derivatives = cheap_jit(jax.jacrev(means))
    for a in (0.4, 3.0):
        d_mean, d_log = np.asarray(derivatives(a))
        np.testing.assert_allclose(d_mean, 1.0, atol=0.05)
        np.testing.assert_allclose(d_log, polygamma(1, a), rtol=0.05)
