"""Issue 16's large-data first calls against the peers' whole calls, each in a fresh process.

    python -m benchmarks.first_call_large [--rounds 2]

- the Gaussian mixture K = 5, D = 2, N = 100,000 (``benchmarks/gmm_vs_sklearn.py``'s
  model and data): ``blrppl.VMP(...).run`` with its default 4 restarts, tol as there (``BLRPPL_TOL``),
  against scikit-learn's ``BayesianGaussianMixture.fit`` (bar: blrppl faster);
- logistic regression N = 100,000, D = 20 (``benchmarks/logistic_vs_numpyro.py``):
  ``blrppl.NonConjugateVI(...).run`` to tol 1e-6 and the posterior mean, against
  NumPyro NUTS 300 + 300 draws, compilation included (bar: blrppl 10x faster).

Every row is a fresh Python process (JAX's caches empty, no persistent compilation
cache): tracing, planning, compilation and the fit, after JAX's own start-up and
the data's generation. Rounds alternate blrppl and the peer. Not part of the tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks._timing import answered_in_this_process, in_fresh_process  # noqa: E402
CASES = ("gmm_blrppl", "gmm_sklearn", "logistic_blrppl", "logistic_nuts")


def _one(case: str) -> float:
    sys.path.insert(0, ROOT)
    os.environ.pop("BLRPPL_COMPILATION_CACHE", None)
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    jnp.ones(3).block_until_ready()  # JAX's own start-up
    if case.startswith("gmm"):
        from benchmarks import gmm_vs_sklearn as gmm

        _, train, _ = gmm.make_data(np.random.default_rng(0))
        start = time.perf_counter()
        if case == "gmm_sklearn":
            gmm.fit_sklearn(train)
        else:
            import blrppl

            result = blrppl.VMP(gmm.gmm).run(
                jax.random.key(0), 500, jnp.asarray(train), progress_bar=False, tol=gmm.BLRPPL_TOL
            )
            jax.block_until_ready(result.posterior["mu"].mean)
        return time.perf_counter() - start
    from benchmarks import logistic_vs_numpyro as logistic

    X, y = logistic.data()
    start = time.perf_counter()
    if case == "logistic_nuts":
        from numpyro.infer import MCMC, NUTS

        mcmc = MCMC(NUTS(logistic.model), num_warmup=300, num_samples=300, progress_bar=False)
        mcmc.run(jax.random.key(0), X, y=y)
        jax.block_until_ready(mcmc.get_samples()["beta"].mean(0))
    else:
        import blrppl

        result = blrppl.NonConjugateVI(logistic.model, learning_rate=0.5).run(
            jax.random.key(0), 200, X, y=y, tol=1e-6, progress_bar=False
        )
        jax.block_until_ready(result.posterior["beta"].mean)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if answered_in_this_process(options.one, _one):
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    times: dict = {case: [] for case in CASES}
    for _ in range(options.rounds):
        for case in CASES:
            times[case].append(in_fresh_process(["-m", "benchmarks.first_call_large", "--one", case], ROOT))
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    gmm, sk = min(times["gmm_blrppl"]), min(times["gmm_sklearn"])
    lr, nuts = min(times["logistic_blrppl"]), min(times["logistic_nuts"])
    print(f"mixture N = 100,000: blrppl first call {fmt(times['gmm_blrppl'])} s; scikit-learn {fmt(times['gmm_sklearn'])} s;"
          f" best/best {sk / gmm:.2f}x (bar: > 1)")
    print(f"logistic N = 100,000: blrppl first call {fmt(times['logistic_blrppl'])} s; NUTS {fmt(times['logistic_nuts'])} s;"
          f" best/best {nuts / lr:.1f}x (bar: >= 10)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
