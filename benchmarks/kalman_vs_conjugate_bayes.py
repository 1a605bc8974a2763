"""Issue 7: ConjugateBayes on a local level model against a jit-compiled Kalman filter.

The model is the Nile local level written with ``scan`` (``models/nile.py``)
with known variances, on a simulated series of T = 100,000 steps. blrppl's
ConjugateBayes is one BLR step with rho = 1 (Khan & Rue, Sec. 5.1) on the
level chain's chain-Gaussian q: the exact Kalman smoother, plus the ELBO (the
log evidence). Prints, from one run (float64 on both sides):

* the one-off cost of a fit: tracing and symbolic analysis (``engine.plan``),
  and the first run (compilation included);
* the steady-state time of a fit (``run`` of the compiled algorithm: the start
  from the prior, one step, its ELBO), and of its parts (the start, one
  jit-compiled step), with the sequential (``lax.scan``) and the parallel
  (``lax.associative_scan``, ``families={"level": "ChainGaussianParallel"}``)
  smoother;
* the peers: one jit-compiled ``lax.scan`` Kalman filter pass (filtered means
  and variances and the log likelihood) and a Kalman filter + RTS smoother;
* ratios against the filter pass (target <= 3) and the time growth from
  T = 10,000 to 100,000 (target about 10x).

    python -m benchmarks.kalman_vs_conjugate_bayes
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import blrppl  # noqa: E402
from benchmarks._timing import best_time, table  # noqa: E402
from blrppl.blr.driver import run  # noqa: E402
from models import nile  # noqa: E402

OBS_VAR, LEVEL_VAR = 15099.0, 1469.1
SIZES = (10_000, 100_000)


def simulate(num_steps: int) -> jax.Array:
    rng = np.random.default_rng(0)
    level = 1000.0 + np.cumsum(np.sqrt(LEVEL_VAR) * rng.normal(size=num_steps))
    return jnp.asarray(level + np.sqrt(OBS_VAR) * rng.normal(size=num_steps))


@jax.jit
def kalman_filter(y):
    """Filtered means and variances and log p(y) of the model, one ``lax.scan``."""

    def step(carry, y_t):
        m, p, loglik = carry
        p = p + LEVEL_VAR
        f = p + OBS_VAR
        gain = p / f
        loglik = loglik - 0.5 * (jnp.log(2.0 * jnp.pi * f) + (y_t - m) ** 2 / f)
        m = m + gain * (y_t - m)
        p = p * (1.0 - gain)
        return (m, p, loglik), (m, p)

    start = (jnp.asarray(nile.INITIAL_MEAN), jnp.asarray(nile.INITIAL_SD**2), jnp.zeros(()))
    (_, _, loglik), (means, variances) = jax.lax.scan(step, start, y)
    return means, variances, loglik


@jax.jit
def kalman_smoother(y):
    """The filter and a Rauch-Tung-Striebel backward pass: smoothed means and variances."""
    means, variances, loglik = kalman_filter(y)

    def step(carry, inputs):
        m_next, p_next = carry
        m, p = inputs
        pred = p + LEVEL_VAR
        gain = p / pred
        m = m + gain * (m_next - m)
        p = p + gain**2 * (p_next - pred)
        return (m, p), (m, p)

    last = (means[-1], variances[-1])
    _, (m_s, p_s) = jax.lax.scan(step, last, (means[:-1], variances[:-1]), reverse=True)
    return jnp.append(m_s, means[-1]), jnp.append(p_s, variances[-1]), loglik


def conjugate_bayes(y, family):
    engine = blrppl.ConjugateBayes(nile.model, families={"level": family})
    kwargs = {"y": y, "obs_var": OBS_VAR, "level_var": LEVEL_VAR}
    start = time.perf_counter()
    plan = engine.plan(**kwargs)
    analysis = time.perf_counter() - start
    algorithm = engine.build(plan)
    start = time.perf_counter()
    state, elbo, _ = run(algorithm, jax.random.key(0), 1, plan.arrays, progress_bar=False)
    jax.block_until_ready(state)
    first = time.perf_counter() - start
    fit = best_time(lambda: run(algorithm, jax.random.key(0), 1, plan.arrays, progress_bar=False), repeats=5)
    start_state = algorithm.init(jax.random.key(0))
    init = best_time(lambda: algorithm.init(jax.random.key(0)), repeats=5)
    step = jax.jit(algorithm.step)
    one_step = best_time(lambda: step(jax.random.key(1), start_state), repeats=5)
    result = blrppl.results.BLRResult(plan, state, elbo, "global")
    return analysis, first, fit, init, one_step, result


def main() -> None:
    rows, fits, filters = [], {}, {}
    for size in SIZES:
        y = simulate(size)
        t_filter = best_time(lambda y=y: kalman_filter(y))
        t_smoother = best_time(lambda y=y: kalman_smoother(y))
        filters[size] = t_filter
        m_ref, p_ref, loglik = kalman_smoother(y)
        for family in ("ChainGaussian", "ChainGaussianParallel"):
            analysis, first, fit, init, one_step, result = conjugate_bayes(y, family)
            fits[size, family] = fit
            q = result.posterior["level"]
            error = float(jnp.max(jnp.abs(q.mean[1:] - m_ref) / jnp.sqrt(p_ref)))
            elbo_error = abs(float(result.elbo[-1]) - float(loglik))
            rows.append((
                f"T = {size:,}: ConjugateBayes, {family}",
                f"{fit * 1e3:.1f} ms",
                f"{fit / t_filter:.2f}",
                (
                    f"analysis {analysis:.2f} s, first run {first:.2f} s; "
                    f"max |mean error| {error:.1e} sd, |ELBO - log lik| {elbo_error:.1e}"
                ),
            ))
            rows.append((
                "  of which: start from the prior (init)",
                f"{init * 1e3:.1f} ms",
                f"{init / t_filter:.2f}",
                "",
            ))
            rows.append((
                "  one jit-compiled BLR step (smoother + ELBO)",
                f"{one_step * 1e3:.1f} ms",
                f"{one_step / t_filter:.2f}",
                "the rest of a run is the driver's while loop",
            ))
        rows.append((f"T = {size:,}: Kalman filter (lax.scan)", f"{t_filter * 1e3:.1f} ms", "1", "peer"))
        rows.append((f"T = {size:,}: Kalman filter + RTS smoother", f"{t_smoother * 1e3:.1f} ms", f"{t_smoother / t_filter:.2f}", "peer"))
    small, large = SIZES
    for family in ("ChainGaussian", "ChainGaussianParallel"):
        rows.append((
            f"growth T = {small:,} -> {large:,}, {family}",
            f"{fits[large, family] / fits[small, family]:.1f}x",
            "",
            f"Kalman filter: {filters[large] / filters[small]:.1f}x (target ~10x)",
        ))
    print(table(rows, ("local level, known variances (float64)", "time", "/ filter (target <= 3)", "notes")))


if __name__ == "__main__":
    main()
