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
    """A posterior on a weighted 1-D grid of h = exp(u): what the tests compare with.

    Attributes:
      log_evidence: log p(y).
      hyper: h's site -> (mean, sd).
      latent: name -> (mean, sd) of the conjugate latents (vectors).
      weights, means, covs, values, log_density_u: the grid (trapezoid
        weights, the Gaussian p(c | h, y) at each node, h, log p(u | y)).
    """

    def __init__(self, log_u, log_joint, means, covs, values, names, log_joint_at=None):
        du = log_u[1] - log_u[0]
        top = np.max(log_joint)
        w = np.exp(log_joint - top)
        w[0] *= 0.5
        w[-1] *= 0.5
        total = np.sum(w)
        self.log_evidence = top + np.log(total * du)
        self.weights = w / total
        self.means, self.covs, self.values = means, covs, values
        self.log_joint_at = log_joint_at
        mean = np.einsum("n,ni->i", self.weights, means)
        second = np.einsum("n,nii->i", self.weights, covs) + np.einsum("n,ni->i", self.weights, means**2)
        sd = np.sqrt(second - mean**2)
        h_mean = np.sum(self.weights * values)
        self.hyper = {names[0]: (h_mean, np.sqrt(np.sum(self.weights * values**2) - h_mean**2))}
        self.latent = {}
        for name, index in names[1].items():
            self.latent[name] = (mean[index], sd[index])

    def latent_covariance(self, index):
        """Cov[c_index | y] for a slice of the conjugate latents: within- plus between-node parts."""
        m, c = self.means[:, index], self.covs[:, index, index]
        mean = self.weights @ m
        second = np.einsum("n,nij->ij", self.weights, c) + np.einsum("n,ni,nj->ij", self.weights, m, m)
        return second - np.outer(mean, mean)

    def latent_log_density(self, index, x):
        """log p(c_index = x | y): the Gaussian mixture over the grid."""
        m, v = self.means[:, index], self.covs[:, index, index]
        x = np.asarray(x, float)[..., None]
        log_n = -0.5 * ((x - m) ** 2 / v + np.log(2.0 * np.pi * v))
        return special.logsumexp(log_n, b=self.weights, axis=-1)

    def hyper_log_density(self, h):
        """log p(h | y) = log p(y, u) - log p(y) - u at h = e^u."""
        u = np.log(np.asarray(h, float))
        return self.log_joint_at(u) - self.log_evidence - u


def eight_schools(y, sigma, mu_sd=5.0, tau_scale=5.0, num=8001):
    """mu ~ N(0, mu_sd²), tau ~ HalfCauchy(tau_scale), theta_j ~ N(mu, tau²), y_j ~ N(theta_j, sigma_j²).

    x = (mu, theta) is Gaussian given tau; y = [0 I] x + e. Returns the
    posterior of mu, theta, tau and log p(y).
    """
    y, sigma = np.asarray(y, float), np.asarray(sigma, float)
    J = y.shape[0]

    def conditional(u):
        tau, n = np.exp(u), u.shape[0]
        prior = np.empty((n, J + 1, J + 1))
        prior[:] = mu_sd**2
        prior[:, 1:, 1:] += tau[:, None, None] ** 2 * np.eye(J)
        loadings = np.broadcast_to(np.concatenate([np.zeros((J, 1)), np.eye(J)], 1), (n, J, J + 1))
        log_lik, mean, cov = gaussian_conditional(prior, loadings, np.diag(sigma**2), np.broadcast_to(y, (n, J)))
        log_prior = np.log(2.0 / np.pi) + np.log(tau_scale) - np.log(tau_scale**2 + tau**2)
        return log_lik + log_prior + u, mean, cov

    u = np.linspace(-30.0, 12.0, num)
    log_joint, mean, cov = conditional(u)
    names = ("tau", {"mu": 0, "theta": slice(1, None)})
    return Reference(u, log_joint, mean, cov, np.exp(u), names, lambda u: conditional(np.atleast_1d(u))[0])


