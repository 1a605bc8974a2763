"""Issue 7: EM on the Nile local level against statsmodels' maximum-likelihood fit.

blrppl: ``blrppl.EM`` on ``models/nile.py`` (``scan`` local level, level_0 ~
N(1000, 1000^2), the two variances as ``numpyro.param``): exact chain-Gaussian
E-steps (Kalman smoothing) and Newton M-steps (Khan & Rue, Sec. 5.2), run until
the EM bound changes by less than 1e-9. Peer: statsmodels'
``UnobservedComponents(y, "local level").fit()`` (diffuse initialisation,
quasi-Newton on the Kalman likelihood). Both in float64.

Prints, from one run: blrppl's one-off cost (tracing and symbolic analysis,
then compilation), its steady-state time to convergence (the compiled
algorithm run again), statsmodels' fit time (best of 25 after a warm-up, as blrppl's), the ratio, and
the estimates of both next to the exact MLE of blrppl's model (scipy on its
Kalman likelihood) and the published diffuse MLE (Durbin & Koopman 2012:
15099 and 1469.1). The two models differ only in the start (broad prior vs
diffuse), so their MLEs agree to about 0.2%.

    python -m benchmarks.em_nile_vs_statsmodels
"""

from __future__ import annotations

import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

import blrppl  # noqa: E402
from benchmarks._timing import table  # noqa: E402
from blrppl.blr.driver import run  # noqa: E402
from models import nile  # noqa: E402

TOL = 1e-9
PUBLISHED = (15099.0, 1469.1)


def best_of(fn, repeats=25):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - start)
    return best, out


def em(y):
    engine = blrppl.EM(nile.model)
    start = time.perf_counter()
    plan = engine.plan(y=y)
    analysis = time.perf_counter() - start
    algorithm = engine.build(plan)
    start = time.perf_counter()
    jax.block_until_ready(run(algorithm, jax.random.key(0), 2000, plan.arrays, tol=TOL, progress_bar=False))
    first = time.perf_counter() - start
    fit, (state, elbo, _) = best_of(lambda: run(algorithm, jax.random.key(0), 2000, plan.arrays, tol=TOL, progress_bar=False))
    params = (float(state.params["obs_var"]), float(state.params["level_var"]))
    return analysis, first, fit, len(elbo), float(elbo[-1]), params


def statsmodels_fit(y):
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return UnobservedComponents(y, "local level").fit(disp=False)

    seconds, result = best_of(fit)
    return seconds, tuple(float(v) for v in result.params), float(result.llf)


def exact_mle(y):
    """The MLE of blrppl's model (N(1000, 1000^2) start) by scipy on its Kalman likelihood."""

    def loglik(obs_var, level_var):
        m, p, total = nile.INITIAL_MEAN, nile.INITIAL_SD**2, 0.0
        for y_t in y:
            p = p + level_var
            f = p + obs_var
            total -= 0.5 * (np.log(2.0 * np.pi * f) + (y_t - m) ** 2 / f)
            m, p = m + p / f * (y_t - m), p * obs_var / f
        return total

    result = scipy.optimize.minimize(
        lambda u: -loglik(*np.exp(u)), np.log([10000.0, 1000.0]), method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000},
    )
    return tuple(np.exp(result.x)), -result.fun


def main() -> None:
    y = np.asarray(nile.FLOW, dtype=float)
    sm_time, sm_params, sm_llf = statsmodels_fit(y)  # first, before XLA's thread pools are busy
    analysis, first, fit, steps, elbo, params = em(jax.numpy.asarray(y))
    mle, mle_loglik = exact_mle(y)
    fmt = lambda p: f"{p[0]:.1f}, {p[1]:.1f}"  # noqa: E731
    rel = lambda p, q: f"{max(abs(a / b - 1.0) for a, b in zip(p, q)):.1e}"  # noqa: E731
    print(table(
        [
            ("blrppl EM (steady state, compiled)", f"{fit * 1e3:.1f} ms", f"{steps} steps, bound {elbo:.6f}", fmt(params)),
            ("  one-off: trace + symbolic analysis", f"{analysis:.2f} s", "", ""),
            ("  one-off: first run (compilation)", f"{first:.2f} s", "", ""),
            ("statsmodels UnobservedComponents.fit", f"{sm_time * 1e3:.1f} ms", f"llf {sm_llf:.6f} (diffuse)", fmt(sm_params)),
            ("time: statsmodels / EM", f"{sm_time / fit:.1f}x", f"with EM's one-off costs: {sm_time / (fit + analysis + first):.3f}x", ""),
            ("exact MLE of blrppl's model (scipy)", "", f"log lik {mle_loglik:.6f}", fmt(mle)),
            ("published diffuse MLE (Durbin & Koopman)", "", "", fmt(PUBLISHED)),
            ("max rel. difference: EM vs exact MLE", rel(params, mle), "", ""),
            ("max rel. difference: EM vs statsmodels", rel(params, sm_params), "", ""),
            ("max rel. difference: EM vs published", rel(params, PUBLISHED), "", ""),
        ],
        ("Nile local level, MLE of (obs_var, level_var)", "time", "notes", "estimates"),
    ))


if __name__ == "__main__":
    main()
