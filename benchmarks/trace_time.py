"""Trace time of every zoo model: tracing is a one-off cost per model and data set.

Run from the repository root::

    python benchmarks/trace_time.py

For each model it prints the first trace (after JAX's own import and start-up,
so it includes compiling the handful of eager operations the model runs on
concrete values) and the median of five repeated traces. Not part of the tests.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import blrppl  # noqa: E402
from models import ZOO  # noqa: E402


def main() -> None:
    start = time.perf_counter()
    jnp.ones(3).block_until_ready()  # JAX's own start-up, not ours
    print(f"jax {jax.__version__} start-up: {time.perf_counter() - start:.3f} s")
    print(
        f"{'model':28s} {'first (s)':>10s} {'repeat (s)':>11s} {'variables':>10s} {'factors':>8s}"
    )
    total = 0.0
    for name, entry in ZOO.items():
        args, kwargs = entry.data()
        start = time.perf_counter()
        graph = blrppl.trace(entry.model, *args, **kwargs)
        first = time.perf_counter() - start
        repeats = []
        for _ in range(5):
            start = time.perf_counter()
            blrppl.trace(entry.model, *args, **kwargs)
            repeats.append(time.perf_counter() - start)
        total += first
        print(
            f"{name:28s} {first:10.3f} {statistics.median(repeats):11.3f} "
            f"{len(graph.variables):10d} {len(graph.factors):8d}"
        )
    print(f"{'all (first traces)':28s} {total:10.3f}")


if __name__ == "__main__":
    main()
