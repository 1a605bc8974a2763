"""Issue 18: logistic regression at scale, SVI on minibatches against the full-batch optimum and NumPyro.

Data: N rows (default 10^7), D = 50, float32, generated with a fixed seed.

- Reference: the full-batch ``NonConjugateVI`` optimum (Gauss-Hermite on every
  linear predictor), computed once on all N rows.
- blrppl ``SVI(estimator="auto")`` with ``subsample_size=M`` (default 10_000),
  global mode (stochastic natural gradient, rho_t = t^-0.7) and local mode
  (two numbers per observation, rho = 1): wall-clock time until q's means are
  within 0.1 reference sd and its sds within 20% of the reference's.
- NumPyro SVI with Adam (AutoNormal, AutoMultivariateNormal, AutoDelta) on the
  same minibatches (blrppl's epoch-wise permutations, substituted into the
  plate): time to the same bar (AutoDelta: means only, it has no sds).

Time counts everything after the data exist: tracing, planning, compiling and
the steps (blrppl: one ``run`` of 100, 200, 400, ... steps from scratch, the
first that reaches the bar is timed, compiled code reused between them; NumPyro
runs jitted chunks of 100 steps and is checked between them). Memory: the process's peak resident set above its
size before the data were made (Python, JAX and XLA themselves), cumulative
over the runs in order (the full-batch reference, which stores the N x D
design, comes first).

The reference is cached in ``--reference`` (default
``/tmp/blrppl_scale_reference_N.npz``): compute it once with
``--reference-only`` (its own process, so that the fits' peak memory is
measured without the full-batch design), then run the fits.

    python -m benchmarks.scale [--n 1000000] [--m 10000] [--budget 120] [--reference-only]
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro import handlers
from numpyro.infer import SVI as NumPyroSVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal

import blrppl
from benchmarks._timing import table
from blrppl.blr.minibatch import batch_key, minibatch

D = 50


def model(X, y, batch_size=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1], X.dtype), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def full_model(X, y):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1], X.dtype), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def data(n: int):
    rng = np.random.default_rng(0)
    X = np.empty((n, D), np.float32)
    X[:, 0] = 1.0
    for start in range(0, n, 1_000_000):  # chunks: never a float64 copy of X
        stop = min(start + 1_000_000, n)
        X[start:stop, 1:] = rng.standard_normal((stop - start, D - 1), dtype=np.float32)
    beta = rng.normal(0.0, 0.3, D).astype(np.float32)
    y = (rng.random(n, dtype=np.float32) < 1.0 / (1.0 + np.exp(-(X @ beta)))).astype(np.float32)
    return settled(jnp.asarray(X)), settled(jnp.asarray(y))


def settled(x: jax.Array) -> jax.Array:
    """``x`` once JAX has finished taking it in from numpy.

    On CPU, ``jnp.asarray`` of a numpy array first aliases the numpy memory;
    the first computations that read the array copy it and then release the
    numpy side (measured: +1.5 GB peak for an 800 MB array, whatever the
    computation). That is the data's ingestion, paid by any JAX program that
    reads them, so it happens here, before the fits' memory is measured.
    """
    for _ in range(2):
        x[:1].block_until_ready()
    return x


def accuracy(mean, sd, ref_mean, ref_sd):
    """(largest mean error in reference sds, largest relative sd error)."""
    err_mean = float(np.max(np.abs(np.asarray(mean) - ref_mean) / ref_sd))
    err_sd = float("nan") if sd is None else float(np.max(np.abs(np.asarray(sd) / ref_sd - 1.0)))
    return err_mean, err_sd


def reached(err, means_only=False):
    return err[0] <= 0.1 and (means_only or err[1] <= 0.2)


def blrppl_svi(X, y, m, ref, budget, first_steps=100, **options):
    """Fits from scratch with 100, 200, 400, ... steps (one ``run`` each, planning included):
    the time of the first fit that reaches the bar (the engine's compiled step is reused)."""
    options.setdefault("estimator", "auto")
    engine = blrppl.SVI(model, **options)
    key = jax.random.PRNGKey(1)
    spent, steps, err = 0.0, first_steps, (np.inf, np.inf)
    while spent < budget:
        start = time.perf_counter()
        q = engine.run(key, steps, X, y, m, progress_bar=False).posterior["beta"]
        q.mean.block_until_ready()
        err = accuracy(q.mean, np.sqrt(q.variance), *ref)
        seconds = time.perf_counter() - start
        spent += seconds
        if reached(err):
            return seconds, steps, err
        steps *= 2
    return None, steps // 2, err


def numpyro_svi(X, y, m, ref, budget, guide_class, lr=0.01):
    n = X.shape[0]
    guide = guide_class(model)
    svi = NumPyroSVI(model, guide, optax.adam(lr), Trace_ELBO())
    key = batch_key(jax.random.PRNGKey(1))  # blrppl's batch stream: the same epoch permutations

    @jax.jit
    def chunk(state, first, count=100):
        def body(i, state):
            idx = minibatch(key, first + i, n, m)
            with handlers.substitute(data={"N": idx}):
                state, _ = svi.update(state, X, y, m)
            return state

        return jax.lax.fori_loop(0, count, body, state)

    start = time.perf_counter()
    with handlers.substitute(data={"N": jnp.arange(m)}):
        state = svi.init(jax.random.PRNGKey(2), X, y, m)
    steps, err = 0, (np.inf, np.inf)
    means_only = guide_class is AutoDelta
    while time.perf_counter() - start < budget:
        state = chunk(state, jnp.asarray(steps + 1))
        steps += 100
        params = svi.get_params(state)
        if means_only:
            mean, sd = params["beta_auto_loc"], None
        else:
            with handlers.substitute(data={"N": jnp.arange(m)}):
                draws = guide.sample_posterior(jax.random.PRNGKey(3), params, sample_shape=(400,))["beta"]
            if guide_class is AutoNormal:
                mean, sd = params["beta_auto_loc"], params["beta_auto_scale"]
            else:
                mean, sd = params["auto_loc"], jnp.std(draws, 0)
        err = accuracy(mean, sd, *ref)
        if reached(err, means_only):
            return time.perf_counter() - start, steps, err
    return None, steps, err


def reset_peak() -> None:
    """Reset the process's peak resident set (Linux: /proc/self/clear_refs), where allowed."""
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_mib() -> float:
    """The peak resident set since the last reset, MiB (VmHWM; else ru_maxrss, the process's peak)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--m", type=int, default=10_000)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--skip-numpyro", action="store_true")
    parser.add_argument("--skip-blrppl", action="store_true")
    parser.add_argument("--reference", default=None)
    parser.add_argument("--only", default=None, help="comma-separated parts of method names to run")
    parser.add_argument("--reference-only", action="store_true")
    args = parser.parse_args()
    reference = pathlib.Path(args.reference or f"/tmp/blrppl_scale_reference_{args.n}.npz")
    jnp.zeros(1).block_until_ready()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Python, JAX and XLA themselves
    X, y = data(args.n)
    gc.collect()
    reset_peak()  # the data's construction (a numpy copy, JAX's ingestion) is not the fits' memory
    data_mb = (X.nbytes + y.nbytes) / 2**20
    if not reference.exists():
        start = time.perf_counter()
        full = blrppl.NonConjugateVI(full_model).run(jax.random.PRNGKey(0), 15, X, y, progress_bar=False)
        q = full.posterior["beta"]
        np.savez(reference, mean=np.asarray(q.mean, np.float64), sd=np.sqrt(np.asarray(q.variance, np.float64)),
                 seconds=time.perf_counter() - start)
    if args.reference_only:
        return
    saved = np.load(reference)
    ref, ref_time = (saved["mean"], saved["sd"]), float(saved["seconds"])
    rows = []
    print(f"N = {args.n}, D = {D}, M = {args.m}, float32; data {data_mb:.0f} MiB; "
          f"full-batch NonConjugateVI reference (15 steps) {ref_time:.1f} s (cached in {reference})")
    runs = [] if args.skip_blrppl else [
        ("blrppl SVI global (rho_t = t^-0.7, averaged)", lambda: blrppl_svi(X, y, args.m, ref, args.budget, average=True)),
        ("blrppl SVI local (rho = 1)", lambda: blrppl_svi(X, y, args.m, ref, args.budget, mode="local", learning_rate=1.0)),
        ("blrppl SVI(estimator='ivon')", lambda: blrppl_svi(X, y, args.m, ref, args.budget, 1000, estimator="ivon")),
    ]
    if not args.skip_numpyro:
        for guide in (AutoNormal, AutoMultivariateNormal, AutoDelta):
            runs.append((f"NumPyro SVI {guide.__name__} + Adam(0.01)",
                         lambda g=guide: numpyro_svi(X, y, args.m, ref, args.budget, g)))
    if args.only:
        runs = [(name, fn) for name, fn in runs if any(part in name for part in args.only.split(","))]
    for name, fn in runs:
        seconds, steps, err = fn()
        rss = peak_mib() - baseline
        gc.collect()
        reset_peak()  # each run's own peak
        shown = "not reached" if seconds is None else f"{seconds:.1f} s"
        rows.append((name, shown, steps, f"{err[0]:.3f}", f"{err[1]:.3f}", f"{rss:.0f} MiB ({rss / data_mb:.1f}x data)"))
        print(rows[-1], flush=True)
    print(table(rows, ("method", "time to bar", "steps", "mean err (sd)", "sd rel err", "peak RSS above start (this run)")))


if __name__ == "__main__":
    main()
