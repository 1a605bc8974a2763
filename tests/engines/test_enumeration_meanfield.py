"""A Bernoulli latent used as an index in a non-conjugate factor, under NonConjugateVI.

z_n ~ Bernoulli(0.4),  mu_k ~ Normal(0, 1),  y_n ~ Poisson(exp(mu[z_n])):
the factor of y is not conjugate in mu and reads it at z_n, so its
expectation is a sum over z_n's two values (enumeration) of a Gauss-Hermite
expectation over mu. The reference is the exact mean-field optimum computed
independently: coordinate ascent (q(z_n) in closed form, q(mu_k) by BFGS on
its ELBO) with 60-node Gauss-Hermite expectations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.optimize import minimize
from scipy.special import expit, gammaln, logit

import blrppl

PRIOR_Z = 0.4


def model(num, y=None):
    with numpyro.plate("K", 2):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", num):
        z = numpyro.sample("z", dist.Bernoulli(PRIOR_Z), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Poisson(jnp.exp(mu[z])), obs=y)


def data():
    rng = np.random.default_rng(3)
    z = rng.random(60) < PRIOR_Z
    return rng.poisson(np.where(z, np.exp(1.5), 1.0)).astype(float)


def mean_field_optimum(y, iterations=200):
    """Coordinate ascent on the mean-field ELBO, Gauss-Hermite for every expectation."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    weights = weights / weights.sum()

    def expected_log_lik(m, s):  # E_{mu ~ N(m, s²)} log Poisson(y_n | e^mu), per n
        mu = m + s * nodes
        return (y[:, None] * mu[None] - np.exp(mu)[None] - gammaln(y + 1)[:, None]) @ weights

    m, s = np.array([0.0, 1.5]), np.array([0.3, 0.3])
    for _ in range(iterations):
        r = expit(logit(PRIOR_Z) + expected_log_lik(m[1], s[1]) - expected_log_lik(m[0], s[0]))
        for k, resp in ((0, 1.0 - r), (1, r)):

            def negative_elbo(p, resp=resp):
                mu = p[0] + np.exp(p[1]) * nodes
                return -(resp @ expected_log_lik(p[0], np.exp(p[1])) + (-0.5 * mu**2) @ weights + p[1])

            best = minimize(negative_elbo, [m[k], np.log(s[k])], method="BFGS", options={"gtol": 1e-12})
            m[k], s[k] = best.x[0], np.exp(best.x[1])
    return m, s, r


@pytest.fixture(scope="module")
def fits():
    y = data()
    result = blrppl.NonConjugateVI(model).run(
        jax.random.key(0), 400, len(y), y=jnp.asarray(y), progress_bar=False, tol=1e-10
    )
    return result, mean_field_optimum(y)


def test_bernoulli_index_in_a_non_conjugate_factor_reaches_the_mean_field_optimum(fits):
    result, (m, s, r) = fits
    assert result.estimators["y"] == "enumeration+quadrature"
    q = result.posterior["mu"]
    sd = np.sqrt(np.asarray(q.variance))
    np.testing.assert_array_less(np.abs(np.asarray(q.mean) - m) / s, 0.05)
    np.testing.assert_array_less(np.abs(sd / s - 1.0), 0.10)
    np.testing.assert_allclose(np.asarray(result.posterior["z"].mean), r, atol=0.01)
