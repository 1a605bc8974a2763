"""Brute-force posteriors of models conjugate given one or two hyperparameters (numpy only).

Each reference integrates the hyperparameters on a dense grid of their log
(the trapezoidal rule on a smooth integrand that has decayed at both ends),
with everything else integrated analytically: the conjugate latents c are a
joint Gaussian given h, so log p(y | h) and p(c | h, y) are dense Gaussian
algebra. Independent of blrppl: no tracing, no exponential families.
"""

import numpy as np
from scipy import special

LOG_2PI = np.log(2.0 * np.pi)


def gaussian_conditional(prior_cov, loadings, noise_cov, y):
    """x ~ N(0, C), y = A x + e, e ~ N(0, R): (log p(y), E[x | y], Cov[x | y]); batched over a leading axis."""
    cov_xy = prior_cov @ np.swapaxes(loadings, -1, -2)
    cov_yy = loadings @ cov_xy + noise_cov
    chol = np.linalg.cholesky(cov_yy)
    white = np.linalg.solve(chol, y[..., None])[..., 0]
    log_det = 2.0 * np.sum(np.log(np.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    log_p = -0.5 * (np.sum(white**2, -1) + log_det + y.shape[-1] * LOG_2PI)
    gain = np.swapaxes(np.linalg.solve(cov_yy, np.swapaxes(cov_xy, -1, -2)), -1, -2)
    mean = (gain @ y[..., None])[..., 0]
    cov = prior_cov - gain @ np.swapaxes(cov_xy, -1, -2)
    return log_p, mean, cov


class Reference:
    """Moments of a posterior from a weighted 1-D grid of h: what the tests compare with.

    Attributes:
      log_evidence: log p(y).
      hyper: site -> (mean, sd) of h's sites.
      latent: name -> (mean, sd) of the conjugate latents (vectors).
    """

    def __init__(self, log_evidence, hyper, latent):
        self.log_evidence, self.hyper, self.latent = log_evidence, hyper, latent


def integrate_1d(log_u, log_joint, means, covs, values):
    """Trapezoidal weights on a uniform grid in u = log h; returns (log p(y), w, moments)."""
    du = log_u[1] - log_u[0]
    top = np.max(log_joint)
    w = np.exp(log_joint - top)
    w[0] *= 0.5
    w[-1] *= 0.5
    total = np.sum(w)
    log_evidence = top + np.log(total * du)
    w = w / total
    mean = np.einsum("n,ni->i", w, means)
    second = np.einsum("n,nii->i", w, covs) + np.einsum("n,ni->i", w, means**2)
    h_mean = np.sum(w * values)
    h_sd = np.sqrt(np.sum(w * values**2) - h_mean**2)
    return log_evidence, mean, np.sqrt(second - mean**2), (h_mean, h_sd)


def eight_schools(y, sigma, mu_sd=5.0, tau_scale=5.0, num=8001):
    """mu ~ N(0, mu_sd²), tau ~ HalfCauchy(tau_scale), theta_j ~ N(mu, tau²), y_j ~ N(theta_j, sigma_j²).

    x = (mu, theta) is Gaussian given tau; y = [0 I] x + e. Returns the
    posterior of mu, theta, tau and log p(y).
    """
    y, sigma = np.asarray(y, float), np.asarray(sigma, float)
    J = y.shape[0]
    u = np.linspace(-30.0, 12.0, num)
    tau = np.exp(u)
    prior = np.empty((num, J + 1, J + 1))
    prior[:] = mu_sd**2
    prior[:, 1:, 1:] += tau[:, None, None] ** 2 * np.eye(J)
    loadings = np.broadcast_to(np.concatenate([np.zeros((J, 1)), np.eye(J)], 1), (num, J, J + 1))
    log_lik, mean, cov = gaussian_conditional(prior, loadings, np.diag(sigma**2), np.broadcast_to(y, (num, J)))
    log_prior = np.log(2.0 / np.pi) + np.log(tau_scale) - np.log(tau_scale**2 + tau**2)
    log_z, m, sd, tau_moments = integrate_1d(u, log_lik + log_prior + u, mean, cov, tau)
    return Reference(log_z, {"tau": tau_moments}, {"mu": (m[0], sd[0]), "theta": (m[1:], sd[1:])})


def linear_regression(X, y, alpha_sd=10.0, beta_sd=1.0, sigma_scale=1.0, num=8001):
    """alpha ~ N(0, alpha_sd²), beta ~ N(0, beta_sd² I), sigma ~ HalfNormal(sigma_scale), y ~ N(alpha + X beta, sigma²)."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    n, d = X.shape
    u = np.linspace(-12.0, 4.0, num)
    sigma = np.exp(u)
    design = np.concatenate([np.ones((n, 1)), X], 1)
    prior = np.diag(np.r_[alpha_sd**2, np.full(d, beta_sd**2)])
    # Given sigma, whiten by sigma: y / sigma = (design / sigma) x + e, e ~ N(0, I); log p(y) gains -n log sigma.
    loadings = design[None] / sigma[:, None, None]
    log_lik, mean, cov = gaussian_conditional(np.broadcast_to(prior, (num, d + 1, d + 1)), loadings, np.eye(n), y[None] / sigma[:, None])
    log_lik = log_lik - n * u
    log_prior = 0.5 * np.log(2.0 / np.pi) - np.log(sigma_scale) - 0.5 * (sigma / sigma_scale) ** 2
    log_z, m, sd, sigma_moments = integrate_1d(u, log_lik + log_prior + u, mean, cov, sigma)
    return Reference(log_z, {"sigma": sigma_moments}, {"alpha": (m[0], sd[0]), "beta": (m[1:], sd[1:])})
