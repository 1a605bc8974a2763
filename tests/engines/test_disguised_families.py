"""Distributions that are an exponential family in disguise: their edges are exact.

``Uniform(0, 1)`` is ``Beta(1, 1)``, ``Exponential(rate)`` is ``Gamma(1, rate)``,
``Chi2(k)`` is ``Gamma(k / 2, 1 / 2)``, a ``Delta`` observation that records a
deterministic value is a constant factor, and ``log(1 - theta)`` in an
enumerated ``Categorical(jnp.stack([theta, 1 - theta]))`` is a Beta statistic.
References are closed forms and a hand-written coordinate ascent.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from scipy.special import betaln, digamma, gammaln

import blrppl
from models import ZOO
from models.baseball import fully_pooled


def conjugate_bayes(model, *args, **kwargs):
    return blrppl.ConjugateBayes(model).run(jax.random.key(0), 1, *args, progress_bar=False, **kwargs)


def all_exact(model, *args, **kwargs):
    graph = blrppl.trace(model, *args, **kwargs)
    return all(edge.conjugate for node in graph.factors.values() for edge in node.edges.values())


def test_uniform_prior_is_beta_one_one_baseball():
    entry = ZOO["baseball"]
    args, kwargs = entry.data()
    assert blrppl.trace(entry.model, *args, **kwargs).variables["phi"].family == "Beta"
    assert all_exact(entry.model, *args, **kwargs)
    result = conjugate_bayes(entry.model, *args, **kwargs)
    at_bats, hits = np.asarray(args[0]), np.asarray(kwargs["y"])
    q = result.posterior["phi"]
    np.testing.assert_allclose(q.concentration1, 1.0 + hits, rtol=1e-12)
    np.testing.assert_allclose(q.concentration0, 1.0 + at_bats - hits, rtol=1e-12)
    log_choose = gammaln(at_bats + 1) - gammaln(hits + 1) - gammaln(at_bats - hits + 1)
    log_evidence = np.sum(log_choose + betaln(1 + hits, 1 + at_bats - hits))
    np.testing.assert_allclose(result.elbo[-1], log_evidence, rtol=1e-10)
    pooled = conjugate_bayes(fully_pooled, *args, **kwargs).posterior["phi"]
    np.testing.assert_allclose([pooled.concentration1, pooled.concentration0], [1 + hits.sum(), 1 + (at_bats - hits).sum()])


def test_uniform_on_other_bounds_is_not_beta_and_latent_bounds_are_not_conjugate():
    def shifted():
        numpyro.sample("u", dist.Uniform(2.0, 5.0))

    assert blrppl.trace(shifted).variables["u"].family == "Normal"

    def latent_bound(y):
        theta = numpyro.sample("theta", dist.Gamma(2.0, 1.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Uniform(0.0, theta), obs=y)

    edge = blrppl.trace(latent_bound, jnp.array([0.1, 0.5])).factors["y"].edges["theta"]
    assert edge.conjugate is False and "support" in edge.reason


def test_exponential_and_chi2_are_gamma():
    x = jnp.array([0.5, 1.2, 0.3, 2.0, 0.7])
    counts = jnp.array([1.0, 0.0, 3.0, 2.0, 1.0])

    def model(x, counts):
        lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
        s = numpyro.sample("s", dist.Exponential(2.0))
        t = numpyro.sample("t", dist.Chi2(3.0))
        with numpyro.plate("n", 5):
            numpyro.sample("x", dist.Exponential(lam), obs=x)
            numpyro.sample("c1", dist.Poisson(s), obs=counts)
            numpyro.sample("c2", dist.Poisson(t), obs=counts)

    assert all_exact(model, x, counts)
    q = conjugate_bayes(model, x, counts).posterior
    np.testing.assert_allclose([q["lam"].concentration, q["lam"].rate], [2.0 + 5, 1.0 + float(x.sum())], rtol=1e-12)
    np.testing.assert_allclose([q["s"].concentration, q["s"].rate], [1.0 + float(counts.sum()), 2.0 + 5], rtol=1e-12)
    np.testing.assert_allclose([q["t"].concentration, q["t"].rate], [1.5 + float(counts.sum()), 0.5 + 5], rtol=1e-12)


def test_geometric_likelihood_is_beta_conjugate():
    y = jnp.array([0.0, 3.0, 1.0, 2.0])

    def model(y):
        p = numpyro.sample("p", dist.Uniform(0.0, 1.0))
        with numpyro.plate("n", 4):
            numpyro.sample("y", dist.Geometric(p), obs=y)

    q = conjugate_bayes(model, y).posterior["p"]
    np.testing.assert_allclose([q.concentration1, q.concentration0], [1.0 + 4, 1.0 + float(y.sum())], rtol=1e-12)


def test_delta_observation_records_a_value_and_changes_nothing():
    y = jnp.array([0.1, 0.2, 0.3])

    def model(y, record=True):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        if record:
            numpyro.sample("twice", dist.Delta(2.0 * mu), obs=2.0 * mu)
        with numpyro.plate("n", 3):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    assert all_exact(model, y)
    with_delta, without = conjugate_bayes(model, y), conjugate_bayes(model, y, record=False)
    np.testing.assert_allclose(with_delta.posterior["mu"].loc, 0.15, rtol=1e-12)
    np.testing.assert_allclose(with_delta.elbo, without.elbo, rtol=1e-12)

    def impossible():
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("twice", dist.Delta(2.0 * mu), obs=1.0)

    try:
        blrppl.trace(impossible)
    except blrppl.ModelError as error:
        assert "'twice'" in str(error) and "Delta" in str(error)
    else:
        raise AssertionError("a Delta observation of another value must be a ModelError")


def log_mix_cavi(y, iterations=500):
    """Coordinate ascent for models/log_mix.py, written out by hand."""
    y = np.asarray(y)
    a, b = 2.0, 2.0
    m, v = np.array([-2.0, 2.0]), np.ones(2)
    for _ in range(iterations):
        log_pi = np.array([digamma(a) - digamma(a + b), digamma(b) - digamma(a + b)])
        log_r = log_pi - 0.5 * ((y[:, None] - m) ** 2 + v)
        r = np.exp(log_r - log_r.max(1, keepdims=True))
        r /= r.sum(1, keepdims=True)
        a, b = 2.0 + r[:, 0].sum(), 2.0 + r[:, 1].sum()
        precision = 1.0 + r.sum(0)
        m = (np.array([-2.0, 2.0]) + (r * y[:, None]).sum(0)) / precision
        v = 1.0 / precision
    return a, b, m, v, r


def test_log_mix_with_a_beta_weight_is_exact():
    entry = ZOO["log_mix"]
    args, kwargs = entry.data()
    graph = blrppl.trace(entry.model, *args, **kwargs)
    assert graph.factors["z"].edges["theta"].conjugate, graph.factors["z"].edges["theta"].reason
    result = blrppl.VMP(entry.model).run(jax.random.key(0), 300, *args, progress_bar=False, tol=1e-14, **kwargs)
    a, b, m, v, r = log_mix_cavi(kwargs["y"])
    q = result.posterior
    np.testing.assert_allclose([q["theta"].concentration1, q["theta"].concentration0], [a, b], rtol=1e-8)
    np.testing.assert_allclose(q["mu"].mean, m, rtol=1e-8)
    np.testing.assert_allclose(np.diag(q["mu"].covariance_matrix), v, rtol=1e-8)
    np.testing.assert_allclose(q["z"].probs, r, atol=1e-8)
