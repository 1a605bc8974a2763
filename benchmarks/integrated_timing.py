"""Issue 15: ``blrppl.Integrated`` times and accuracy against brute-force quadrature.

For eight schools (centred, non-centred), a regression with a half-normal noise
scale and the Nile local level with both scales unknown, prints: the first
call (tracing, symbolic analysis, the choice of h and XLA compiles, then the
first fit), the time per fit after compilation (``engine.run`` on the same
data again, best of several: it still traces the model and plans the fit), the
numerical part of that (mode search and grid: the compiled conditional fits),
the number of grid nodes, and the errors against the tests' references
(``tests/engines/integrated_references.py``): |log p(y) error|, the largest
|mean error| / sd and |sd / sd_ref - 1| over all sites.

    python -m benchmarks.integrated_timing
"""

from __future__ import annotations

import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import blrppl  # noqa: E402
import blrppl.blr.integrate as integrate_module  # noqa: E402
from benchmarks._timing import table  # noqa: E402
from models import eight_schools_centered, eight_schools_noncentered, linear_regression, nile  # noqa: E402
from tests.engines import integrated_references as references  # noqa: E402


def cases():
    schools = references.eight_schools(eight_schools_centered.Y, eight_schools_centered.SIGMA)
    args, kwargs = linear_regression.data()
    regression = references.linear_regression(args[0], kwargs["y"])
    nile_args, nile_kwargs = nile.data()
    nile_ref = references.local_level(nile_kwargs["y"], 200.0, 100.0, nile.INITIAL_MEAN, nile.INITIAL_SD)
    flat = lambda r: (r.log_evidence, {**r.hyper, **r.latent})  # noqa: E731
    return [
        ("eight schools, centred", eight_schools_centered.model, eight_schools_centered.data(), flat(schools)),
        ("eight schools, non-centred", eight_schools_noncentered.model, eight_schools_noncentered.data(),
         (schools.log_evidence, {k: v for k, v in flat(schools)[1].items() if k != "theta"})),
        ("regression, HalfNormal noise", linear_regression.noise_scale_model, (args, kwargs), flat(regression)),
        ("Nile, both scales unknown", nile.scales_model, (nile_args, nile_kwargs), nile_ref),
    ]


def numerical_seconds(engine, args, kwargs, repeats=5):
    """Best time of the mode search and grid alone (the plan made once, outside the timing)."""
    choice, plan = integrate_module._choose(engine.model, args, kwargs, engine.config, engine._conditionals)
    original = integrate_module._choose
    integrate_module._choose = lambda *a: (choice, plan)
    try:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            integrate_module.integrate(engine.model, args, kwargs, engine.config, 30, engine._conditionals)
            best = min(best, time.perf_counter() - start)
    finally:
        integrate_module._choose = original
    return best


def main():
    rows = []
    for name, model, (args, kwargs), (log_evidence, moments) in cases():
        engine = blrppl.Integrated(model)
        start = time.perf_counter()
        result = engine.run(jax.random.key(0), 30, *args, **kwargs)
        posterior = result.posterior
        jax.block_until_ready([d.variance for d in posterior.values()])
        first = time.perf_counter() - start
        again = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            engine.run(jax.random.key(0), 30, *args, **kwargs)
            again = min(again, time.perf_counter() - start)
        numerical = numerical_seconds(engine, args, kwargs)
        mean_error = max(
            float(np.max(np.abs(np.asarray(posterior[s].mean) - m) / sd)) for s, (m, sd) in moments.items()
        )
        sd_error = max(
            float(np.max(np.abs(np.sqrt(np.asarray(posterior[s].variance)) / sd - 1))) for s, (m, sd) in moments.items()
        )
        rows.append((
            name, ",".join(result.hyper), result.num_nodes, f"{first:.1f} s", f"{again * 1e3:.0f} ms",
            f"{numerical * 1e3:.0f} ms", f"{abs(result.log_marginal_likelihood - log_evidence):.1e}",
            f"{mean_error:.1e}", f"{sd_error:.1e}",
        ))
    header = ("model", "h", "nodes", "first call", "per fit", "numerical", "|dlog p(y)|", "mean err/sd", "sd rel err")
    print(table(rows, header))


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("error", blrppl.errors.IntegrationWarning)
        main()
