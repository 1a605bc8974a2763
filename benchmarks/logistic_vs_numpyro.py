"""Issue 6: Bayesian logistic regression, N = 100,000, D = 20, against NumPyro.

blrppl's ``NonConjugateVI`` (full-covariance Gaussian q; the likelihood's
linear predictors are found in the model code and integrated by Gauss-Hermite,
so every step is deterministic) against

- NumPyro SVI with ``AutoMultivariateNormal`` and Adam: time to an ELBO within
  0.1 nat of the best ELBO either method reached (target: blrppl >= 10x faster);
- NumPyro NUTS: time to posterior means as accurate as blrppl's (target:
  blrppl >= 20x faster). "As accurate": NUTS's means within 0.1 posterior sd of
  the VI means (the posterior is very nearly Gaussian at this N), i.e. an
  effective sample size of a few hundred; the run uses 300 warm-up and 300
  kept draws and reports the error it reached.

Every ELBO here is exact to ~1e-9 (Gauss-Hermite on each linear predictor plus
closed-form prior and entropy terms), never a noisy estimate. Float64.

    python -m benchmarks.logistic_vs_numpyro [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import optax  # noqa: E402
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoMultivariateNormal  # noqa: E402

import blrppl  # noqa: E402
from benchmarks._timing import table  # noqa: E402
from blrppl.blr.driver import run  # noqa: E402
from blrppl.estimators.quadrature import hermite_rule  # noqa: E402

N, D = 100_000, 20


def model(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def data():
    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(N), rng.normal(size=(N, D - 1))])
    beta = rng.normal(0.0, 0.5, D)
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-X @ beta))).astype(np.float64)
    return jnp.asarray(X), jnp.asarray(y)


def exact_elbo(X, y):
    """ELBO of q = N(m, L Lᵀ) by 48-node Gauss-Hermite on each linear predictor."""
    nodes, weights = (jnp.asarray(a) for a in hermite_rule(48))

    @jax.jit
    def elbo(m, L):
        eta_mean = X @ m
        eta_sd = jnp.sqrt(jnp.sum((X @ L) ** 2, axis=1))
        eta = eta_mean[:, None] + eta_sd[:, None] * nodes[:, 0]
        lik = jnp.sum((y[:, None] * eta - jnp.logaddexp(0.0, eta)) @ weights)
        cov = L @ L.T
        prior = -0.5 * D * jnp.log(2 * jnp.pi) - 0.5 * (m @ m + jnp.trace(cov))
        entropy = 0.5 * D * (1 + jnp.log(2 * jnp.pi)) + jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))
        return lik + prior + entropy

    return elbo


def blrppl_fit(X, y, elbo):
    engine = blrppl.NonConjugateVI(model, learning_rate=0.5)
    start = time.perf_counter()
    plan = engine.plan(X, y=y)
    analysis = time.perf_counter() - start
    algorithm = engine.build(plan)
    run(algorithm, jax.random.key(0), 200, plan.arrays, progress_bar=False, tol=1e-6)  # compile
    start = time.perf_counter()
    state, trace, _ = run(algorithm, jax.random.key(0), 200, plan.arrays, progress_bar=False, tol=1e-6)
    jax.block_until_ready(trace)
    fit = time.perf_counter() - start
    mean = plan.qs["beta"].family.mean_params(state.natural["beta"])
    cov = mean.xxT - jnp.outer(mean.x, mean.x)
    m, L = mean.x, jnp.linalg.cholesky(cov)
    return m, cov, np.asarray(trace), fit, analysis, float(elbo(m, L))


def numpyro_svi(X, y, elbo, target, budget):
    guide = AutoMultivariateNormal(model)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.key(0), X, y=y)
    chunk = 250

    @jax.jit
    def train(state):
        return jax.lax.scan(lambda s, _: svi.update(s, X, y=y), state, None, length=chunk)

    def exact(params):
        posterior = guide.get_posterior(params)
        return float(elbo(posterior.loc, posterior.scale_tril))

    train(state)  # compile
    spent, steps, value, best = 0.0, 0, -np.inf, -np.inf
    while spent < budget:
        start = time.perf_counter()
        state, _ = train(state)
        jax.block_until_ready(state)
        spent += time.perf_counter() - start
        steps += chunk
        value = exact(svi.get_params(state))
        best = max(best, value)
        if value >= target - 0.1:
            return spent, steps, value, True
    return spent, steps, best, False


def numpyro_nuts(X, y, mean, cov):
    kernel = NUTS(model)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=300, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(1), X, y=y)
    draws = np.asarray(mcmc.get_samples()["beta"])
    spent = time.perf_counter() - start
    sd = np.sqrt(np.diag(np.asarray(cov)))
    error = np.max(np.abs(draws.mean(0) - np.asarray(mean)) / sd)
    ess = float(np.min(numpyro.diagnostics.effective_sample_size(draws[None])))
    return spent, error, ess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=300.0, help="seconds of NumPyro SVI training at most")
    args = parser.parse_args()
    X, y = data()
    elbo = exact_elbo(X, y)
    m, cov, trace, fit, analysis, best = blrppl_fit(X, y, elbo)
    steps_needed = int(np.argmax(trace >= best - 0.1)) + 1
    t_blr = fit * steps_needed / len(trace)
    spent, svi_steps, svi_elbo, reached = numpyro_svi(X, y, elbo, best, args.budget)
    nuts_time, nuts_error, nuts_ess = numpyro_nuts(X, y, m, cov)
    note = "" if reached else f" (not reached in {args.budget:.0f} s: ratio is a lower bound)"
    print(table(
        [
            ("blrppl NonConjugateVI (to within 0.1 nat)", f"{t_blr:.3f} s", f"{steps_needed} steps", f"ELBO {best:.3f}"),
            ("  run to tol 1e-6", f"{fit:.3f} s", f"{len(trace)} steps", ""),
            ("  analysis + predictor detection (once)", f"{analysis:.3f} s", "", ""),
            ("NumPyro SVI AutoMVN + Adam(0.01)", f"{spent:.2f} s", f"{svi_steps} steps", f"ELBO {svi_elbo:.3f}{note}"),
            ("NumPyro NUTS 300 + 300 (incl. compile)", f"{nuts_time:.2f} s", f"min ESS {nuts_ess:.0f}", f"max |mean err| {nuts_error:.3f} sd"),
            ("SVI / blrppl (target >= 10)", f"{spent / t_blr:.0f}x", "", f"with analysis: {spent / (t_blr + analysis):.1f}x"),
            ("NUTS / blrppl (target >= 20)", f"{nuts_time / t_blr:.0f}x", "", f"with analysis: {nuts_time / (t_blr + analysis):.1f}x"),
        ],
        (f"logistic N = {N:,}, D = {D}", "time", "steps", "quality"),
    ))


if __name__ == "__main__":
    main()
