"""Conjugate Bayes is exact: prior + sum of site parameters is the posterior.

Khan & Rue (2021), Sec. 5.1 and Eq. 54: for a conjugate model, one BLR step
with rho = 1 sets lambda to the sum of the factors' site parameters, which
is the exact posterior's natural parameter; the ELBO of q at the exact
posterior is the log evidence (the KL term vanishes). Closed forms: Bishop,
PRML ch. 2-3; the ridge example is Khan & Rue Sec. 1.3.3.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import betaln, gammaln
from scipy.stats import multivariate_normal

from blrppl.engines.conjugate import ConjugateBayes
from blrppl.families import BetaStats, DirichletStats, GammaStats, NormalStats

from ._helpers import (
    as_family_layout,
    beta,
    dirichlet,
    gamma,
    gaussian,
    inverse_gamma,
    wishart,
)

RTOL = 1e-10


def _assert_stats(actual, expected, rtol=RTOL, atol=1e-12):
    assert type(actual) is type(expected), (type(actual), type(expected))
    for field in expected._fields:
        np.testing.assert_allclose(
            np.asarray(getattr(actual, field)),
            np.asarray(getattr(expected, field)),
            rtol=rtol,
            atol=atol,
            err_msg=field,
        )


def _sum_site_parameters(plan, var, mean):
    """Sum over every factor touching ``var`` of its exact site parameter at ``mean``."""
    total = None
    for est in plan.estimators:
        if var not in est.neighbours:
            continue
        _, grads = est.estimate(jax.random.key(0), mean, plan.init_params, plan.arrays)
        total = grads[var] if total is None else jax.tree.map(jnp.add, total, grads[var])
    return total


# ---------------------------------------------------------------------------
# The five textbook conjugate updates.

Y_REAL = np.array([0.3, 1.1, 0.8, -0.4, 1.9, 0.5])
Y_COUNT = np.array([2.0, 0.0, 5.0, 3.0, 1.0, 4.0, 2.0])
Y_BIN = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
Y_CAT = np.array([0, 2, 2, 1, 2, 0, 2, 3])

M0, S0, SIGMA = 0.4, 1.5, 0.7
A0, B0 = 2.5, 1.5
ALPHA0 = np.array([1.5, 0.7, 2.0, 1.0])
MU_KNOWN = 0.25


def normal_normal(y):
    z = numpyro.sample("z", dist.Normal(M0, S0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(z, SIGMA), obs=y)


def gamma_poisson(y):
    lam = numpyro.sample("lam", dist.Gamma(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Poisson(lam), obs=y)


def beta_bernoulli(y):
    p = numpyro.sample("p", dist.Beta(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(probs=p), obs=y)


def dirichlet_categorical(y):
    w = numpyro.sample("w", dist.Dirichlet(jnp.asarray(ALPHA0)))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Categorical(probs=w), obs=y)


def normal_gamma_known_mean(y):
    tau = numpyro.sample("tau", dist.Gamma(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(MU_KNOWN, 1 / jnp.sqrt(tau)), obs=y)


def _normal_normal_posterior(y):
    prec = 1 / S0**2 + len(y) / SIGMA**2
    eta = M0 / S0**2 + y.sum() / SIGMA**2
    return NormalStats(x=eta, x_sq=-0.5 * prec)


def _normal_normal_evidence(y):
    n = len(y)
    cov = SIGMA**2 * np.eye(n) + S0**2 * np.ones((n, n))
    return multivariate_normal(np.full(n, M0), cov).logpdf(y)


def _gamma_poisson_evidence(y):
    a, b = A0 + y.sum(), B0 + len(y)
    return A0 * math.log(B0) - gammaln(A0) + gammaln(a) - a * math.log(b) - gammaln(y + 1).sum()


def _beta_bernoulli_evidence(y):
    k, n = y.sum(), len(y)
    return betaln(A0 + k, B0 + n - k) - betaln(A0, B0)


def _dirichlet_categorical_evidence(y):
    counts = np.bincount(y, minlength=len(ALPHA0))
    a0 = ALPHA0.sum()
    return gammaln(a0) - gammaln(a0 + len(y)) + np.sum(gammaln(ALPHA0 + counts) - gammaln(ALPHA0))


def _normal_gamma_evidence(y):
    n = len(y)
    a, b = A0 + n / 2, B0 + 0.5 * np.sum((y - MU_KNOWN) ** 2)
    return -0.5 * n * math.log(2 * math.pi) + A0 * math.log(B0) - gammaln(A0) + gammaln(a) - a * math.log(b)


CONJUGATE = {
    "normal_normal": (normal_normal, Y_REAL, "z", _normal_normal_posterior, _normal_normal_evidence),
    "gamma_poisson": (
        gamma_poisson,
        Y_COUNT,
        "lam",
        lambda y: GammaStats(log_x=A0 + y.sum() - 1, x=-(B0 + len(y))),
        _gamma_poisson_evidence,
    ),
    "beta_bernoulli": (
        beta_bernoulli,
        Y_BIN,
        "p",
        lambda y: BetaStats(log_x=A0 + y.sum() - 1, log1m_x=B0 + len(y) - y.sum() - 1),
        _beta_bernoulli_evidence,
    ),
    "dirichlet_categorical": (
        dirichlet_categorical,
        Y_CAT,
        "w",
        lambda y: DirichletStats(log_x=ALPHA0 + np.bincount(y, minlength=len(ALPHA0)) - 1),
        _dirichlet_categorical_evidence,
    ),
    "normal_gamma_known_mean": (
        normal_gamma_known_mean,
        Y_REAL,
        "tau",
        lambda y: GammaStats(log_x=A0 + len(y) / 2 - 1, x=-(B0 + 0.5 * np.sum((y - MU_KNOWN) ** 2))),
        _normal_gamma_evidence,
    ),
}

Y_MULTI = np.array([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 5.0, 1.0], [4.0, 1.0, 1.0, 0.0]])
T_MULTI = 6
N_BINOM = np.array([5.0, 3.0, 8.0, 1.0, 4.0, 6.0])
Y_BINOM = np.array([2.0, 3.0, 0.0, 1.0, 2.0, 5.0])
D_W, NU0 = 2, 4.5
V0 = np.array([[1.2, 0.3], [0.3, 0.8]])
MU0_W = np.array([0.2, -0.1])
Y_MVN = np.random.RandomState(2).randn(7, 2) @ np.array([[1.0, 0.0], [0.4, 0.7]])


def gamma_exponential(y):
    b = numpyro.sample("b", dist.Gamma(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Exponential(b), obs=y)


def beta_binomial(y):
    p = numpyro.sample("p", dist.Beta(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Binomial(N_BINOM, probs=p), obs=y)


def dirichlet_multinomial(y):
    w = numpyro.sample("w", dist.Dirichlet(jnp.asarray(ALPHA0)))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Multinomial(T_MULTI, probs=w), obs=y)


def normal_invgamma_known_mean(y):
    var = numpyro.sample("var", dist.InverseGamma(A0, B0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(MU_KNOWN, jnp.sqrt(var)), obs=y)


def wishart_mvn_known_mean(Y):
    lam = numpyro.sample("Lam", dist.Wishart(NU0, jnp.asarray(V0)))
    with numpyro.plate("N", Y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(jnp.asarray(MU0_W), precision_matrix=lam), obs=Y)


def _wishart_posterior(Y):
    from blrppl.families import WishartStats

    S = (Y - MU0_W).T @ (Y - MU0_W)
    return WishartStats(x=-0.5 * (np.linalg.inv(V0) + S), log_det_x=0.5 * (NU0 + len(Y) - D_W - 1))


def _wishart_evidence(Y):
    from scipy.special import multigammaln

    n, d = len(Y), D_W
    S = (Y - MU0_W).T @ (Y - MU0_W)
    r0 = np.linalg.inv(V0)
    return (
        -0.5 * n * d * math.log(math.pi)
        + multigammaln(0.5 * (NU0 + n), d)
        - multigammaln(0.5 * NU0, d)
        + 0.5 * NU0 * np.linalg.slogdet(r0)[1]
        - 0.5 * (NU0 + n) * np.linalg.slogdet(r0 + S)[1]
    )


def _gamma_exponential_evidence(y):
    a, b = A0 + len(y), B0 + y.sum()
    return A0 * math.log(B0) - gammaln(A0) + gammaln(a) - a * math.log(b)


def _beta_binomial_evidence(y):
    log_comb = np.sum(gammaln(N_BINOM + 1) - gammaln(y + 1) - gammaln(N_BINOM - y + 1))
    return log_comb + betaln(A0 + y.sum(), B0 + np.sum(N_BINOM - y)) - betaln(A0, B0)


def _dirichlet_multinomial_evidence(y):
    counts = y.sum(0)
    a0 = ALPHA0.sum()
    log_comb = np.sum(gammaln(T_MULTI + 1.0) - gammaln(y + 1).sum(-1))
    return log_comb + gammaln(a0) - gammaln(a0 + counts.sum()) + np.sum(gammaln(ALPHA0 + counts) - gammaln(ALPHA0))


def _normal_invgamma_posterior(y):
    from blrppl.families import InverseGammaStats

    a, b = A0 + len(y) / 2, B0 + 0.5 * np.sum((y - MU_KNOWN) ** 2)
    return InverseGammaStats(log_x=-(a + 1), inv_x=-b)


CONJUGATE.update(
    {
        "gamma_exponential": (
            gamma_exponential,
            np.abs(Y_REAL) + 0.1,
            "b",
            lambda y: GammaStats(log_x=A0 + len(y) - 1, x=-(B0 + y.sum())),
            _gamma_exponential_evidence,
        ),
        "beta_binomial": (
            beta_binomial,
            Y_BINOM,
            "p",
            lambda y: BetaStats(log_x=A0 + y.sum() - 1, log1m_x=B0 + np.sum(N_BINOM - y) - 1),
            _beta_binomial_evidence,
        ),
        "dirichlet_multinomial": (
            dirichlet_multinomial,
            Y_MULTI,
            "w",
            lambda y: DirichletStats(log_x=ALPHA0 + y.sum(0) - 1),
            _dirichlet_multinomial_evidence,
        ),
        # Same evidence as the Gamma-precision model: 1/var ~ Gamma(A0, B0).
        "normal_invgamma_known_mean": (
            normal_invgamma_known_mean,
            Y_REAL,
            "var",
            _normal_invgamma_posterior,
            _normal_gamma_evidence,
        ),
        "wishart_mvn_known_mean": (wishart_mvn_known_mean, Y_MVN, "Lam", _wishart_posterior, _wishart_evidence),
    }
)

_RANDOM_MEAN = {
    "b": lambda rs: gamma(rs),
    "var": lambda rs: inverse_gamma(rs),
    "Lam": lambda rs: wishart(rs, D_W),
    "z": lambda rs: gaussian(rs, ()),
    "lam": lambda rs: gamma(rs),
    "p": lambda rs: beta(rs),
    "w": lambda rs: dirichlet(rs, (), len(ALPHA0)),
    "tau": lambda rs: gamma(rs),
}


@pytest.mark.parametrize("name", sorted(CONJUGATE))
def test_prior_plus_site_parameters_is_the_posterior(name):
    """Sum of exact site parameters (prior factor included), at any q, = posterior natural parameters."""
    model, y, var, posterior, _ = CONJUGATE[name]
    plan = ConjugateBayes(model).plan(y)
    assert [v for v in plan.qs] == [var]
    rs = np.random.RandomState(3)
    for _ in range(2):  # independent of where q is: each factor touches only var
        mean = {var: as_family_layout(plan.qs[var], _RANDOM_MEAN[var](rs))}
        _assert_stats(_sum_site_parameters(plan, var, mean), posterior(y))


@pytest.mark.parametrize("mode", ["global", "local"])
@pytest.mark.parametrize("name", sorted(CONJUGATE))
def test_conjugate_bayes_posterior_and_evidence(name, mode, rng_key):
    """ConjugateBayes: one step gives the exact posterior, a second step is a no-op, and
    the ELBO at the exact posterior is the log evidence (Eq. 58 and Eq. 60 alike)."""
    model, y, var, posterior, evidence = CONJUGATE[name]
    result = ConjugateBayes(model, mode=mode).run(rng_key, 2, y, progress_bar=False)
    _assert_stats(result.natural_params[var], posterior(y))
    np.testing.assert_allclose(np.asarray(result.elbo), evidence(y), rtol=1e-8)


def test_conjugate_bayes_posterior_distributions(rng_key):
    """The fitted q as numpyro distributions carries the textbook posterior's usual parameters."""
    result = ConjugateBayes(normal_normal).run(rng_key, 1, Y_REAL, progress_bar=False)
    prec = 1 / S0**2 + len(Y_REAL) / SIGMA**2
    loc = (M0 / S0**2 + Y_REAL.sum() / SIGMA**2) / prec
    np.testing.assert_allclose(result.posterior["z"].loc, loc, rtol=RTOL)
    np.testing.assert_allclose(result.posterior["z"].scale, prec**-0.5, rtol=RTOL)

    result = ConjugateBayes(beta_bernoulli).run(rng_key, 1, Y_BIN, progress_bar=False)
    np.testing.assert_allclose(result.posterior["p"].concentration1, A0 + Y_BIN.sum(), rtol=RTOL)
    np.testing.assert_allclose(result.posterior["p"].concentration0, B0 + len(Y_BIN) - Y_BIN.sum(), rtol=RTOL)

    result = ConjugateBayes(gamma_poisson).run(rng_key, 1, Y_COUNT, progress_bar=False)
    np.testing.assert_allclose(result.posterior["lam"].concentration, A0 + Y_COUNT.sum(), rtol=RTOL)
    np.testing.assert_allclose(result.posterior["lam"].rate, B0 + len(Y_COUNT), rtol=RTOL)

    result = ConjugateBayes(dirichlet_categorical).run(rng_key, 1, Y_CAT, progress_bar=False)
    np.testing.assert_allclose(
        result.posterior["w"].concentration, ALPHA0 + np.bincount(Y_CAT, minlength=len(ALPHA0)), rtol=RTOL
    )


