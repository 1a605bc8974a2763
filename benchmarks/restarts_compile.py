"""What vmapped restarts cost a first call: ``run``'s restarts one by one against one vmapped run.

    python -m benchmarks.restarts_compile [--models gmm,gmm1000,hmm_markov,...] [--rounds 2]

Until 2026-11-29 ``engine.run`` fitted a multimodal model (mixtures, HMMs) from
``DEFAULT_RESTARTS`` starts in one vmapped program per stage. Under ``vmap`` a ``while_loop``'s
body and every ``cond`` with a batched predicate run both ways with selects, so those programs
were larger than a single fit's: the mixture on 1,000 points compiled for 3.0-3.5 s with 4
restarts and 1.1-1.3 s with one. ``run`` now runs them one by one with one-lane programs
(:mod:`blrppl.blr.serial_restarts`). The "vmapped" variant here is ``run_batched`` on a batch of
one data set, whose restarts are still one vmapped run (the same starts and keys). Both report
the best restart's final ELBO, so that they can be seen to reach the same optimum. Each row
is a fresh process; rounds alternate the two. VMP only (the engine the zoo's restart models
take). Not part of the tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks._timing import answered_in_this_process, in_fresh_process  # noqa: E402

MODELS = ("gmm", "gmm1000", "gaussian_mixture", "hmm_markov", "hmm_enum", "hmm_sequences")
RESTARTS = 4


def _case(name: str):
    """``(model, args, kwargs, steps, tol)``: ``gmm[N]`` is ``benchmarks/gmm_vs_sklearn.py``'s mixture
    on its first N points (default 100,000), any other name a zoo model."""
    import jax.numpy as jnp
    import numpy as np

    if name.startswith("gmm"):
        from benchmarks import gmm_vs_sklearn as gmm

        _, train, _ = gmm.make_data(np.random.default_rng(0))
        n = int(name[3:]) if len(name) > 3 else len(train)
        return gmm.gmm, (jnp.asarray(train[:n]),), {}, 500, gmm.BLRPPL_TOL
    from models import ZOO

    args, kwargs = ZOO[name].data()
    return ZOO[name].model, args, kwargs, 200, 1e-8


def _one(spec: str) -> dict:
    name, variant = spec.split(":")
    os.environ.pop("BLRPPL_COMPILATION_CACHE", None)
    import jax
    import jax.numpy as jnp
    from jax._src import monitoring

    jax.config.update("jax_enable_x64", True)
    jnp.ones(3).block_until_ready()  # JAX's own start-up
    import blrppl

    compiles: list = []
    monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds) if event.endswith("backend_compile_duration") else None
    )

    model, args, kwargs, steps, tol = _case(name)
    key = jax.random.key(0)
    wall = time.perf_counter()
    engine = blrppl.VMP(model)
    if variant == "serial":
        result = engine.run(key, steps, *args, progress_bar=False, tol=tol, num_restarts=RESTARTS, **kwargs)
    else:
        one = jax.tree.map(lambda a: a[None] if hasattr(a, "shape") else a, (args, kwargs))
        result = engine.run_batched(key, steps, *one[0], tol=tol, num_restarts=RESTARTS, **one[1])[0]
    jax.block_until_ready(jax.tree.leaves(result.state))
    best = float(result.elbo[-1])
    return {"wall": time.perf_counter() - wall, "compile_s": sum(compiles), "compiles": len(compiles), "best": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if answered_in_this_process(options.one, _one):
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {RESTARTS} restarts")
    print(f"{'model':18s} {'restarts':10s} {'first call s':>24s} {'compile s':>18s} {'best ELBO':>16s}")
    for name in options.models.split(","):
        rows: dict = {"vmapped": [], "serial": []}
        for _ in range(options.rounds):
            for variant in rows:
                rows[variant].append(in_fresh_process(["-m", "benchmarks.restarts_compile", "--one", f"{name}:{variant}"], ROOT))
        for variant, runs in rows.items():
            walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
            compiled = ", ".join(f"{r['compile_s']:.2f}" for r in runs)
            print(f"{name:18s} {variant:10s} {walls:>24s} {compiled:>18s} {runs[-1]['best']:16.4f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
