"""Issue 7: EM on a hidden Markov model (Baum-Welch) against a hand-written jit Baum-Welch.

K = 3 states, Normal emissions (a mean per state, one shared scale), T = 10,000
observations; the initial distribution, the transition matrix and the emission
parameters are ``numpyro.param`` sites. blrppl's EM step is the exact E-step on
the chain Categorical q (forward-backward) plus the M-step by Newton's method on
the expected log joint, plus the ELBO; the peers are one jit-compiled function
doing forward-backward in log space (``lax.scan``) and the closed-form M-step,
and the same on probabilities (Rabiner's scaled Baum-Welch).
Both start from the same parameters; the script checks that they agree after
the timed iterations and prints the time per iteration and their ratio.

    python -m benchmarks.hmm_em [--length T]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import logsumexp
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints

import blrppl
from blrppl.blr.driver import run
from benchmarks._timing import best_time, table

jax.config.update("jax_enable_x64", True)

K = 3
STEPS = 20
INIT = jnp.full(K, 1.0 / K)
TRANS = jnp.full((K, K), 0.1 / (K - 1)) + (0.9 - 0.1 / (K - 1)) * jnp.eye(K)
MU = jnp.array([-1.0, 0.0, 1.0])
SIGMA = 2.0


def hmm(y):
    init = numpyro.param("init", INIT, constraint=constraints.simplex)
    trans = numpyro.param("trans", TRANS, constraint=constraints.simplex)
    mu = numpyro.param("mu", MU)
    sigma = numpyro.param("sigma", SIGMA, constraint=constraints.positive)
    z0 = numpyro.sample("z0", dist.Categorical(init))

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(mu[z], sigma), obs=y_t)
        return z, None

    scan(transition, z0, y)


def make_data(length, rng):
    true_trans = np.array([[0.95, 0.03, 0.02], [0.04, 0.9, 0.06], [0.05, 0.05, 0.9]])
    z = np.zeros(length + 1, int)
    for t in range(1, length + 1):
        z[t] = rng.choice(K, p=true_trans[z[t - 1]])
    return np.array([-3.0, 0.5, 4.0])[z[1:]] + rng.normal(size=length)


@jax.jit
def baum_welch_step(params, y):
    """One Baum-Welch iteration; the chain is z_0..z_T, emissions from z_1 on."""
    init, trans, mu, sigma = params
    log_trans = jnp.log(trans)
    log_emission = jax.scipy.stats.norm.logpdf(y[:, None], mu, sigma)
    unary = jnp.concatenate([jnp.log(init)[None], log_emission])

    # Scaled forward-backward (messages normalised at every step, as float32 needs).
    def forward(carry, u):
        log_alpha, log_likelihood = carry
        new = u + logsumexp(log_alpha[:, None] + log_trans, axis=0)
        scale = logsumexp(new)
        return (new - scale, log_likelihood + scale), new - scale

    def backward(log_beta, u_next):
        new = logsumexp(log_trans + (u_next + log_beta)[None], axis=1)
        return new - logsumexp(new), new - logsumexp(new)

    first = unary[0] - logsumexp(unary[0])
    (_, log_likelihood), rest = jax.lax.scan(forward, (first, logsumexp(unary[0])), unary[1:])
    log_alpha = jnp.concatenate([first[None], rest])
    _, rest = jax.lax.scan(backward, jnp.zeros(K), unary[1:], reverse=True)
    log_beta = jnp.concatenate([rest, jnp.zeros((1, K))])
    gamma = jax.nn.softmax(log_alpha + log_beta, axis=-1)
    log_xi = log_alpha[:-1, :, None] + log_trans + (unary[1:] + log_beta[1:])[:, None, :]
    xi = jnp.exp(log_xi - logsumexp(log_xi, axis=(1, 2), keepdims=True))
    counts = xi.sum(0)
    weights = gamma[1:]
    mu = (weights * y[:, None]).sum(0) / weights.sum(0)
    sigma = jnp.sqrt(jnp.sum(weights * (y[:, None] - mu) ** 2) / y.shape[0])
    return (gamma[0], counts / counts.sum(1, keepdims=True), mu, sigma), log_likelihood


@jax.jit
def scaled_baum_welch_step(params, y):
    """One Baum-Welch iteration on probabilities: Rabiner's (1989) scaled forward-backward, each
    step's emissions divided by their largest (so that no step underflows in float64)."""
    init, trans, mu, sigma = params
    log_emission = jax.scipy.stats.norm.logpdf(y[:, None], mu, sigma)
    shift = jnp.max(log_emission, axis=1, keepdims=True)
    emission = jnp.exp(log_emission - shift)

    def forward(alpha, e):
        new = (alpha @ trans) * e
        scale = jnp.sum(new)
        return new / scale, (new / scale, jnp.log(scale))

    def backward(beta, e_next):
        new = trans @ (e_next * beta)
        return new / jnp.sum(new), new / jnp.sum(new)

    _, (alpha, log_scales) = jax.lax.scan(forward, init, emission)  # alpha_t for z_1..z_T
    _, rest = jax.lax.scan(backward, jnp.ones(K), emission[1:], reverse=True)
    beta = jnp.concatenate([rest, jnp.ones((1, K))])
    gamma = alpha * beta
    gamma = gamma / gamma.sum(1, keepdims=True)
    xi = alpha[:-1, :, None] * trans * (emission[1:] * beta[1:])[:, None, :]
    xi = xi / xi.sum((1, 2), keepdims=True)
    first = init * (trans @ (emission[0] * beta[0]))  # z_0's posterior
    counts = xi.sum(0) + (init[:, None] * trans * (emission[0] * beta[0])[None]) / jnp.sum(first)
    mu = (gamma * y[:, None]).sum(0) / gamma.sum(0)
    sigma = jnp.sqrt(jnp.sum(gamma * (y[:, None] - mu) ** 2) / y.shape[0])
    log_likelihood = jnp.sum(log_scales) + jnp.sum(shift)
    return (first / jnp.sum(first), counts / counts.sum(1, keepdims=True), mu, sigma), log_likelihood


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=10_000)
    args = parser.parse_args()
    y = jnp.asarray(make_data(args.length, np.random.default_rng(0)))

    engine = blrppl.EM(hmm)
    start = time.perf_counter()
    plan = engine.plan(y)
    algorithm = engine.build(plan)
    analysis = time.perf_counter() - start
    run(algorithm, jax.random.key(0), STEPS, plan.arrays, progress_bar=False)  # compile
    start = time.perf_counter()
    state, elbo, _ = run(algorithm, jax.random.key(0), STEPS, plan.arrays, progress_bar=False)
    jax.block_until_ready(elbo)
    blrppl_total = time.perf_counter() - start
    step = jax.jit(algorithm.step)
    blrppl_step = best_time(lambda: step(state, plan.arrays))

    params = (INIT, TRANS, MU, jnp.asarray(SIGMA))
    hand_step = best_time(lambda: baum_welch_step(params, y))
    baum_welch_step(baum_welch_step(params, y)[0], y)  # compile for the returned types too
    start = time.perf_counter()
    for _ in range(STEPS):
        params, log_likelihood = baum_welch_step(params, y)
    jax.block_until_ready(params)
    hand_total = time.perf_counter() - start

    scaled_params = (INIT, TRANS, MU, jnp.asarray(SIGMA))
    scaled_step = best_time(lambda: scaled_baum_welch_step(scaled_params, y))
    for _ in range(STEPS):
        scaled_params, _ = scaled_baum_welch_step(scaled_params, y)
    scaled_difference = max(
        float(jnp.max(jnp.abs(a - b) / jnp.abs(b))) for a, b in zip(scaled_params[1:], params[1:])
    )

    fitted = state.params
    difference = max(
        float(jnp.max(jnp.abs(fitted[name] - value) / jnp.abs(value)))
        for name, value in zip(("init", "trans", "mu", "sigma"), params)
        if name != "init"
    )
    rows = [
        ("blrppl EM", f"{1e3 * blrppl_step:.2f} ms", f"{blrppl_total:.3f} s"),
        ("hand-written jit Baum-Welch", f"{1e3 * hand_step:.2f} ms", f"{hand_total:.3f} s"),
        ("hand-written scaled Baum-Welch (probabilities)", f"{1e3 * scaled_step:.2f} ms", ""),
    ]
    print(table(rows, (f"K={K}, T={args.length:,}", "per iteration", f"{STEPS} iterations")))
    print(f"blrppl one-off analysis: {analysis:.2f} s (tracing and symbolic expectations)")
    print(f"time per iteration, blrppl / hand-written: {blrppl_step / hand_step:.2f} (log space), "
          f"{blrppl_step / scaled_step:.2f} (probabilities; the bar: <= 1.2 against the faster)")
    print(f"the two hand-written ones after {STEPS} iterations: largest relative difference {scaled_difference:.1e}")
    print(f"largest relative difference of trans, mu, sigma after {STEPS} iterations: {difference:.1e}")
    print(
        f"log likelihood at the parameters before the last iteration: {float(log_likelihood):.6f}; "
        f"blrppl's EM bound after it (not lower in exact arithmetic): {float(elbo[-1]):.6f}"
    )


if __name__ == "__main__":
    main()
