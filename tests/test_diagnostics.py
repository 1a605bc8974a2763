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
from blrppl.diagnostics import ParetoK, bad_threshold, log_importance_ratios
from tests.float32 import run_in_float32


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


def test_exact_posterior_is_reported_exact(rng_key):
    result = blrppl.ConjugateBayes(normal_normal).run(rng_key, 1, Y, progress_bar=False)
    log_ratio = log_importance_ratios(result, jax.random.key(1), 200)
    # log p(z, y) - log q(z) = log p(y) = the ELBO of the exact q, for every draw.
    np.testing.assert_allclose(log_ratio, result.elbo[-1], rtol=1e-12)
    diagnostic = result.pareto_k(jax.random.key(1))
    assert isinstance(diagnostic, ParetoK) and diagnostic.k == -math.inf
    assert diagnostic.verdict == "exact" and diagnostic.ess == 1000 and diagnostic.collapsed == ()
    assert diagnostic.spread <= diagnostic.rounding
    assert str(diagnostic).startswith("Pareto k -inf: exact (log weights constant up to rounding")


FLOAT32_EXACT = """
import jax, blrppl
from models import ZOO
for name in ["beta_bernoulli", "gamma_poisson"]:
    entry = ZOO[name]
    args, kwargs = entry.data()
    engine = blrppl.ConjugateBayes(entry.model)
    result = engine.run(jax.random.key(0), 1, *args, progress_bar=False, **kwargs)
    for seed in range(3):
        d = result.pareto_k(jax.random.key(seed))
        print(name, d.verdict, d.k, d.spread, d.rounding)
"""


@pytest.mark.slow  # a float32 subprocess: ~20 s on 2 cores
def test_exact_posterior_in_float32_is_exact_not_a_tail_fit_to_rounding():
    """In float32 (the CLI) an exact q's log ratios are a lattice of a few values ulps
    apart; PSIS fitted to that lattice gave k anywhere from -5 to +inf."""
    lines = run_in_float32(FLOAT32_EXACT).strip().splitlines()
    assert len(lines) == 6
    for line in lines:
        name, verdict, k, spread, rounding = line.split()
        assert verdict == "exact" and float(k) == -math.inf, line
        assert 0.0 < float(spread) <= float(rounding), line


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


def test_a_collapsed_q_is_flagged_and_never_reported_good(rng_key):
    """A point-mass-like q used to give constant ratios and "-inf (good)"."""
    exact = blrppl.ConjugateBayes(normal_normal).run(rng_key, 1, Y, progress_bar=False)
    # Below float64 resolution: every draw is the mean, the ratios are constant.
    point = moved(exact, 0.0, 1e-40).pareto_k(jax.random.key(1))
    assert point.collapsed == ("z",) and point.k == math.inf and point.verdict == "bad"
    assert "q collapsed for 'z'" in str(point)
    # Resolvable, 1e-7 of the posterior sd: the ratios vary like exp(z^2 / 2), whose
    # tail has k = 1 only asymptotically; whatever k-hat is, the collapse is reported.
    narrow = moved(exact, 0.0, 1e-14).pareto_k(jax.random.key(1))
    assert narrow.collapsed == ("z",) and math.isfinite(narrow.k)
    assert f"({narrow.verdict}" in str(narrow) and "q collapsed for 'z'" in str(narrow)
    assert exact.pareto_k(jax.random.key(1)).collapsed == ()


def logistic(X, y):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


@pytest.mark.slow  # compilation-bound (Laplace's Newton steps): ~25 s on 2 cores
def test_a_good_gaussian_approximation_of_a_logistic_regression_is_not_bad(rng_key):
    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(100), rng.normal(size=(100, 2))])
    y = (rng.random(100) < 1 / (1 + np.exp(-(X @ np.array([-0.5, 1.0, -1.0]))))).astype(float)
    X, y = jnp.asarray(X), jnp.asarray(y)
    result = blrppl.Laplace(logistic).run(rng_key, 50, X, y, progress_bar=False)
    diagnostic = result.pareto_k(jax.random.key(1), num_samples=4000)
    assert diagnostic.k < 0.7 and diagnostic.verdict in ("good", "ok")
    assert diagnostic.ess > 3000 and diagnostic.collapsed == ()


