"""A latent with several joint axes (a (6, 2) matrix, no plates): one Gaussian over its entries."""

import jax
import numpy as np

import blrppl
from models import ZOO
from models.multivariate_regression import NOISE_COVARIANCE


def dense_posterior(X, y, prior_sd=2.0):
    """Gaussian conditioning of vec(W) (C order), independently of blrppl."""
    X, y = np.asarray(X), np.asarray(y)
    n, d = X.shape
    k = y.shape[1]
    noise_precision = np.linalg.inv(NOISE_COVARIANCE)
    precision = np.eye(d * k) / prior_sd**2
    shift = np.zeros(d * k)
    for x_n, y_n in zip(X, y):
        a = np.kron(x_n[None, :], np.eye(k))  # y_n = a vec(W)
        precision += a.T @ noise_precision @ a
        shift += a.T @ noise_precision @ y_n
    cov = np.linalg.inv(precision)
    mean = cov @ shift
    # log evidence: y ~ N(0, A S0 A^T + I (x) Sigma) over the stacked outputs
    a_all = np.kron(X, np.eye(k))
    marginal = prior_sd**2 * a_all @ a_all.T + np.kron(np.eye(n), NOISE_COVARIANCE)
    sign, logdet = np.linalg.slogdet(marginal)
    flat = y.reshape(-1)
    log_evidence = -0.5 * (flat @ np.linalg.solve(marginal, flat) + logdet + flat.size * np.log(2 * np.pi))
    return mean.reshape(d, k), cov, log_evidence


def test_conjugate_bayes_is_the_exact_joint_posterior(rng_key):
    entry = ZOO["multivariate_regression"]
    args, kwargs = entry.data()
    result = blrppl.ConjugateBayes(entry.model).run(rng_key, 1, *args, progress_bar=False, **kwargs)
    mean, cov, log_evidence = dense_posterior(args[0], kwargs["y"])
    q = result.posterior["W"]
    assert q.mean.shape == (6, 2) and q.variance.shape == (6, 2)
    np.testing.assert_allclose(q.mean, mean, atol=1e-8)
    np.testing.assert_allclose(q.covariance_matrix, cov, atol=1e-8)
    np.testing.assert_allclose(q.variance, np.diag(cov).reshape(6, 2), atol=1e-8)
    np.testing.assert_allclose(result.elbo[-1], log_evidence, rtol=1e-10)
    draws = result.sample(rng_key, 4000)["W"]
    assert draws.shape == (4000, 6, 2)
    np.testing.assert_allclose(draws.mean(0), mean, atol=5 * np.sqrt(np.diag(cov)).max() / np.sqrt(4000) * 2)


def test_matrix_latent_in_a_nonconjugate_fit_keeps_its_shape(rng_key):
    entry = ZOO["multivariate_regression"]
    args, kwargs = entry.data()
    init = {"W": np.ones((6, 2))}
    result = blrppl.NonConjugateVI(entry.model, learning_rate=1.0, init=init).run(
        rng_key, 3, *args, progress_bar=False, num_restarts=2, **kwargs
    )
    mean, _, _ = dense_posterior(args[0], kwargs["y"])
    np.testing.assert_allclose(result.posterior["W"].mean, mean, atol=1e-6)  # exact: every factor is conjugate
    idata = result.to_arviz(rng_key, num_samples=50)
    assert idata.posterior["W"].shape[-2:] == (6, 2)


def test_matrix_latent_in_a_joint_block_has_moments_in_its_shape(rng_key):
    """blocks="all" holds W in one Gaussian with another latent: W's marginal has .mean and
    .variance of shape (6, 2) (numpyro's reshaped distribution raised NotImplementedError)."""
    import numpyro
    import numpyro.distributions as dist

    entry = ZOO["multivariate_regression"]
    args, kwargs = entry.data()

    def model(X, y=None):
        shift = numpyro.sample("shift", dist.Normal(0.0, 1.0))
        W = numpyro.sample("W", dist.Normal(np.zeros((6, 2)), 2.0).to_event(2))
        numpyro.sample("y", dist.StudentT(4.0, X @ W + shift, 1.0).to_event(2), obs=y)  # non-conjugate

    result = blrppl.NonConjugateVI(model, blocks="all").run(rng_key, 50, *args, progress_bar=False, **kwargs)
    q = result.posterior["W"]
    assert q.mean.shape == (6, 2) and q.variance.shape == (6, 2)
    draws = np.asarray(result.sample(rng_key, 20000)["W"])
    np.testing.assert_allclose(q.mean, draws.mean(0), atol=4 * np.sqrt(q.variance).max() / np.sqrt(20000))
    np.testing.assert_allclose(q.variance, draws.var(0), rtol=0.05)
