"""Timing helpers shared by the benchmarks (best of several repeats, after warm-up)."""

from __future__ import annotations

import time
from typing import Any, Callable

import jax


def best_time(fn: Callable[[], Any], repeats: int = 7) -> float:
    """Best wall-clock seconds of ``fn()`` (blocked until ready), after one warm-up."""
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def interleaved_times(fns: dict[str, Callable[[], Any]], rounds: int = 30) -> dict[str, tuple[float, float]]:
    """``name -> (best, median)`` wall-clock seconds of each ``fn()`` (blocked until ready).

    One call of every function per round, after one warm-up each, so that a
    shared machine's changing load falls on all of them alike.
    """
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: (min(t), sorted(t)[len(t) // 2]) for name, t in times.items()}


def table(rows: list[tuple], header: tuple) -> str:
    """A plain-text table."""
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths))] + [line(r) for r in rows])


def in_fresh_process(command: list[str], cwd: str) -> Any:
    """Run ``python *command`` in a new process (JAX's caches empty, no persistent compilation
    cache) and return the JSON value its last output line prints; raises ``RuntimeError``
    with its error output if it fails."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "BLRPPL_COMPILATION_CACHE"}
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def answered_in_this_process(one: Any, run: Callable[[Any], Any]) -> bool:
    """The child side of :func:`in_fresh_process`: with ``one`` (a hidden ``--one`` argument) set,
    print ``run(one)`` as the JSON line the parent reads and return True; else False."""
    import json

    if not one:
        return False
    print(json.dumps(run(one)))
    return True
