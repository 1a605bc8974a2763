"""What vmapped restarts cost a first call: the default ``run`` against restarts one at a time.

    python -m benchmarks.restarts_compile [--models gmm,gmm1000,hmm_markov,...] [--rounds 2]

``engine.run`` fits a multimodal model (mixtures, HMMs) from ``DEFAULT_RESTARTS`` starts in one
vmapped program per stage (``driver._init_with_restarts``, ``driver._run_chunks``). Under
``vmap`` a ``while_loop``'s body and every ``cond`` with a batched predicate run both ways with
selects, so those programs are larger than a single fit's: measured 2026-11-29 on 2 cores, the
mixture on 1,000 points compiles for 3.0-3.5 s with 4 restarts and 1.1-1.3 s with one.

The "one by one" variant here is a prototype of the alternative, not blrppl's code path: the
same starts (restart 0 the plain start, restart c the random start of ``fold_in(key, c)``, by
``algorithm.start``'s traced flag) and the same loop, each as a one-lane program compiled once
(start and loop side by side) and run once per restart. It leaves out the fit's checks and
flags, which the default run pays (about 0.1-0.2 s of a first call), and reports the best
restart's final ELBO so that the two can be seen to reach the same optimum. Each row is a
fresh process; rounds alternate the two. VMP only (the engine the zoo's restart models take).
Not part of the tests.
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
    import numpy as np
    from jax._src import monitoring

    jax.config.update("jax_enable_x64", True)
    jnp.ones(3).block_until_ready()  # JAX's own start-up
    import blrppl
    from blrppl.blr import driver
    from blrppl.blr.ahead import compile_side_by_side, idle_time
    from blrppl.blr.starts import start_tests
    from blrppl.compile_mode import planned_steps, size_dependent_jit

    compiles: list = []
    monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds) if event.endswith("backend_compile_duration") else None
    )

    @size_dependent_jit(data_argnum=4, static_argnums=(0, 1), one_shot=True)
    def start_one(algorithm, tests, key, moved, arrays, stop):
        natural, params = algorithm.start(key, arrays, moved)
        state = algorithm.finish(key, natural, params, arrays)
        valid = driver._valid(tests, state.natural)
        return state, valid, jnp.where(jnp.all(valid) | moved, stop, jnp.zeros_like(stop))

    model, args, kwargs, steps, tol = _case(name)
    key = jax.random.key(0)
    wall = time.perf_counter()
    engine = blrppl.VMP(model)
    if variant == "vmapped":
        result = engine.run(key, steps, *args, progress_bar=False, tol=tol, num_restarts=RESTARTS, **kwargs)
        jax.block_until_ready(jax.tree.leaves(result.state))
        best = float(result.elbo[-1])
    else:
        with idle_time():
            plan = engine.plan(*args, **kwargs)
            algorithm = engine.build(plan)
            if algorithm.finish is None:
                raise SystemExit(f"{name}: its algorithm has no start/finish split; the prototype needs one")
            keys = [key] + [jax.random.fold_in(key, c) for c in range(1, RESTARTS)]
            tests = start_tests(plan.qs)
            with planned_steps(steps):
                threshold, buffer, previous, hits = driver._loop_inputs(steps, tol)
                stop, zero = np.asarray(steps, np.int32), np.asarray(0, np.int32)

                def chunk_args(outputs):
                    state, _, bound = outputs
                    return algorithm, plan.arrays, state, buffer, zero, bound, previous, hits, threshold

                first_args = (algorithm, tests, keys[0], np.asarray(False), plan.arrays, stop)
                started = compile_side_by_side(start_one, first_args, driver._run_chunk, chunk_args)
                lasts, states = [], []
                for c in range(RESTARTS):
                    outputs = started if c == 0 and started is not None else start_one(
                        algorithm, tests, keys[c], np.asarray(c > 0), plan.arrays, stop
                    )
                    end, state, trace, _, _ = driver._run_chunk(*chunk_args(outputs))
                    lasts.append(float(np.asarray(trace)[int(end) - 1]))
                    states.append(state)
        best = max(lasts)
        jax.block_until_ready(jax.tree.leaves(states[int(np.argmax(lasts))]))
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
        rows: dict = {"vmapped": [], "one_by_one": []}
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