def collinear_regression(X, y):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(2), 10.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, 1.0), obs=y)


def test_mean_field_q_of_a_strongly_correlated_posterior_is_bad(rng_key):
    """Posterior correlation ~ -0.999: mean-field q has the conditional variances,
    about 1/500 of the marginal ones, so k is about 1 (Yao et al. 2018, Sec. 3)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=50)
    X = jnp.asarray(np.column_stack([x, x + 0.05 * rng.normal(size=50)]))
    y = X @ jnp.array([1.0, 1.0]) + jnp.asarray(rng.normal(size=50))
    full = blrppl.VMP(collinear_regression).run(rng_key, 1, X, y, progress_bar=False)
    mean_field = blrppl.VMP(collinear_regression, families={"beta": "DiagonalNormal"})
    mean_field = mean_field.run(rng_key, 100, X, y, progress_bar=False)
    assert full.pareto_k(jax.random.key(1)).verdict == "exact"
    diagnostic = mean_field.pareto_k(jax.random.key(1))
    assert diagnostic.k >= 0.7 and diagnostic.verdict == "bad" and diagnostic.ess < 100


@pytest.mark.parametrize("num_samples", [100, 1000, 4000, 100000])
def test_the_label_always_agrees_with_the_number_printed(num_samples):
    threshold = bad_threshold(num_samples)
    assert threshold == pytest.approx(min(1 - 1 / math.log10(num_samples), 0.7))
    edges = [0.495, 0.4949, 0.5, 0.665, 0.6666, 0.6667, 0.695, 0.6999]
    grid = np.concatenate([np.linspace(-1.0, 2.0, 3001), edges])
    for k in grid:
        diagnostic = ParetoK(float(k), 900.0, num_samples)
        text = str(diagnostic)
        shown = float(text.split()[2])
        expected = "bad" if shown >= round(threshold, 2) else ("good" if shown < 0.5 else "ok")
        assert diagnostic.verdict == expected and f"({expected}" in text, text
        if expected == "bad":  # the threshold printed is one the number printed reaches
            printed = float(text.split("k >= ")[1].split()[0])
            assert shown >= printed and "ESS 900" in text and "not reliable" in text, text
    for k, verdict in [(-math.inf, "exact"), (math.inf, "bad"), (math.nan, "bad")]:
        diagnostic = ParetoK(k, float(num_samples), num_samples, spread=0.0, rounding=1e-12)
        assert diagnostic.verdict == verdict and f"{verdict}" in str(diagnostic)


def test_a_refit_on_new_data_computes_its_ratios_without_compiling(rng_key):
    """The log-ratio program takes the data as arguments: one compilation per plan signature, and
    a refit's ratios (which read the new data) equal those of a program compiled for its plan."""
    import blrppl.draws
    from tests.compiles import compilations

    engine = blrppl.ConjugateBayes(normal_normal)
    engine.run(rng_key, 1, Y, progress_bar=False).pareto_k(jax.random.key(1), 200)
    refit = engine.run(rng_key, 1, Y + 2.0, progress_bar=False)
    with compilations() as messages:
        shared = log_importance_ratios(refit, jax.random.key(1), 200)
    assert messages == []
    # The exact posterior of the new data: every ratio is its log evidence, not the old data's.
    np.testing.assert_allclose(shared, refit.elbo[-1], rtol=1e-10)
    blrppl.draws._COMPILED.clear()
    np.testing.assert_allclose(shared, log_importance_ratios(refit, jax.random.key(1), 200), rtol=1e-12)
