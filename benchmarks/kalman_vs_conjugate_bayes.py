"""Issue 7 / 16: ConjugateBayes on a local level model against a jit-compiled Kalman filter.

The model is the Nile local level written with ``scan`` (``models/nile.py``)
with known variances, on a simulated series of T = 10,000 and 100,000 steps.
blrppl's ConjugateBayes is one BLR step with rho = 1 (Khan & Rue, Sec. 5.1)
on the level chain's chain-Gaussian q: the exact Kalman smoother, plus the
ELBO (the log evidence). One step is one smoother: a forward pass whose
pivots give A(lambda) and the step's validity check, and a backward pass that
writes the mean parameters; the ELBO is then read off A(lambda) and each
factor's constant (``blrppl.blr.elbo.exact_evidence``: no pass over the means).
Prints (float64 on both sides):

* the one-off cost of a fit: tracing and symbolic analysis (``engine.plan``),
  and the first run (compilation included);
* the steady-state time of the whole compiled run (``blrppl.blr.driver.run``
  of one step: one compiled program, its start (which the step does not read,
  so the compiler leaves it out), the step and the driver's while loop, and
  its host round trip), of one jit-compiled step alone, of the start from the
  prior alone (``driver.init``, for scale: no exact run makes it), and of
  ``engine.fit`` on the planned data (the run and the result's checks), with
  the sequential (``lax.scan``) and the parallel (``lax.associative_scan``,
  ``families={"level": "ChainGaussianParallel"}``) smoother;
* the peers: one jit-compiled ``lax.scan`` Kalman filter pass (filtered means
  and variances and the log likelihood) and a Kalman filter + RTS smoother;
* ratios against the filter pass (target for the whole run <= 3 at
  T = 100,000), and the time growth from T = 10,000 to 100,000.

Times are the best of ``ROUNDS`` interleaved rounds (one call of everything
per round, so a shared machine's load falls on all alike), with the median
ratio beside the best.

    python -m benchmarks.kalman_vs_conjugate_bayes
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import blrppl  # noqa: E402
from benchmarks._timing import interleaved_times, table  # noqa: E402
from blrppl.blr import driver  # noqa: E402
from models import nile  # noqa: E402

OBS_VAR, LEVEL_VAR = 15099.0, 1469.1
SIZES = (10_000, 100_000)
FAMILIES = ("ChainGaussian", "ChainGaussianParallel")
ROUNDS = 40


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
    """The fit's one-off costs, its result, and the calls to time (steady state)."""
    engine = blrppl.ConjugateBayes(nile.model, families={"level": family})
    kwargs = {"y": y, "obs_var": OBS_VAR, "level_var": LEVEL_VAR}
    start = time.perf_counter()
    plan = engine.plan(**kwargs)
    analysis = time.perf_counter() - start
    algorithm = engine.build(plan)
    key = jax.random.key(0)
    start = time.perf_counter()
    state, elbo, _ = driver.run(algorithm, key, 1, plan.arrays, progress_bar=False)
    jax.block_until_ready(state)
    first = time.perf_counter() - start
    result = blrppl.results.BLRResult(plan, state, elbo, "global")
    start_state = driver.init(algorithm, key, plan.arrays)
    step = jax.jit(algorithm.step)
    calls = {
        "run": lambda: driver.run(algorithm, key, 1, plan.arrays, progress_bar=False),
        "init": lambda: driver.init(algorithm, key, plan.arrays),
        "step": lambda: step(start_state, plan.arrays),
        "fit": lambda: engine.fit(plan, key, 1, progress_bar=False).state,
    }
    return analysis, first, result, calls


def main() -> None:
    rows, fits, filters = [], {}, {}
    for size in SIZES:
        y = simulate(size)
        m_ref, p_ref, loglik = kalman_smoother(y)
        calls = {"filter": lambda y=y: kalman_filter(y), "smoother": lambda y=y: kalman_smoother(y)}
        fitted = {}
        for family in FAMILIES:
            analysis, first, result, family_calls = conjugate_bayes(y, family)
            fitted[family] = analysis, first, result
            calls.update({(family, name): call for name, call in family_calls.items()})
        times = interleaved_times(calls, ROUNDS)
        t_filter, m_filter = times["filter"]
        filters[size] = t_filter

        def ratio(name):
            best, median = times[name]
            return f"{best / t_filter:.2f} (median {median / m_filter:.2f})"

        for family in FAMILIES:
            analysis, first, result = fitted[family]
            fits[size, family] = times[family, "run"][0]
            q = result.posterior["level"]
            error = float(jnp.max(jnp.abs(q.mean[1:] - m_ref) / jnp.sqrt(p_ref)))
            elbo_error = abs(float(result.elbo[-1]) - float(loglik))
            rows.append((
                f"T = {size:,}: ConjugateBayes, {family}: whole run",
                f"{times[family, 'run'][0] * 1e3:.2f} ms",
                ratio((family, "run")),
                (
                    f"analysis {analysis:.2f} s, first run {first:.2f} s; "
                    f"max |mean error| {error:.1e} sd, |ELBO - log lik| {elbo_error:.1e}"
                ),
            ))
            rows.append((
                "  one jit-compiled BLR step alone (smoother + ELBO)",
                f"{times[family, 'step'][0] * 1e3:.2f} ms",
                ratio((family, "step")),
                "the rest of a run: the start, the driver's loop and host round trip",
            ))
            rows.append((
                "  the start from the prior alone (driver.init)",
                f"{times[family, 'init'][0] * 1e3:.2f} ms",
                ratio((family, "init")),
                "for scale: not part of an exact run (its step does not read a start)",
            ))
            rows.append((
                "  engine.fit(plan, key, 1)",
                f"{times[family, 'fit'][0] * 1e3:.2f} ms",
                ratio((family, "fit")),
                "+ the result's checks",
            ))
        rows.append((f"T = {size:,}: Kalman filter (lax.scan)", f"{t_filter * 1e3:.2f} ms", "1", "peer"))
        rows.append((f"T = {size:,}: Kalman filter + RTS smoother", f"{times['smoother'][0] * 1e3:.2f} ms", ratio("smoother"), "peer"))
    small, large = SIZES
    for family in FAMILIES:
        rows.append((
            f"growth T = {small:,} -> {large:,}, {family}",
            f"{fits[large, family] / fits[small, family]:.1f}x",
            "",
            f"Kalman filter: {filters[large] / filters[small]:.1f}x (target ~10x)",
        ))
    header = ("local level, known variances (float64)", f"best of {ROUNDS}", "/ filter (target <= 3)", "notes")
    print(table(rows, header))


if __name__ == "__main__":
    main()
