"""Where a user's first call goes: wall and CPU seconds and XLA compiles per zoo model.

Run from the repository root::

    python benchmarks/first_call_profile.py [--models gp,nile,...|all|styles] [--names]

Each model runs in a fresh Python process (JAX's in-process caches empty, no
persistent compilation cache), so each row is a true first call:
``engine.run`` in a new engine, tracing, planning, compilation and the fit,
after JAX's own start-up. ``--models styles``: the ten models of
``models/styles.py``, written outside the zoo. Models without an engine in :data:`ENGINES` get the
one ``python -m blrppl fit`` picks (``blrppl.choose``, its time included; a
``*`` marks ``blocks="all"``). It prints the wall seconds (with the machine's load:
on a shared machine read the CPU seconds, ``time.process_time``, all threads),
the number of XLA compiles and the seconds they took (JAX's
``/jax/core/compile/backend_compile_duration`` events), and with ``--names``
the compiled programs' names, most frequent first (eager ``jnp`` operations on
the host show up as one-op programs such as ``jit(add)``). Not part of the tests.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks._timing import answered_in_this_process, in_fresh_process  # noqa: E402
MODELS = ("gp", "eight_schools_noncentered", "normal_mean_precision", "logistic_regression", "hmm", "nile")
ENGINES = {
    "gp": "NonConjugateVI",
    "eight_schools_noncentered": "NonConjugateVI",
    "normal_mean_precision": "VMP",
    "logistic_regression": "NonConjugateVI",
    "hmm": "VMP",
    "nile": "EM",
}


def _one(name: str) -> dict:
    """The first call of model ``name`` in this (fresh) process."""
    sys.path.insert(0, ROOT)
    os.environ.pop("BLRPPL_COMPILATION_CACHE", None)
    import jax
    import jax.numpy as jnp
    from jax._src import monitoring

    jax.config.update("jax_enable_x64", True)
    jnp.ones(3).block_until_ready()  # JAX's own start-up, not ours

    import blrppl
    from models import styles
    from models import ZOO, gp

    compiles = []
    monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds)
        if event == "/jax/core/compile/backend_compile_duration" else None
    )
    names = collections.Counter()

    class _Names(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("Finished XLA compilation of "):
                names[message.split(" ")[4]] += 1

    handler = _Names(logging.DEBUG)
    for logger in ("jax._src.dispatch", "jax._src.interpreters.pxla"):
        logging.getLogger(logger).addHandler(handler)
        logging.getLogger(logger).setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").propagate = False

    if name == "gp":  # the case: N = 100, as tests/engines/test_gp.py
        model = ZOO[name].model
        args, kwargs = gp.data(100)
        steps, tol = 100, 1e-6
    elif name in styles.MODELS:  # a model outside the zoo (models/styles.py)
        model, data = styles.MODELS[name]
        args, kwargs = data()
        steps, tol = 200, 1e-8
    else:
        model = ZOO[name].model
        args, kwargs = ZOO[name].data()
        steps, tol = 200, 1e-8
    wall, cpu = time.perf_counter(), time.process_time()
    if name in ENGINES:
        engine_name = ENGINES[name]
        engine = getattr(blrppl, engine_name)(model)
        result = engine.run(jax.random.key(0), steps, *args, progress_bar=False, tol=tol, **kwargs)
    else:  # the engine python -m blrppl fit picks (its choice timed too), with its default options
        choice = blrppl.choose(model, *args, **kwargs)
        engine_name = choice.name + ("*" if getattr(choice.engine.config, "blocks", None) == "all" else "")
        if choice.plan is not None:
            result = choice.engine.fit(choice.plan, jax.random.key(0), steps, progress_bar=False, tol=tol)
        else:
            result = choice.engine.run(jax.random.key(0), steps, *args, progress_bar=False, tol=tol, **kwargs)
    jax.block_until_ready(jax.tree.leaves(result.state))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"model": name, "engine": engine_name, "wall": wall, "cpu": cpu, "compiles": len(compiles),
            "compile_s": sum(compiles), "steps": len(result.elbo), "names": names.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models, or 'all'")
    parser.add_argument("--names", action="store_true", help="list the compiled programs")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if answered_in_this_process(options.one, _one):
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'model':28s} {'engine':15s} {'steps':>5s} {'wall s':>7s} {'CPU s':>7s} {'compiles':>8s} {'compile s':>9s}")
    if options.models in ("all", "styles"):
        sys.path.insert(0, ROOT)
        from models import styles
        from models import ZOO

        options.models = ",".join(ZOO if options.models == "all" else styles.NAMES)
    for name in options.models.split(","):
        try:
            row = in_fresh_process([__file__, "--one", name], ROOT)
        except RuntimeError as error:
            print(f"{name}: failed\n{error}")
            continue
        print(f"{row['model']:28s} {row['engine']:15s} {row['steps']:5d} {row['wall']:7.2f} {row['cpu']:7.2f} "
              f"{row['compiles']:8d} {row['compile_s']:9.2f}")
        if options.names:
            print("    " + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in row["names"]))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
