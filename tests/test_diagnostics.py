"""Pareto-k (PSIS) of q against the model: small for a good q, large for a bad one."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.special import gammaln, logsumexp

import blrppl
from blrppl.diagnostics import ParetoK, log_importance_ratios


def normal_normal(y):
    z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


Y = jnp.array([0.3, 1.1, 0.8, -0.2, 0.5])


def moved(result, shift_sd, variance_factor):
    """The result with q(z) moved by ``shift_sd`` of its sds and its variance scaled."""
    lam = result.state.natural["z"]
    var = -0.5 / lam.x_sq
    mean = lam.x * var + shift_sd * jnp.sqrt(var)
    var = var * variance_factor
    q = lam._replace(x=mean / var, x_sq=-0.5 / var)
    return result._replace(state=result.state._replace(natural={"z": q}))


def test_exact_posterior_has_constant_ratios_and_small_k(rng_key):
    result = blrppl.ConjugateBayes(normal_normal).run(rng_key, 1, Y, progress_bar=False)
    log_ratio = log_importance_ratios(result, jax.random.key(1), 200)
    # log p(z, y) - log q(z) = log p(y) = the ELBO of the exact q, for every draw.
    np.testing.assert_allclose(log_ratio, result.elbo[-1], rtol=1e-12)
    diagnostic = result.pareto_k(jax.random.key(1))
    assert isinstance(diagnostic, ParetoK) and float(diagnostic) < 0.5
    assert diagnostic.verdict == "good" and diagnostic.ess == 1000


def test_overdispersed_q_is_good_and_a_misplaced_narrow_q_is_bad(rng_key):
    exact = blrppl.ConjugateBayes(normal_normal).run(rng_key, 1, Y, progress_bar=False)
    # Wider than the posterior: bounded importance weights (k < 0 in theory).
    wide = moved(exact, 0.5, 1.5).pareto_k(jax.random.key(1))
    # Three posterior sds off and half as wide: the posterior's bulk is q's far tail.
    bad = moved(exact, 3.0, 0.25).pareto_k(jax.random.key(1))
    assert wide.k < 0.5 and wide.ess > 500
    assert bad.k > 0.7 and bad.verdict == "bad" and bad.ess < 100


def scale_model(y):
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, 1.0 / jnp.sqrt(tau)), obs=y)


@pytest.mark.slow  # compilation-bound: ~6-10 s on 2 cores
def test_ratios_on_the_unconstrained_space_include_the_jacobian(rng_key):
    """Laplace's q lives on log(tau): the mean ratio must estimate the evidence p(y)."""
    y = jnp.asarray(np.random.default_rng(0).normal(0.0, 0.7, 20))
    result = blrppl.Laplace(scale_model).run(rng_key, 30, y, progress_bar=False, tol=1e-12)
    assert result.plan.qs[next(iter(result.plan.qs))].transform is not None
    num_samples = 4000
    log_ratio = log_importance_ratios(result, jax.random.key(1), num_samples)
    a, b, n = 2.0, 1.0, y.size
    log_evidence = (
        a * math.log(b) + gammaln(a + n / 2) - gammaln(a) - n / 2 * math.log(2 * math.pi)
        - (a + n / 2) * jnp.log(b + jnp.sum(y**2) / 2)
    )
    estimate = logsumexp(log_ratio) - math.log(num_samples)
    weights = jnp.exp(log_ratio - jnp.max(log_ratio))
    relative_error = jnp.std(weights) / jnp.mean(weights) / math.sqrt(num_samples)
    assert abs(float(estimate - log_evidence)) < 5 * float(relative_error) + 1e-3
    assert result.pareto_k(jax.random.key(2)).k < 0.5


def half_normal_scale(y):
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, sigma), obs=y)


def test_ratios_of_a_transformed_site_estimate_the_evidence(rng_key):
    """NonConjugateVI's q(sigma) is a Gaussian on log(sigma) (a site transform, not a block)."""
    from scipy.integrate import quad
    from scipy.stats import halfnorm, norm

    y = np.random.default_rng(1).normal(0.0, 1.5, 15)
    result = blrppl.NonConjugateVI(half_normal_scale).run(rng_key, 100, jnp.asarray(y), progress_bar=False)
    q = result.plan.qs["sigma"]
    assert q.transform is not None and getattr(q.transform, "sites", None) is None
    num_samples = 4000
    log_ratio = log_importance_ratios(result, jax.random.key(1), num_samples)
    shift = norm.logpdf(y, 0.0, y.std()).sum()
    evidence, _ = quad(lambda s: np.exp(norm.logpdf(y, 0.0, s).sum() - shift) * halfnorm.pdf(s, scale=2.0), 0, 20)
    log_evidence = np.log(evidence) + shift
    estimate = logsumexp(log_ratio) - math.log(num_samples)
    weights = jnp.exp(log_ratio - jnp.max(log_ratio))
    relative_error = jnp.std(weights) / jnp.mean(weights) / math.sqrt(num_samples)
    assert abs(float(estimate) - log_evidence) < 5 * float(relative_error) + 1e-3
