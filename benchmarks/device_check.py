"""The same fits on an accelerator and on the host's CPU: answers compared, times side by side.

For each case it runs ``engine.run`` in a fresh engine on every device given
(``jax.default_device``), twice: the first call (tracing, analysis,
compilation and the fit) and a second call on the same data (no trace, no
compile). It prints both times, where the fit's state lives, and how far the
accelerator's answer is from the CPU's: the final ELBO (relative) and each
latent's posterior mean in units of its posterior sd. Float64 unless
``--float32``. Not part of the tests; an accelerator is optional (with none,
only the CPU column is filled).

    python -m benchmarks.device_check [--cases a,b,...] [--float32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import jax
import numpy as np

CASES = {
    # name: (where the model and data come from, engine, steps)
    "normal_mean_precision": ("zoo", "VMP", 200),
    "gaussian_mixture": ("zoo", "VMP", 200),
    "nile": ("zoo", "EM", 200),
    "hmm": ("zoo", "VMP", 200),
    "eight_schools_noncentered": ("zoo", "NonConjugateVI", 200),
    "logistic_regression": ("zoo", "NonConjugateVI", 200),
    "radon": ("zoo", "NonConjugateVI", 200),
    "gmm_100k": ("gmm_vs_sklearn", "VMP", 500),
    "logistic_100k": ("logistic_vs_numpyro", "NonConjugateVI", 200),
    "local_level_100k": ("kalman_vs_conjugate_bayes", "ConjugateBayes", 1),
}


def case_inputs(name: str):
    """(model, args, kwargs, engine options) of a case, data as numpy arrays."""
    source = CASES[name][0]
    if source == "zoo":
        from models import ZOO

        args, kwargs = ZOO[name].data()
        model, options = ZOO[name].model, {}
    elif source == "gmm_vs_sklearn":
        from benchmarks import gmm_vs_sklearn as bench

        _, train, _ = bench.make_data(np.random.default_rng(0))
        model, args, kwargs, options = bench.gmm, (train,), {}, {}
    elif source == "logistic_vs_numpyro":
        from benchmarks import logistic_vs_numpyro as bench

        model, args, kwargs, options = bench.model, bench.data(), {}, {}
    else:
        from benchmarks import kalman_vs_conjugate_bayes as bench
        from models import nile

        y = bench.simulate(100_000)
        model, args = nile.model, ()
        kwargs = {"y": y, "obs_var": bench.OBS_VAR, "level_var": bench.LEVEL_VAR}
        options = {"families": {"level": "ChainGaussian"}}
    to_host = lambda leaf: np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf  # noqa: E731
    return model, jax.tree.map(to_host, args), jax.tree.map(to_host, kwargs), options


def fit_on(device, name: str):
    """First and second call of the case on ``device``: times, the result, where its state lives."""
    import blrppl

    model, args, kwargs, options = case_inputs(name)
    engine_name, steps = CASES[name][1], CASES[name][2]
    key = jax.random.key(0)
    with jax.default_device(device):
        engine = getattr(blrppl, engine_name)(model, **options)
        times = []
        for _ in range(2):
            start = time.perf_counter()
            result = engine.run(key, steps, *args, progress_bar=False, tol=1e-8, **kwargs)
            jax.block_until_ready(jax.tree.leaves(result.state))
            times.append(time.perf_counter() - start)
    placed = {d.platform for leaf in jax.tree.leaves(result.state) if isinstance(leaf, jax.Array) for d in leaf.devices()}
    return times, result, ",".join(sorted(placed))


def summary(result) -> dict:
    """Final ELBO and each latent's posterior mean and sd, on the host."""
    out = {"elbo": float(np.asarray(result.elbo)[-1]), "steps": int(np.shape(result.elbo)[0])}
    for site, q in result.posterior.items():
        try:
            out[site] = (np.asarray(q.mean, np.float64), np.sqrt(np.asarray(q.variance, np.float64)))
        except Exception as error:  # a family without moments is reported, not hidden
            out[site] = repr(error)
    return out


def distance(reference: dict, other: dict) -> str:
    """The accelerator's answer against the CPU's: ELBO relative difference, worst mean shift in sds."""
    elbo = abs(other["elbo"] - reference["elbo"]) / max(1.0, abs(reference["elbo"]))
    worst, where = 0.0, "-"
    for site, value in reference.items():
        if isinstance(value, tuple) and isinstance(other.get(site), tuple):
            shift = float(np.max(np.abs(other[site][0] - value[0]) / np.maximum(value[1], 1e-300)))
            if shift > worst:
                worst, where = shift, site
    return f"ELBO rel {elbo:.1e}, worst mean {worst:.1e} sd ({where}), steps {reference['steps']}/{other['steps']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--float32", action="store_true")
    options = parser.parse_args()
    jax.config.update("jax_enable_x64", not options.float32)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    devices = [jax.devices("cpu")[0]] + [d for d in jax.devices() if d.platform != "cpu"][:1]
    print(f"jax {jax.__version__}; devices {[str(d) for d in devices]}; float{'32' if options.float32 else '64'}; "
          f"{os.cpu_count()} CPU cores", flush=True)
    for device in devices:  # JAX's own start-up on each device, not ours
        jax.block_until_ready(jax.device_put(np.ones(3), device) + 1)
    for name in options.cases.split(","):
        answers = {}
        for device in devices:
            try:
                (first, second), result, placed = fit_on(device, name)
                answers[device.platform] = summary(result)
                print(f"{name:28s} {device.platform:5s} first {first:7.2f} s  second {second * 1e3:9.1f} ms  "
                      f"state on {placed}  stopped {result.converged.stopped} after {result.converged.num_steps}", flush=True)
            except Exception:
                print(f"{name:28s} {device.platform:5s} FAILED\n{traceback.format_exc(limit=-8)}", flush=True)
        if len(answers) == 2:
            reference, other = (answers[d.platform] for d in devices)
            print(f"{'':28s} {devices[1].platform} vs cpu: {distance(reference, other)}", flush=True)


if __name__ == "__main__":
    main()
