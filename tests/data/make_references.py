"""Make ``tests/data/references.json``: stored float64 reference posteriors for the tests.

Run from the repository root::

    /work/venv/bin/python -m tests.data.make_references

Every reference is computed in float64 from fixed seeds; the script checks each NUTS
run (split r-hat < 1.01, bulk ESS > 2000 for every stored component) and raises if one
fails.  The references:

``eight_schools``
    The eight-schools posterior over ``mu, tau, theta`` (and ``theta_raw``, ``log_tau``)
    by NUTS on the *non-centred* model (the centred one has divergences); both
    parameterisations define the same posterior over ``mu, tau, theta``.

``eight_schools_centered_meanfield`` / ``eight_schools_noncentered_meanfield``
    The exact optimum of the mean-field Gaussian family that numpyro's ``AutoNormal``
    parameterises (Normal on ``mu``, on each ``theta`` or ``theta_raw``, and on
    ``log tau``).  The ELBO is written in closed form (the HalfCauchy term by 64-node
    Gauss-Hermite quadrature), maximised by L-BFGS and polished by Newton steps; it is
    checked against a Monte Carlo ELBO and a long averaged ``AutoNormal`` SVI run.

``breast_cancer_logistic``
    Logistic regression with a N(0, I) prior on scikit-learn's breast-cancer data
    (standardised features, intercept prepended, D = 31): NUTS, the MAP by Newton's
    method and the Laplace covariance diagonal at the MAP.

``poisson_regression``
    The zoo's Poisson regression on its own ``data()``: NUTS.

``stochastic_volatility``
    The smoothed log-volatilities ``h0, h`` of ``models/stochastic_volatility.py`` (known
    constants, T = 60): NUTS.

Layout of ``references.json``: ``_about`` (versions), then one object per reference with
``metadata`` (settings and diagnostics), ``mean`` and ``sd`` (per site, constrained space;
nested lists for vector sites).  The mean-field references add ``loc`` and ``scale`` (per
site on the unconstrained space: ``mu``, ``theta`` or ``theta_raw``, ``log_tau``); their
``mean``/``sd`` are the moments of q itself (``tau`` log-normal, non-centred ``theta`` =
``mu + tau theta_raw`` under q).  ``breast_cancer_logistic`` adds ``map``,
``map_grad_norm`` and ``laplace_var`` (diagonal of the inverse negative Hessian at the MAP).
"""

from __future__ import annotations

import json
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
import numpyro
import scipy.optimize
from numpyro import handlers
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from sklearn.datasets import load_breast_cancer

from models import ZOO, stochastic_volatility

OUT = pathlib.Path(__file__).with_name("references.json")
MIN_ESS = 2000.0
MAX_R_HAT = 1.01
SIG_DIGITS = 8


# --------------------------------------------------------------------------- helpers