# ---------------------------------------------------------------------------
# Bayesian linear regression (ridge): Khan & Rue Sec. 1.3.3 and Eq. 54.

DELTA, SIGMA_LR = 2.0, 0.6
_rs = np.random.RandomState(11)
X_LR = _rs.randn(12, 3)
Y_LR = X_LR @ np.array([1.0, -0.5, 0.3]) + SIGMA_LR * _rs.randn(12)


def _ridge_prior(kind, d):
    if kind == "to_event":
        return dist.Normal(0.0, 1 / jnp.sqrt(DELTA)).expand([d]).to_event(1)
    if kind == "expand":
        return dist.Normal(0.0, DELTA**-0.5).expand([d])
    if kind == "mvn_covariance":
        return dist.MultivariateNormal(jnp.zeros(d), jnp.eye(d) / DELTA)
    if kind == "mvn_precision":
        return dist.MultivariateNormal(jnp.zeros(d), precision_matrix=DELTA * jnp.eye(d))
    raise ValueError(kind)


def ridge_model(X, y, prior="to_event"):
    beta = numpyro.sample("beta", _ridge_prior(prior, X.shape[1]))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, SIGMA_LR), obs=y)


@pytest.mark.parametrize("prior", ["to_event", "expand", "mvn_covariance", "mvn_precision"])
def test_bayesian_linear_regression_is_exact(prior, rng_key):
    """Posterior mean (X^T X + delta sigma^2 I)^-1 X^T y, covariance sigma^2 (X^T X + delta sigma^2 I)^-1;
    the ELBO is log N(y | 0, sigma^2 I + X X^T / delta)."""
    X, y = X_LR, Y_LR
    d = X.shape[1]
    a = X.T @ X + DELTA * SIGMA_LR**2 * np.eye(d)
    mean = np.linalg.solve(a, X.T @ y)
    cov = SIGMA_LR**2 * np.linalg.inv(a)
    result = ConjugateBayes(ridge_model).run(rng_key, 1, X, y, prior=prior, progress_bar=False)
    q = result.posterior["beta"]
    np.testing.assert_allclose(q.loc, mean, rtol=RTOL)
    np.testing.assert_allclose(q.covariance_matrix, cov, rtol=RTOL)
    evidence = multivariate_normal(np.zeros(len(y)), SIGMA_LR**2 * np.eye(len(y)) + X @ X.T / DELTA).logpdf(y)
    np.testing.assert_allclose(np.asarray(result.elbo), evidence, rtol=1e-8)