def linear_regression(X, y, alpha_sd=10.0, beta_sd=1.0, sigma_scale=1.0, num=4001):
    """alpha ~ N(0, alpha_sd²), beta ~ N(0, beta_sd² I), sigma ~ HalfNormal(sigma_scale), y ~ N(alpha + X beta, sigma²).

    Information form for x = (alpha, beta) given sigma: Λ = P⁻¹ + ZᵀZ / σ²,
    b = Zᵀy / σ², and log p(y | σ) = -n/2 log 2π - n log σ - ½ log det(P Λ)
    - ½ (yᵀy / σ² - bᵀ Λ⁻¹ b) (the matrix determinant lemma).
    """
    X, y = np.asarray(X, float), np.asarray(y, float)
    n, d = X.shape
    u = np.linspace(-12.0, 4.0, num)
    sigma = np.exp(u)
    design = np.concatenate([np.ones((n, 1)), X], 1)
    prior_var = np.r_[alpha_sd**2, np.full(d, beta_sd**2)]
    precision = np.diag(1.0 / prior_var)[None] + (design.T @ design)[None] / sigma[:, None, None] ** 2
    shift = (design.T @ y)[None] / sigma[:, None] ** 2
    cov = np.linalg.inv(precision)
    mean = np.einsum("nij,nj->ni", cov, shift)
    log_det = np.linalg.slogdet(precision)[1] + np.sum(np.log(prior_var))
    quad = (y @ y) / sigma**2 - np.einsum("ni,ni->n", shift, mean)
    log_lik = -0.5 * n * LOG_2PI - n * u - 0.5 * log_det - 0.5 * quad
    log_prior = 0.5 * np.log(2.0 / np.pi) - np.log(sigma_scale) - 0.5 * (sigma / sigma_scale) ** 2
    return Reference(u, log_lik + log_prior + u, mean, cov, sigma, ("sigma", {"alpha": 0, "beta": slice(1, None)}))


def local_level(y, obs_scale, level_scale, initial_mean, initial_sd, num=(200, 320), reach=((1.5, 6.5), (-14.0, 6.0))):
    """level_0 ~ N(m0, s0²), level_t ~ N(level_{t-1}, level_sd²), y_t ~ N(level_t, obs_sd²), HalfNormal sds.

    A Kalman filter (log p(y | h)) and RTS smoother (p(levels | h, y)) at
    every node of a grid over (log obs_sd, log level_sd), vectorised over
    the nodes; the trapezoidal rule in 2-D. Returns (log p(y), moments) with
    moments: site -> (mean, sd) for ``obs_sd``, ``level_sd`` and ``level``
    (level_0, ..., level_T).
    """
    y = np.asarray(y, float)
    u1 = np.linspace(*reach[0], num[0])
    u2 = np.linspace(*reach[1], num[1])
    g1, g2 = np.meshgrid(u1, u2, indexing="ij")
    obs_var, level_var = np.exp(2 * g1).ravel(), np.exp(2 * g2).ravel()
    T, G = y.shape[0], obs_var.shape[0]
    filtered_m, filtered_p = np.empty((T + 1, G)), np.empty((T + 1, G))
    m, p = np.full(G, initial_mean), np.full(G, initial_sd**2)
    filtered_m[0], filtered_p[0] = m, p
    log_lik = np.zeros(G)
    for t in range(T):
        p = p + level_var
        s = p + obs_var
        log_lik += -0.5 * ((y[t] - m) ** 2 / s + np.log(2 * np.pi * s))
        gain = p / s
        m, p = m + gain * (y[t] - m), (1 - gain) * p
        filtered_m[t + 1], filtered_p[t + 1] = m, p
    smooth_m, smooth_p = np.empty_like(filtered_m), np.empty_like(filtered_p)
    smooth_m[T], smooth_p[T] = m, p
    for t in range(T - 1, -1, -1):
        predicted = filtered_p[t] + level_var
        back = filtered_p[t] / predicted
        smooth_m[t] = filtered_m[t] + back * (smooth_m[t + 1] - filtered_m[t])
        smooth_p[t] = filtered_p[t] + back**2 * (smooth_p[t + 1] - predicted)
    log_prior = sum(
        0.5 * np.log(2 / np.pi) - np.log(scale) - 0.5 * np.exp(2 * u) / scale**2 + u
        for u, scale in ((g1.ravel(), obs_scale), (g2.ravel(), level_scale))
    )
    log_joint = log_lik + log_prior
    w = np.exp(log_joint - log_joint.max()).reshape(num)
    w[[0, -1], :] *= 0.5
    w[:, [0, -1]] *= 0.5
    cell = (u1[1] - u1[0]) * (u2[1] - u2[0])
    log_evidence = log_joint.max() + np.log(np.sum(w) * cell)
    w = (w / np.sum(w)).ravel()
    edge = np.ones(num, bool)
    edge[1:-1, 1:-1] = False
    assert np.sum(w[edge.ravel()]) < 1e-9, "the reference grid is too small"
    moments = {}
    for name, values in (("obs_sd", np.exp(g1).ravel()), ("level_sd", np.exp(g2).ravel())):
        mean = np.sum(w * values)
        moments[name] = (mean, np.sqrt(np.sum(w * values**2) - mean**2))
    mean = smooth_m @ w
    moments["level"] = (mean, np.sqrt((smooth_p + smooth_m**2) @ w - mean**2))
    return log_evidence, moments