def _round(x):
    """Nested lists of floats rounded to ``SIG_DIGITS`` significant digits."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        return float(f"{float(arr):.{SIG_DIGITS}g}")
    return [_round(a) for a in arr]


def _nuts(model, args, kwargs, *, seed, num_warmup, num_samples, num_chains=4, **nuts_kwargs):
    """Run NUTS (chains one after another); return samples grouped by chain and metadata."""
    kernel = NUTS(model, **nuts_kwargs)
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("diverging",), **kwargs)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    metadata = {
        "method": "NUTS",
        "num_warmup": num_warmup,
        "num_samples": num_samples,
        "num_chains": num_chains,
        "chain_method": "sequential",
        "seed": seed,
        "num_divergences": int(np.sum(mcmc.get_extra_fields()["diverging"])),
        **{k: v for k, v in nuts_kwargs.items()},
    }
    return samples, metadata


def _summarise(name, samples, metadata):
    """Means, sds and convergence diagnostics of chain-grouped ``samples``; check them."""
    ess = {k: effective_sample_size(v) for k, v in samples.items()}
    r_hat = {k: split_gelman_rubin(v) for k, v in samples.items()}
    min_ess = min(float(np.min(e)) for e in ess.values())
    max_r_hat = max(float(np.max(r)) for r in r_hat.values())
    if not (min_ess > MIN_ESS and max_r_hat < MAX_R_HAT):
        raise RuntimeError(f"{name}: min ESS {min_ess:.0f}, max r-hat {max_r_hat:.4f}")
    flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in samples.items()}
    return {
        "metadata": {
            **metadata,
            "min_ess": _round(min_ess),
            "max_r_hat": _round(max_r_hat),
            "min_ess_per_site": {k: _round(np.min(e)) for k, e in ess.items()},
            "max_r_hat_per_site": {k: _round(np.max(r)) for k, r in r_hat.items()},
        },
        "mean": {k: _round(v.mean(0)) for k, v in flat.items()},
        "sd": {k: _round(v.std(0)) for k, v in flat.items()},
    }


# --------------------------------------------------------------------------- eight schools


def eight_schools():
    """NUTS on the non-centred eight schools; adds ``log_tau`` (``theta`` is recorded)."""
    zoo = ZOO["eight_schools_noncentered"]
    args, kwargs = zoo.data()
    samples, metadata = _nuts(
        zoo.model, args, kwargs, seed=0, num_warmup=2000, num_samples=25000, target_accept_prob=0.95
    )
    samples["log_tau"] = np.log(samples["tau"])
    metadata["model"] = "eight_schools_noncentered"
    return _summarise("eight_schools", samples, metadata)


GH_NODES, GH_WEIGHTS = np.polynomial.hermite.hermgauss(64)
LOG_2PI = float(np.log(2.0 * np.pi))


def _e_log_halfcauchy5_jac(m, s):
    """E[log HalfCauchy(5).pdf(exp S) + S] for S ~ N(m, s^2), by Gauss-Hermite quadrature."""
    nodes = m + jnp.sqrt(2.0) * s * GH_NODES
    softplus = jnp.logaddexp(0.0, 2.0 * nodes - 2.0 * jnp.log(5.0))  # log(1 + tau^2 / 25)
    return jnp.log(2.0 / (5.0 * jnp.pi)) - jnp.sum(GH_WEIGHTS * softplus) / jnp.sqrt(jnp.pi) + m


def _unpack(x):
    """Flat vector -> (m_mu, s_mu, m_logtau, s_logtau, m_theta[8], s_theta[8]); scales are exp(.)."""
    return x[0], jnp.exp(x[1]), x[2], jnp.exp(x[3]), x[4:12], jnp.exp(x[12:20])


def _entropy(x):
    """Entropy of the 10-dimensional diagonal Gaussian q."""
    return jnp.sum(0.5 * (LOG_2PI + 1.0) + jnp.concatenate([x[1:2], x[3:4], x[12:20]]))


def _e_log_normal(m, v, loc, scale):
    """E[log N(X; loc, scale)] for X with mean m and variance v (loc, scale fixed)."""
    return -0.5 * LOG_2PI - jnp.log(scale) - 0.5 * ((m - loc) ** 2 + v) / scale**2


def _elbo_centered(x, y, sigma):
    """Closed-form mean-field ELBO of the centred eight schools (q on mu, log tau, theta)."""
    m_mu, s_mu, m_lt, s_lt, m_th, s_th = _unpack(x)
    e_inv_tau2 = jnp.exp(-2.0 * m_lt + 2.0 * s_lt**2)
    log_p_theta = -0.5 * LOG_2PI - m_lt - 0.5 * ((m_th - m_mu) ** 2 + s_th**2 + s_mu**2) * e_inv_tau2
    return (
        _e_log_normal(m_mu, s_mu**2, 0.0, 5.0)
        + _e_log_halfcauchy5_jac(m_lt, s_lt)
        + jnp.sum(log_p_theta)
        + jnp.sum(_e_log_normal(m_th, s_th**2, y, sigma))
        + _entropy(x)
    )


def _elbo_noncentered(x, y, sigma):
    """Closed-form mean-field ELBO of the non-centred eight schools (q on mu, log tau, theta_raw)."""
    m_mu, s_mu, m_lt, s_lt, m_r, s_r = _unpack(x)
    e_tau, e_tau2 = jnp.exp(m_lt + 0.5 * s_lt**2), jnp.exp(2.0 * m_lt + 2.0 * s_lt**2)
    mean_theta = m_mu + e_tau * m_r
    var_theta = s_mu**2 + e_tau2 * (m_r**2 + s_r**2) - (e_tau * m_r) ** 2
    return (
        _e_log_normal(m_mu, s_mu**2, 0.0, 5.0)
        + _e_log_halfcauchy5_jac(m_lt, s_lt)
        + jnp.sum(_e_log_normal(m_r, s_r**2, 0.0, 1.0))
        + jnp.sum(_e_log_normal(mean_theta, var_theta, y, sigma))
        + _entropy(x)
    )


def _maximise(elbo, starts):
    """Maximise ``elbo`` from several starts (L-BFGS, then Newton to |grad| < 1e-10); keep the best."""
    neg = jax.jit(lambda x: -elbo(x))
    grad, hess = jax.jit(jax.grad(neg)), jax.jit(jax.hessian(neg))
    best = None
    for x0 in starts:
        res = scipy.optimize.minimize(
            neg, x0, jac=grad, method="L-BFGS-B", options={"maxiter": 20000, "gtol": 1e-12, "ftol": 1e-15}
        )
        x = jnp.asarray(res.x)
        for _ in range(50):
            g = grad(x)
            if float(jnp.linalg.norm(g)) < 1e-12:
                break
            x = x - jnp.linalg.solve(hess(x), g)
        if best is None or float(neg(x)) < float(neg(best)):
            best = x
    hess_eig = np.linalg.eigvalsh(np.asarray(hess(best)))
    return best, -float(neg(best)), float(jnp.linalg.norm(grad(best))), hess_eig


def _mc_elbo(model, args, kwargs, params, seed, num_particles=200_000):
    """Monte Carlo ELBO (mean, standard error) of an ``AutoNormal`` guide holding ``params``."""
    guide = AutoNormal(model)
    handlers.seed(guide, jax.random.PRNGKey(0))(*args, **kwargs)  # build the guide's prototype
    one = lambda key: -Trace_ELBO().loss(key, params, model, guide, *args, **kwargs)
    values = jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(seed), num_particles))
    return float(jnp.mean(values)), float(jnp.std(values) / np.sqrt(num_particles))


def _svi_autonormal(model, args, kwargs, seed, num_steps=30000, num_particles=256, average_last=10000):
    """A long ``AutoNormal`` SVI run (Adam, decaying step size) with the last iterates averaged."""
    guide = AutoNormal(model, init_scale=0.1)
    schedule = lambda i: 0.02 * 0.05 ** (i / num_steps)
    svi = SVI(model, guide, numpyro.optim.Adam(schedule), Trace_ELBO(num_particles=num_particles))
    state = svi.init(jax.random.PRNGKey(seed), *args, **kwargs)

    def step(carry, i):
        state, total = carry
        state, _ = svi.update(state, *args, **kwargs)
        params = svi.get_params(state)
        weight = (i >= num_steps - average_last).astype(jnp.float64)
        total = jax.tree.map(lambda t, p: t + weight * p, total, params)
        return (state, total), None

    zeros = jax.tree.map(jnp.zeros_like, svi.get_params(state))
    (state, total), _ = jax.jit(lambda s: jax.lax.scan(step, (s, zeros), jnp.arange(num_steps)))(state)
    return jax.tree.map(lambda t: t / average_last, total)


def _autonormal_params(x, local):
    """The ``AutoNormal`` parameter dict (constrained scales) of a flat optimum ``x``."""
    m_mu, s_mu, m_lt, s_lt, m_l, s_l = _unpack(x)
    return {
        "mu_auto_loc": m_mu,
        "mu_auto_scale": s_mu,
        "tau_auto_loc": m_lt,
        "tau_auto_scale": s_lt,
        f"{local}_auto_loc": m_l,
        f"{local}_auto_scale": s_l,
    }


def eight_schools_meanfield(parameterisation):
    """The exact mean-field (``AutoNormal``) optimum of eight schools in one parameterisation."""
    local = "theta" if parameterisation == "centered" else "theta_raw"
    elbo_fn = _elbo_centered if parameterisation == "centered" else _elbo_noncentered
    zoo = ZOO[f"eight_schools_{parameterisation}"]
    args, kwargs = zoo.data()
    y, sigma = kwargs["y"], args[0]
    starts = [
        np.concatenate([[m_mu, 0.0, m_lt, -1.0], np.full(8, m_th), np.full(8, -1.0)])
        for m_mu, m_lt, m_th in [
            (4.0, 1.0, 4.0 if local == "theta" else 0.0),
            (0.0, 2.5, 0.0),
            (8.0, -1.0, 1.0),
        ]
    ]
    x, elbo, grad_norm, hess_eig = _maximise(lambda v: elbo_fn(v, y, sigma), starts)
    params = _autonormal_params(x, local)
    mc_elbo, mc_elbo_se = _mc_elbo(zoo.model, args, kwargs, params, seed=1)
    svi_params = _svi_autonormal(zoo.model, args, kwargs, seed=2)
    svi_diff = max(float(jnp.max(jnp.abs(svi_params[k] - params[k]))) for k in params)
    m_mu, s_mu, m_lt, s_lt, m_l, s_l = _unpack(x)
    tau_mean = jnp.exp(m_lt + 0.5 * s_lt**2)
    tau_sd = tau_mean * jnp.sqrt(jnp.expm1(s_lt**2))
    if local == "theta":
        theta_mean, theta_sd = m_l, s_l
    else:  # theta = mu + tau theta_raw under q
        theta_mean = m_mu + tau_mean * m_l
        theta_sd = jnp.sqrt(s_mu**2 + (tau_sd**2 + tau_mean**2) * (m_l**2 + s_l**2) - (tau_mean * m_l) ** 2)
    return {
        "metadata": {
            "method": "closed-form mean-field ELBO (64-node Gauss-Hermite for the HalfCauchy term), "
            "L-BFGS then Newton",
            "model": f"eight_schools_{parameterisation}",
            "elbo": _round(elbo),
            "grad_norm": _round(grad_norm),
            "min_hessian_eigenvalue": _round(hess_eig.min()),
            "mc_elbo_200k_particles": _round(mc_elbo),
            "mc_elbo_standard_error": _round(mc_elbo_se),
            "mc_elbo_seed": 1,
            "svi_autonormal_max_abs_param_diff": _round(svi_diff),
            "svi_settings": "AutoNormal(init_scale=0.1), Adam 0.02 -> 0.001 exponential decay, "
            "30000 steps, 256 particles, last 10000 iterates averaged, seed 2",
        },
        "loc": {"mu": _round(m_mu), local: _round(m_l), "log_tau": _round(m_lt)},
        "scale": {"mu": _round(s_mu), local: _round(s_l), "log_tau": _round(s_lt)},
        "mean": {
            "mu": _round(m_mu),
            "tau": _round(tau_mean),
            "log_tau": _round(m_lt),
            "theta": _round(theta_mean),
            **({} if local == "theta" else {"theta_raw": _round(m_l)}),
        },
        "sd": {
            "mu": _round(s_mu),
            "tau": _round(tau_sd),
            "log_tau": _round(s_lt),
            "theta": _round(theta_sd),
            **({} if local == "theta" else {"theta_raw": _round(s_l)}),
        },
    }


# --------------------------------------------------------------------------- regressions


def breast_cancer_data():
    """Standardised breast-cancer features (ddof=0) with an intercept column prepended; y as float."""
    bunch = load_breast_cancer()
    features = (bunch.data - bunch.data.mean(0)) / bunch.data.std(0)
    X = np.column_stack([np.ones(features.shape[0]), features])
    return jnp.asarray(X), jnp.asarray(bunch.target, dtype=jnp.float64)


def _logistic_map(X, y, tol=1e-10):
    """MAP of beta ~ N(0, I), y ~ Bernoulli(logits=X beta) by Newton's method, and its Hessian."""
    X, y = np.asarray(X), np.asarray(y)
    beta = np.zeros(X.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(X @ beta)))
        grad = X.T @ (y - p) - beta
        neg_hess = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(X.shape[1])
        if np.linalg.norm(grad) < tol:
            break
        beta = beta + np.linalg.solve(neg_hess, grad)
    return beta, float(np.linalg.norm(grad)), neg_hess