def test_ridge_site_parameters_are_the_normal_equations():
    """The likelihood's site parameter is (X^T y / sigma^2, -X^T X / (2 sigma^2)), the prior's (0, -delta I / 2)."""
    plan = ConjugateBayes(ridge_model).plan(X_LR, Y_LR)
    q = plan.qs["beta"]
    mean = {"beta": as_family_layout(q, gaussian(np.random.RandomState(5), (3,), 0))}
    by_factor = {e.factor: e.estimate(jax.random.key(0), mean, {}, plan.arrays)[1]["beta"] for e in plan.estimators}
    np.testing.assert_allclose(by_factor["y"].x, X_LR.T @ Y_LR / SIGMA_LR**2, rtol=RTOL)
    np.testing.assert_allclose(by_factor["y"].xxT, -0.5 * X_LR.T @ X_LR / SIGMA_LR**2, rtol=RTOL)
    np.testing.assert_allclose(by_factor["beta"].x, np.zeros(3), atol=1e-14)
    np.testing.assert_allclose(by_factor["beta"].xxT, -0.5 * DELTA * np.eye(3), rtol=RTOL, atol=1e-14)


def mean_field_regression(X, y):
    with numpyro.plate("D", X.shape[1]):
        beta = numpyro.sample("beta", dist.Normal(0.0, DELTA**-0.5))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, SIGMA_LR), obs=y)


def test_conjugate_bayes_refuses_coupled_mean_field_positions():
    import blrppl

    with pytest.raises(blrppl.ModelError, match="VMP"):
        ConjugateBayes(mean_field_regression).plan(X_LR, Y_LR)
