"""Exact site parameters of every conjugate pair, against closed-form VMP messages.

For each pair the log factor is written twice: with the canonical densities of
:mod:`blrppl.symbolic.canonical` (analysed directly), and as a NumPyro model
(traced by ``VMP.plan``, whose ``exact_estimator`` is then called). The site
parameter of a factor for a variable is ``jax.grad`` of ``E_q[log f]`` with
respect to the variable's mean parameters; it must equal the textbook natural
parameter message (Winn & Bishop 2005; Bishop PRML ch. 10) to rtol 1e-10, and
``E_q[log f]`` itself must equal its closed form.

Every pair appears as a likelihood (observed child) and, where the child can
be latent (it has a q family), as a hierarchical prior (latent child).
Poisson, Binomial and Multinomial children are counts, which have no q, so
those pairs are likelihoods only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import gammaln

from blrppl.engines.vmp import VMP
from blrppl.symbolic import canonical as C
from blrppl.symbolic.expectation import VarInfo

from ._helpers import (
    LOG_2PI,
    Case,
    G,
    bernoulli,
    beta,
    build_case,
    categorical,
    check_canonical,
    check_model,
    cov_of,
    dirichlet,
    gamma,
    gathered,
    gaussian,
    inverse_gamma,
    library_site_parameters,
    mvn_wishart_terms,
    normal_terms,
    normal_terms_variance,
    observed,
    scatter,
    sum_partials,
    wishart,
)

TAU_SCALES = {
    "one_over_sqrt": lambda tau: 1 / jnp.sqrt(tau),
    "power": lambda tau: tau**-0.5,
    "reciprocal_sqrt": lambda tau: jnp.reciprocal(jnp.sqrt(tau)),
    "lax_rsqrt": jax.lax.rsqrt,
}


# ---------------------------------------------------------------------------
# Normal with Gaussian mean and Gamma precision / inverse-Gamma variance.


def normal_gamma_likelihood(scale_of):
    def build(rs):
        y = rs.randn(7)
        infos = {"mu": G(), "tau": VarInfo("gamma", (), 0)}
        mean = {"mu": gaussian(rs, ()), "tau": gamma(rs)}
        val, p = normal_terms(observed(y), mean["mu"], mean["tau"]["x"], mean["tau"]["log_x"])
        msgs = {"mu": sum_partials(p, x="m.x", xx="m.xx"), "tau": sum_partials(p, x="prec", log_x="log_prec")}

        def log_factor(v):
            return jnp.sum(C._normal(y, v["mu"], scale_of(v["tau"])))

        def model(y):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
            with numpyro.plate("N", y.shape[0]):
                numpyro.sample("y", dist.Normal(mu, scale_of(tau)), obs=y)

        return Case(infos, mean, val.sum(), msgs, log_factor, model, (y,), "y")

    return build


def normal_gamma_prior(scale_of):
    """theta_j ~ Normal(mu, scale(tau)) with theta, mu and tau all latent."""

    def build(rs):
        J = 5
        infos = {"theta": G((J,)), "mu": G(), "tau": VarInfo("gamma", (), 0)}
        mean = {"theta": gaussian(rs, (J,)), "mu": gaussian(rs, ()), "tau": gamma(rs)}
        val, p = normal_terms(mean["theta"], mean["mu"], mean["tau"]["x"], mean["tau"]["log_x"])
        msgs = {
            "theta": {"x": p["v.x"], "xx": p["v.xx"]},
            "mu": sum_partials(p, x="m.x", xx="m.xx"),
            "tau": sum_partials(p, x="prec", log_x="log_prec"),
        }

        def log_factor(v):
            return jnp.sum(C._normal(v["theta"], v["mu"], scale_of(v["tau"])))

        def model(y):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
            with numpyro.plate("J", J):
                theta = numpyro.sample("theta", dist.Normal(mu, scale_of(tau)))
                numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

        return Case(infos, mean, val.sum(), msgs, log_factor, model, (rs.randn(J),), "theta")

    return build


def normal_invgamma_likelihood(rs):
    y = rs.randn(6)
    infos = {"mu": G(), "var": VarInfo("inverse_gamma", (), 0)}
    mean = {"mu": gaussian(rs, ()), "var": inverse_gamma(rs)}
    val, p = normal_terms_variance(observed(y), mean["mu"], mean["var"])
    msgs = {"mu": sum_partials(p, x="m.x", xx="m.xx"), "var": sum_partials(p, inv_x="inv_x", log_x="log_x")}

    def log_factor(v):
        return jnp.sum(C._normal(y, v["mu"], jnp.sqrt(v["var"])))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        var = numpyro.sample("var", dist.InverseGamma(3.0, 2.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, jnp.sqrt(var)), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (y,), "y")


def normal_invgamma_prior(rs):
    J = 4
    infos = {"theta": G((J,)), "mu": G(), "var": VarInfo("inverse_gamma", (), 0)}
    mean = {"theta": gaussian(rs, (J,)), "mu": gaussian(rs, ()), "var": inverse_gamma(rs)}
    val, p = normal_terms_variance(mean["theta"], mean["mu"], mean["var"])
    msgs = {
        "theta": {"x": p["v.x"], "xx": p["v.xx"]},
        "mu": sum_partials(p, x="m.x", xx="m.xx"),
        "var": sum_partials(p, inv_x="inv_x", log_x="log_x"),
    }

    def log_factor(v):
        return jnp.sum(C._normal(v["theta"], v["mu"], jnp.sqrt(v["var"])))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        var = numpyro.sample("var", dist.InverseGamma(3.0, 2.0))
        with numpyro.plate("J", J):
            theta = numpyro.sample("theta", dist.Normal(mu, jnp.sqrt(var)))
            numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (rs.randn(J),), "theta")


def normal_affine_constants(rs):
    """loc = 2 mu + 3, scale = 0.5 / sqrt(tau): precision 4 tau (chain rule through constants)."""
    y = rs.randn(6)
    infos = {"mu": G(), "tau": VarInfo("gamma", (), 0)}
    mean = {"mu": gaussian(rs, ()), "tau": gamma(rs)}
    mu, tau = mean["mu"], mean["tau"]
    loc = {"x": 2.0 * mu["x"] + 3.0, "xx": 4.0 * mu["xx"] + 12.0 * mu["x"] + 9.0}
    val, p = normal_terms(observed(y), loc, 4.0 * tau["x"], math.log(4.0) + tau["log_x"])
    msgs = {
        "mu": {"x": np.sum(2.0 * p["m.x"] + 12.0 * p["m.xx"]), "xx": np.sum(4.0 * p["m.xx"])},
        "tau": {"x": np.sum(4.0 * p["prec"]), "log_x": np.sum(p["log_prec"])},
    }

    def log_factor(v):
        return jnp.sum(C._normal(y, 2.0 * v["mu"] + 3.0, 0.5 / jnp.sqrt(v["tau"])))

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(2.0 * mu + 3.0, 0.5 / jnp.sqrt(tau)), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (y,), "y")


def regression(mean_field: bool):
    """y_n ~ Normal(alpha + X_n beta, rsqrt(tau)); beta a full block or mean-field."""

    def build(rs):
        N, D = 8, 3
        X, y = rs.randn(N, D), rs.randn(N)
        nb = 1 if mean_field else 0
        infos = {"alpha": G(), "beta": G((D,), nb), "tau": VarInfo("gamma", (), 0)}
        mean = {"alpha": gaussian(rs, ()), "beta": gaussian(rs, (D,), nb), "tau": gamma(rs)}
        a, b, t = mean["alpha"], mean["beta"], mean["tau"]
        m = b["x"]
        Xm = X @ m
        gram = X.T @ X
        if mean_field:
            quad = Xm**2 + (X**2) @ cov_of(b)  # E[(X_n beta)^2] includes sum_d X_nd^2 var_d
        else:
            quad = np.einsum("nd,de,ne->n", X, b["xx"], X)
        S = y**2 - 2 * y * (a["x"] + Xm) + a["xx"] + 2 * a["x"] * Xm + quad
        value = np.sum(-0.5 * LOG_2PI + 0.5 * t["log_x"] - 0.5 * t["x"] * S)
        if mean_field:
            off = gram - np.diag(np.diag(gram))
            beta_msg = {"x": t["x"] * (X.T @ (y - a["x"]) - off @ m), "xx": -0.5 * t["x"] * np.diag(gram)}
        else:
            beta_msg = {"x": t["x"] * X.T @ (y - a["x"]), "xx": -0.5 * t["x"] * gram}
        msgs = {
            "alpha": {"x": t["x"] * np.sum(y - Xm), "xx": -0.5 * N * t["x"]},
            "beta": beta_msg,
            "tau": {"x": -0.5 * np.sum(S), "log_x": 0.5 * N},
        }

        def log_factor(v):
            return jnp.sum(C._normal(y, v["alpha"] + X @ v["beta"], jax.lax.rsqrt(v["tau"])))

        def model(X, y):
            alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
            if mean_field:
                with numpyro.plate("D", D):
                    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
            else:
                beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([D]))
            tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
            with numpyro.plate("N", N):
                numpyro.sample("y", dist.Normal(alpha + X @ beta, jax.lax.rsqrt(tau)), obs=y)

        return Case(infos, mean, value, msgs, log_factor, model, (X, y), "y")

    return build


COUNTY = np.array([0, 0, 1, 3, 3, 3, 0, 1, 3, 1])  # county 2 has no data: its message is zero


def county_indexing(rs):
    """loc = alpha[county_idx] + b * x (integer-data indexing, radon-style)."""
    N, J = len(COUNTY), 4
    x, y = rs.randn(N), rs.randn(N)
    infos = {"alpha": G((J,)), "b": G(), "tau": VarInfo("gamma", (), 0)}
    mean = {"alpha": gaussian(rs, (J,)), "b": gaussian(rs, ()), "tau": gamma(rs)}
    a, b, t = gathered(mean["alpha"], COUNTY), mean["b"], mean["tau"]
    S = y**2 - 2 * y * (a["x"] + b["x"] * x) + a["xx"] + 2 * a["x"] * b["x"] * x + b["xx"] * x**2
    value = np.sum(-0.5 * LOG_2PI + 0.5 * t["log_x"] - 0.5 * t["x"] * S)
    msgs = {
        "alpha": {
            "x": scatter(t["x"] * (y - b["x"] * x), COUNTY, J),
            "xx": scatter(-0.5 * t["x"] * np.ones(N), COUNTY, J),
        },
        "b": {"x": t["x"] * np.sum(x * (y - a["x"])), "xx": -0.5 * t["x"] * np.sum(x**2)},
        "tau": {"x": -0.5 * np.sum(S), "log_x": 0.5 * N},
    }

    def log_factor(v):
        return jnp.sum(C._normal(y, v["alpha"][COUNTY] + v["b"] * x, 1 / jnp.sqrt(v["tau"])))

    def model(x, y):
        with numpyro.plate("J", J):
            alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Normal(alpha[COUNTY] + b * x, 1 / jnp.sqrt(tau)), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (x, y), "y")


REGION = np.array([0, 1, 1, 0, 2, 1])


def indexed_hierarchical_prior(rs):
    """alpha_j ~ Normal(mu[region_j], 1/sqrt(tau[region_j])): per-region mean and precision."""
    J, R = len(REGION), 3
    infos = {"alpha": G((J,)), "mu": G((R,)), "tau": VarInfo("gamma", (R,), 1)}
    mean = {"alpha": gaussian(rs, (J,)), "mu": gaussian(rs, (R,)), "tau": gamma(rs, (R,))}
    t = gathered(mean["tau"], REGION)
    val, p = normal_terms(mean["alpha"], gathered(mean["mu"], REGION), t["x"], t["log_x"])
    msgs = {
        "alpha": {"x": p["v.x"], "xx": p["v.xx"]},
        "mu": {"x": scatter(p["m.x"], REGION, R), "xx": scatter(p["m.xx"], REGION, R)},
        "tau": {"x": scatter(p["prec"], REGION, R), "log_x": scatter(p["log_prec"], REGION, R)},
    }

    def log_factor(v):
        return jnp.sum(C._normal(v["alpha"], v["mu"][REGION], 1 / jnp.sqrt(v["tau"][REGION])))

    def model(y):
        with numpyro.plate("R", R):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("J", J):
            alpha = numpyro.sample("alpha", dist.Normal(mu[REGION], 1 / jnp.sqrt(tau[REGION])))
            numpyro.sample("y", dist.Normal(alpha, 1.0), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (rs.randn(J),), "alpha")


GROUP = np.array([0, 1, 1, 0, 1, 0, 0])


def stacked_latents(rs):
    """loc = jnp.stack([a, b])[group]: two scalar latents stacked, then indexed."""
    N = len(GROUP)
    y = rs.randn(N)
    infos = {"a": G(), "b": G(), "tau": VarInfo("gamma", (), 0)}
    mean = {"a": gaussian(rs, ()), "b": gaussian(rs, ()), "tau": gamma(rs)}
    first = GROUP == 0
    loc = {k: np.where(first, mean["a"][k], mean["b"][k]) for k in ("x", "xx")}
    val, p = normal_terms(observed(y), loc, mean["tau"]["x"], mean["tau"]["log_x"])
    msgs = {
        "a": {"x": np.sum(p["m.x"][first]), "xx": np.sum(p["m.xx"][first])},
        "b": {"x": np.sum(p["m.x"][~first]), "xx": np.sum(p["m.xx"][~first])},
        "tau": sum_partials(p, x="prec", log_x="log_prec"),
    }

    def log_factor(v):
        return jnp.sum(C._normal(y, jnp.stack([v["a"], v["b"]])[GROUP], 1 / jnp.sqrt(v["tau"])))

    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Normal(jnp.stack([a, b])[GROUP], 1 / jnp.sqrt(tau)), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (y,), "y")


def concatenated_elementwise(rs):
    """loc = jnp.concatenate([a, b]) with mean-field vectors a (2,) and b (3,)."""
    y = rs.randn(5)
    infos = {"a": G((2,)), "b": G((3,)), "tau": VarInfo("gamma", (), 0)}
    mean = {"a": gaussian(rs, (2,)), "b": gaussian(rs, (3,)), "tau": gamma(rs)}
    loc = {k: np.concatenate([mean["a"][k], mean["b"][k]]) for k in ("x", "xx")}
    val, p = normal_terms(observed(y), loc, mean["tau"]["x"], mean["tau"]["log_x"])
    msgs = {
        "a": {"x": p["m.x"][:2], "xx": p["m.xx"][:2]},
        "b": {"x": p["m.x"][2:], "xx": p["m.xx"][2:]},
        "tau": sum_partials(p, x="prec", log_x="log_prec"),
    }

    def log_factor(v):
        return jnp.sum(C._normal(y, jnp.concatenate([v["a"], v["b"]]), 1 / jnp.sqrt(v["tau"])))

    def model(y):
        with numpyro.plate("A", 2):
            a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("B", 3):
            b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", 5):
            numpyro.sample("y", dist.Normal(jnp.concatenate([a, b]), 1 / jnp.sqrt(tau)), obs=y)

    return Case(infos, mean, val.sum(), msgs, log_factor, model, (y,), "y")


def concatenated_blocks(rs):
    """loc = X @ jnp.concatenate([a, b]) with full-covariance blocks a (2,) and b (3,)."""
    N = 7
    X, y = rs.randn(N, 5), rs.randn(N)
    Xa, Xb = X[:, :2], X[:, 2:]
    infos = {"a": G((2,), 0), "b": G((3,), 0), "tau": VarInfo("gamma", (), 0)}
    mean = {"a": gaussian(rs, (2,), 0), "b": gaussian(rs, (3,), 0), "tau": gamma(rs)}
    a, b, t = mean["a"], mean["b"], mean["tau"]
    la, lb = Xa @ a["x"], Xb @ b["x"]
    quad = np.einsum("nd,de,ne->n", Xa, a["xx"], Xa) + 2 * la * lb + np.einsum("nd,de,ne->n", Xb, b["xx"], Xb)
    S = y**2 - 2 * y * (la + lb) + quad
    value = np.sum(-0.5 * LOG_2PI + 0.5 * t["log_x"] - 0.5 * t["x"] * S)
    msgs = {
        "a": {"x": t["x"] * Xa.T @ (y - lb), "xx": -0.5 * t["x"] * Xa.T @ Xa},
        "b": {"x": t["x"] * Xb.T @ (y - la), "xx": -0.5 * t["x"] * Xb.T @ Xb},
        "tau": {"x": -0.5 * np.sum(S), "log_x": 0.5 * N},
    }

    def log_factor(v):
        return jnp.sum(C._normal(y, X @ jnp.concatenate([v["a"], v["b"]]), 1 / jnp.sqrt(v["tau"])))

    def model(X, y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([2]))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([3]))
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Normal(X @ jnp.concatenate([a, b]), 1 / jnp.sqrt(tau)), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (X, y), "y")


PAIR_I = np.array([0, 1, 2, 3, 2, 1])
PAIR_J = np.array([1, 2, 0, 3, 2, 3])  # pairs (3, 3) and (2, 2) compare a player with itself


def pairwise_differences(rs):
    """loc = alpha[i] - alpha[j] (paired comparisons); i == j gives loc = 0 exactly."""
    P, J, sigma = len(PAIR_I), 4, 0.8
    y = rs.randn(P)
    infos = {"alpha": G((J,))}
    mean = {"alpha": gaussian(rs, (J,))}
    m, xx = mean["alpha"]["x"], mean["alpha"]["xx"]
    prec = 1.0 / sigma**2
    value, gx, gxx = 0.0, np.zeros(J), np.zeros(J)
    for yp, i, j in zip(y, PAIR_I, PAIR_J, strict=True):
        if i == j:
            S = yp**2
        else:
            S = yp**2 - 2 * yp * (m[i] - m[j]) + xx[i] + xx[j] - 2 * m[i] * m[j]
            gx[i] += prec * (yp + m[j])
            gx[j] += prec * (m[i] - yp)
            gxx[i] += -0.5 * prec
            gxx[j] += -0.5 * prec
        value += -0.5 * LOG_2PI - math.log(sigma) - 0.5 * prec * S
    msgs = {"alpha": {"x": gx, "xx": gxx}}

    def log_factor(v):
        return jnp.sum(C._normal(y, v["alpha"][PAIR_I] - v["alpha"][PAIR_J], sigma))

    def model(y):
        with numpyro.plate("J", J):
            alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
        with numpyro.plate("P", P):
            numpyro.sample("y", dist.Normal(alpha[PAIR_I] - alpha[PAIR_J], sigma), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


# ---------------------------------------------------------------------------
# MultivariateNormal with a Gaussian mean block and a Wishart precision.


def mvn_wishart_likelihood(rs):
    N, d = 6, 3
    Y = rs.randn(N, d)
    infos = {"mu": G((d,), 0), "Lam": VarInfo("wishart", (d, d), 0)}
    mean = {"mu": gaussian(rs, (d,), 0), "Lam": wishart(rs, d)}
    values, S, L = mvn_wishart_terms(Y, Y[:, :, None] * Y[:, None, :], mean["mu"], mean["Lam"])
    msgs = {
        "mu": {"x": L @ Y.sum(0), "xx": -0.5 * N * L},
        "Lam": {"x": -0.5 * S.sum(0), "log_det_x": 0.5 * N},
    }

    def log_factor(v):
        return jnp.sum(C._mvn(Y, v["mu"], precision_matrix=v["Lam"]))

    def model(Y):
        mu = numpyro.sample("mu", dist.MultivariateNormal(jnp.zeros(d), jnp.eye(d)))
        lam = numpyro.sample("Lam", dist.Wishart(d + 2.0, jnp.eye(d)))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.MultivariateNormal(mu, precision_matrix=lam), obs=Y)

    return Case(infos, mean, values.sum(), msgs, log_factor, model, (Y,), "y")


def mvn_wishart_prior(rs):
    """theta_j ~ MVN(mu, precision_matrix=Lam), theta_j latent full-covariance rows."""
    J, d = 4, 2
    infos = {"theta": G((J, d), 1), "mu": G((d,), 0), "Lam": VarInfo("wishart", (d, d), 0)}
    mean = {"theta": gaussian(rs, (J, d), 1), "mu": gaussian(rs, (d,), 0), "Lam": wishart(rs, d)}
    th = mean["theta"]
    values, S, L = mvn_wishart_terms(th["x"], th["xx"], mean["mu"], mean["Lam"])
    msgs = {
        "theta": {"x": np.broadcast_to(L @ mean["mu"]["x"], (J, d)), "xx": np.broadcast_to(-0.5 * L, (J, d, d))},
        "mu": {"x": L @ th["x"].sum(0), "xx": -0.5 * J * L},
        "Lam": {"x": -0.5 * S.sum(0), "log_det_x": 0.5 * J},
    }

    def log_factor(v):
        return jnp.sum(C._mvn(v["theta"], v["mu"], precision_matrix=v["Lam"]))

    def model(Y):
        mu = numpyro.sample("mu", dist.MultivariateNormal(jnp.zeros(d), jnp.eye(d)))
        lam = numpyro.sample("Lam", dist.Wishart(d + 2.0, jnp.eye(d)))
        with numpyro.plate("J", J):
            theta = numpyro.sample("theta", dist.MultivariateNormal(mu, precision_matrix=lam))
            numpyro.sample("y", dist.MultivariateNormal(theta, jnp.eye(d)), obs=Y)

    return Case(infos, mean, values.sum(), msgs, log_factor, model, (rs.randn(J, d),), "theta")


# ---------------------------------------------------------------------------
# Gamma, Poisson and Exponential with a Gamma rate.

SHAPE = 2.5


def gamma_gamma_likelihood(rs):
    """y_n ~ Gamma(2.5, 3 b): a constant times the latent rate."""
    y = rs.gamma(2.0, 1.0, 6)
    infos = {"b": VarInfo("gamma", (), 0)}
    mean = {"b": gamma(rs)}
    b = mean["b"]
    value = np.sum(SHAPE * (math.log(3.0) + b["log_x"]) - gammaln(SHAPE) + (SHAPE - 1) * np.log(y) - 3.0 * b["x"] * y)
    msgs = {"b": {"log_x": SHAPE * len(y), "x": -3.0 * y.sum()}}

    def log_factor(v):
        return jnp.sum(C._gamma(y, SHAPE, 3.0 * v["b"]))

    def model(y):
        b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Gamma(SHAPE, 3.0 * b), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def gamma_gamma_prior(rs):
    """x_j ~ Gamma(2.5, b), x_j and b latent Gammas."""
    J = 5
    infos = {"x": VarInfo("gamma", (J,), 1), "b": VarInfo("gamma", (), 0)}
    mean = {"x": gamma(rs, (J,)), "b": gamma(rs)}
    x, b = mean["x"], mean["b"]
    value = np.sum(SHAPE * b["log_x"] - gammaln(SHAPE) + (SHAPE - 1) * x["log_x"] - b["x"] * x["x"])
    msgs = {
        "x": {"log_x": np.full(J, SHAPE - 1), "x": np.full(J, -b["x"])},
        "b": {"log_x": SHAPE * J, "x": -x["x"].sum()},
    }

    def log_factor(v):
        return jnp.sum(C._gamma(v["x"], SHAPE, v["b"]))

    def model(y):
        b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
        with numpyro.plate("J", J):
            x = numpyro.sample("x", dist.Gamma(SHAPE, b))
            numpyro.sample("y", dist.Poisson(x), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (jnp.arange(J) * 1.0,), "x")


def poisson_gamma_scalar(rs):
    y = rs.poisson(3.0, 8).astype(float)
    infos = {"lam": VarInfo("gamma", (), 0)}
    mean = {"lam": gamma(rs)}
    lam = mean["lam"]
    value = np.sum(y * lam["log_x"] - lam["x"] - gammaln(y + 1))
    msgs = {"lam": {"log_x": y.sum(), "x": -float(len(y))}}

    def log_factor(v):
        return jnp.sum(C._poisson(y, v["lam"]))

    def model(y):
        lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Poisson(lam), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def poisson_gamma_exposure(rs):
    """rate = lam[group] * exposure: indexing and a product with data."""
    N, Gn = len(GROUP), 2
    y = rs.poisson(2.0, N).astype(float)
    e = rs.uniform(0.5, 2.0, N)
    infos = {"lam": VarInfo("gamma", (Gn,), 1)}
    mean = {"lam": gamma(rs, (Gn,))}
    lam = gathered(mean["lam"], GROUP)
    value = np.sum(y * (np.log(e) + lam["log_x"]) - e * lam["x"] - gammaln(y + 1))
    msgs = {"lam": {"log_x": scatter(y, GROUP, Gn), "x": scatter(-e, GROUP, Gn)}}

    def log_factor(v):
        return jnp.sum(C._poisson(y, v["lam"][GROUP] * e))

    def model(y):
        with numpyro.plate("G", Gn):
            lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Poisson(lam[GROUP] * e), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def exponential_gamma_likelihood(rs):
    y = rs.exponential(1.0, 6)
    infos = {"b": VarInfo("gamma", (), 0)}
    mean = {"b": gamma(rs)}
    b = mean["b"]
    value = np.sum(b["log_x"] - b["x"] * y)
    msgs = {"b": {"log_x": float(len(y)), "x": -y.sum()}}

    def log_factor(v):
        return jnp.sum(C._exponential(y, v["b"]))

    def model(y):
        b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Exponential(b), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def exponential_gamma_prior(rs):
    """x_j ~ Exponential(b) with x_j latent Gammas: the message to x has log_x coefficient 0."""
    J = 4
    infos = {"x": VarInfo("gamma", (J,), 1), "b": VarInfo("gamma", (), 0)}
    mean = {"x": gamma(rs, (J,)), "b": gamma(rs)}
    x, b = mean["x"], mean["b"]
    value = np.sum(b["log_x"] - b["x"] * x["x"])
    msgs = {"x": {"log_x": np.zeros(J), "x": np.full(J, -b["x"])}, "b": {"log_x": float(J), "x": -x["x"].sum()}}

    def log_factor(v):
        return jnp.sum(C._exponential(v["x"], v["b"]))

    def model(y):
        b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
        with numpyro.plate("J", J):
            x = numpyro.sample("x", dist.Gamma(1.0, b))
            numpyro.sample("y", dist.Exponential(x), obs=y)

    # numpyro's prior for x is Gamma(1, b) (= Exponential(b)); the model only checks the plan path.
    return Case(infos, mean, value, msgs, log_factor, None, (), None)


# ---------------------------------------------------------------------------
# Bernoulli and Binomial with a Beta probability.


def bernoulli_beta_likelihood(rs):
    """y_n ~ Bernoulli(p[group_n]) with a Beta per group."""
    N, Gn = len(GROUP), 2
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    infos = {"p": VarInfo("beta", (Gn,), 1)}
    mean = {"p": beta(rs, (Gn,))}
    p = gathered(mean["p"], GROUP)
    value = np.sum(y * p["log_x"] + (1 - y) * p["log1m_x"])
    msgs = {"p": {"log_x": scatter(y, GROUP, Gn), "log1m_x": scatter(1 - y, GROUP, Gn)}}

    def log_factor(v):
        return jnp.sum(C._bernoulli_probs(y, v["p"][GROUP]))

    def model(y):
        with numpyro.plate("G", Gn):
            p = numpyro.sample("p", dist.Beta(2.0, 3.0))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Bernoulli(probs=p[GROUP]), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def bernoulli_beta_prior(rs):
    """z_n ~ Bernoulli(p) with z latent (Bernoulli q) and p a latent Beta."""
    N = 5
    infos = {"z": VarInfo("bernoulli", (N,), 1), "p": VarInfo("beta", (), 0)}
    mean = {"z": bernoulli(rs, (N,)), "p": beta(rs)}
    z, p = mean["z"]["x"], mean["p"]
    value = np.sum(z * p["log_x"] + (1 - z) * p["log1m_x"])
    msgs = {"z": {"x": np.full(N, p["log_x"] - p["log1m_x"])}, "p": {"log_x": z.sum(), "log1m_x": np.sum(1 - z)}}

    def log_factor(v):
        return jnp.sum(C._bernoulli_probs(v["z"], v["p"]))

    def model(y):
        p = numpyro.sample("p", dist.Beta(2.0, 3.0))
        with numpyro.plate("N", N):
            z = numpyro.sample("z", dist.Bernoulli(probs=p))
            numpyro.sample("y", dist.Normal(1.0 * z, 1.0), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (rs.randn(N),), "z")


def binomial_beta_likelihood(rs):
    n = np.array([5.0, 3.0, 8.0, 1.0, 4.0])
    y = np.array([2.0, 3.0, 0.0, 1.0, 2.0])
    infos = {"p": VarInfo("beta", (), 0)}
    mean = {"p": beta(rs)}
    p = mean["p"]
    log_comb = gammaln(n + 1) - gammaln(y + 1) - gammaln(n - y + 1)
    value = np.sum(log_comb + y * p["log_x"] + (n - y) * p["log1m_x"])
    msgs = {"p": {"log_x": y.sum(), "log1m_x": np.sum(n - y)}}

    def log_factor(v):
        return jnp.sum(C._binomial_probs(y, v["p"], total_count=n))

    def model(y):
        p = numpyro.sample("p", dist.Beta(2.0, 3.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Binomial(n, probs=p), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


# ---------------------------------------------------------------------------
# Categorical and Multinomial with Dirichlet probabilities; the mixture.

K = 3


def categorical_dirichlet_likelihood(rs):
    """y_n ~ Categorical(w[group_n]) with a Dirichlet per group (indexing the batch axis)."""
    N, Gn = len(GROUP), 2
    y = np.array([0, 2, 2, 1, 0, 0, 2])
    infos = {"w": VarInfo("dirichlet", (Gn, K), 1)}
    mean = {"w": dirichlet(rs, (Gn,), K)}
    elog = mean["w"]["log_x"]
    value = np.sum(elog[GROUP, y])
    counts = np.zeros((Gn, K))
    np.add.at(counts, (GROUP, y), 1.0)
    msgs = {"w": {"log_x": counts}}

    def log_factor(v):
        return jnp.sum(C._categorical_probs(y, v["w"][GROUP]))

    def model(y):
        with numpyro.plate("G", Gn):
            w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("N", N):
            numpyro.sample("y", dist.Categorical(probs=w[GROUP]), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def categorical_dirichlet_prior(rs):
    """z_n ~ Categorical(probs=w), z latent: the mixture's assignment prior."""
    N = 6
    infos = {"z": VarInfo("categorical", (N,), 1, K), "w": VarInfo("dirichlet", (K,), 0)}
    mean = {"z": categorical(rs, (N,), K), "w": dirichlet(rs, (), K)}
    r, elog = mean["z"]["one_hot"], mean["w"]["log_x"]
    value = np.sum(r * elog)
    msgs = {"z": {"one_hot": np.broadcast_to(elog, (N, K))}, "w": {"log_x": r.sum(0)}}

    def log_factor(v):
        return jnp.sum(C._categorical_probs(v["z"], v["w"]))

    def model(y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
        mu = jnp.array([-2.0, 0.0, 2.0])
        with numpyro.plate("N", N):
            z = numpyro.sample("z", dist.Categorical(probs=w))
            numpyro.sample("y", dist.Normal(mu[z], 1.0), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (rs.randn(N),), "z")


def multinomial_dirichlet_likelihood(rs):
    T = 6
    Y = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0], [4.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    infos = {"w": VarInfo("dirichlet", (K,), 0)}
    mean = {"w": dirichlet(rs, (), K)}
    elog = mean["w"]["log_x"]
    value = np.sum(gammaln(T + 1.0) - gammaln(Y + 1).sum(-1) + Y @ elog)
    msgs = {"w": {"log_x": Y.sum(0)}}

    def log_factor(v):
        return jnp.sum(C._multinomial_probs(Y, v["w"], total_count=T))

    def model(Y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("N", Y.shape[0]):
            numpyro.sample("y", dist.Multinomial(T, probs=w), obs=Y)

    return Case(infos, mean, value, msgs, log_factor, model, (Y,), "y")


def _mixture(rs, latent_child: bool):
    N = 6
    infos = {"z": VarInfo("categorical", (N,), 1, K), "mu": G((K,)), "lam": VarInfo("gamma", (K,), 1)}
    mean = {"z": categorical(rs, (N,), K), "mu": gaussian(rs, (K,)), "lam": gamma(rs, (K,))}
    if latent_child:
        infos["theta"] = G((N,))
        mean["theta"] = gaussian(rs, (N,))
        child = {k: a[:, None] for k, a in mean["theta"].items()}
    else:
        y = rs.randn(N)
        child = observed(y[:, None])
    r = mean["z"]["one_hot"]
    vnk, p = normal_terms(child, mean["mu"], mean["lam"]["x"], mean["lam"]["log_x"])  # (N, K)
    msgs = {
        "z": {"one_hot": vnk},
        "mu": {"x": np.sum(r * p["m.x"], 0), "xx": np.sum(r * p["m.xx"], 0)},
        "lam": {"x": np.sum(r * p["prec"], 0), "log_x": np.sum(r * p["log_prec"], 0)},
    }
    if latent_child:
        msgs["theta"] = {"x": np.sum(r * p["v.x"], 1), "xx": np.sum(r * p["v.xx"], 1)}
    value = np.sum(r * vnk)
    if latent_child:

        def log_factor(v):
            z = v["z"]
            return jnp.sum(C._normal(v["theta"], v["mu"][z], 1 / jnp.sqrt(v["lam"][z])))

        def model(y):
            w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
            with numpyro.plate("K", K):
                mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
                lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
            with numpyro.plate("N", N):
                z = numpyro.sample("z", dist.Categorical(probs=w))
                theta = numpyro.sample("theta", dist.Normal(mu[z], 1 / jnp.sqrt(lam[z])))
                numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

        return Case(infos, mean, value, msgs, log_factor, model, (rs.randn(N),), "theta")

    def log_factor(v):
        z = v["z"]
        return jnp.sum(C._normal(y, v["mu"][z], 1 / jnp.sqrt(v["lam"][z])))

    def model(y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
        with numpyro.plate("K", K):
            mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
            lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
        with numpyro.plate("N", N):
            z = numpyro.sample("z", dist.Categorical(probs=w))
            numpyro.sample("y", dist.Normal(mu[z], 1 / jnp.sqrt(lam[z])), obs=y)

    return Case(infos, mean, value, msgs, log_factor, model, (y,), "y")


def mixture_likelihood(rs):
    return _mixture(rs, latent_child=False)


def mixture_prior(rs):
    return _mixture(rs, latent_child=True)


# ---------------------------------------------------------------------------
# The table.

CASES = {
    **{f"normal_gamma_likelihood[{k}]": normal_gamma_likelihood(f) for k, f in TAU_SCALES.items()},
    **{f"normal_gamma_prior[{k}]": normal_gamma_prior(f) for k, f in TAU_SCALES.items()},
    "normal_invgamma_likelihood": normal_invgamma_likelihood,
    "normal_invgamma_prior": normal_invgamma_prior,
    "normal_affine_constants": normal_affine_constants,
    "regression_full_block": regression(mean_field=False),
    "regression_mean_field": regression(mean_field=True),
    "county_indexing": county_indexing,
    "indexed_hierarchical_prior": indexed_hierarchical_prior,
    "stacked_latents": stacked_latents,
    "concatenated_elementwise": concatenated_elementwise,
    "concatenated_blocks": concatenated_blocks,
    "pairwise_differences": pairwise_differences,
    "mvn_wishart_likelihood": mvn_wishart_likelihood,
    "mvn_wishart_prior": mvn_wishart_prior,
    "gamma_gamma_likelihood": gamma_gamma_likelihood,
    "gamma_gamma_prior": gamma_gamma_prior,
    "poisson_gamma_scalar": poisson_gamma_scalar,
    "poisson_gamma_exposure": poisson_gamma_exposure,
    "exponential_gamma_likelihood": exponential_gamma_likelihood,
    "exponential_gamma_prior": exponential_gamma_prior,
    "bernoulli_beta_likelihood": bernoulli_beta_likelihood,
    "bernoulli_beta_prior": bernoulli_beta_prior,
    "binomial_beta_likelihood": binomial_beta_likelihood,
    "categorical_dirichlet_likelihood": categorical_dirichlet_likelihood,
    "categorical_dirichlet_prior": categorical_dirichlet_prior,
    "multinomial_dirichlet_likelihood": multinomial_dirichlet_likelihood,
    "mixture_likelihood": mixture_likelihood,
    "mixture_prior": mixture_prior,
}


def _build(name: str) -> Case:
    return build_case(CASES, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonical_site_parameters(name):
    """Canonical-density log factor: E_q[log f] and jax.grad of it equal the closed forms."""
    check_canonical(_build(name))


MODEL_CASES = sorted(n for n in CASES if _build(n).model is not None)


@pytest.mark.parametrize("name", MODEL_CASES)
def test_model_site_parameters(name):
    """The same factor written as a NumPyro model, through VMP.plan and exact_estimator."""
    check_model(_build(name), VMP)


def test_site_parameters_do_not_depend_on_own_mean():
    """E_q[log f] is affine in each variable's statistics: the site parameter for mu
    does not move when mu's q moves (it does when tau's q moves)."""
    case = _build("normal_gamma_likelihood[one_over_sqrt]")
    _, g1 = library_site_parameters(case.log_factor, case.infos, case.mean)
    moved = dict(case.mean, mu={"x": case.mean["mu"]["x"] + 1.3, "xx": case.mean["mu"]["xx"] + 4.0})
    _, g2 = library_site_parameters(case.log_factor, case.infos, moved)
    np.testing.assert_allclose(g1["mu"]["x"], g2["mu"]["x"], rtol=1e-14)
    np.testing.assert_allclose(g1["mu"]["xx"], g2["mu"]["xx"], rtol=1e-14)
    moved_tau = dict(case.mean, tau={"x": case.mean["tau"]["x"] * 2.0, "log_x": case.mean["tau"]["log_x"]})
    _, g3 = library_site_parameters(case.log_factor, case.infos, moved_tau)
    np.testing.assert_allclose(g3["mu"]["xx"], 2.0 * g1["mu"]["xx"], rtol=1e-12)