def breast_cancer_logistic():
    """NUTS, the Newton MAP and the Laplace covariance diagonal for breast-cancer logistic regression."""
    X, y = breast_cancer_data()
    samples, metadata = _nuts(
        ZOO["logistic_regression"].model, (X,), {"y": y}, seed=3, num_warmup=1000, num_samples=5000
    )
    metadata["model"] = "logistic_regression"
    ref = _summarise("breast_cancer_logistic", samples, metadata)
    beta_map, grad_norm, neg_hess = _logistic_map(X, y)
    ref["map"] = {"beta": _round(beta_map)}
    ref["map_grad_norm"] = _round(grad_norm)
    ref["laplace_var"] = {"beta": _round(np.diag(np.linalg.inv(neg_hess)))}
    return ref


def poisson_regression():
    """NUTS on the zoo's Poisson regression and its data."""
    zoo = ZOO["poisson_regression"]
    args, kwargs = zoo.data()
    samples, metadata = _nuts(zoo.model, args, kwargs, seed=4, num_warmup=1000, num_samples=5000)
    metadata["model"] = "poisson_regression"
    return _summarise("poisson_regression", samples, metadata)


def stochastic_volatility_reference():
    """NUTS smoothing of the log-volatilities of ``models/stochastic_volatility.py``."""
    args, kwargs = stochastic_volatility.data()
    samples, metadata = _nuts(
        stochastic_volatility.model,
        args,
        kwargs,
        seed=5,
        num_warmup=2000,
        num_samples=10000,
        target_accept_prob=0.9,
    )
    metadata["model"] = "models/stochastic_volatility.py (not in ZOO)"
    return _summarise("stochastic_volatility", samples, metadata)


# --------------------------------------------------------------------------- main


REFERENCES = {
    "eight_schools": eight_schools,
    "eight_schools_centered_meanfield": lambda: eight_schools_meanfield("centered"),
    "eight_schools_noncentered_meanfield": lambda: eight_schools_meanfield("noncentered"),
    "breast_cancer_logistic": breast_cancer_logistic,
    "poisson_regression": poisson_regression,
    "stochastic_volatility": stochastic_volatility_reference,
}


def main():
    """Compute every reference, print its runtime, and write ``references.json``."""
    out = {
        "_about": {
            "generated_by": "tests/data/make_references.py",
            "dtype": "float64",
            "jax": jax.__version__,
            "numpyro": numpyro.__version__,
        }
    }
    for name, make in REFERENCES.items():
        start = time.perf_counter()
        out[name] = make()
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
