"""Where the test suite's time goes: XLA compilations per test (a pytest plugin and its report).

Run from the repository root::

    COMPILE_STATS=/tmp/suite PYTHONPATH=benchmarks python -m pytest -n 2 -q -p suite_compiles
    python benchmarks/suite_compiles.py /tmp/suite [--top 30]

The plugin counts each test's XLA compilations and their seconds (JAX's
``/jax/core/compile/backend_compile_duration`` events) next to its wall time and
writes them per pytest-xdist worker to ``$COMPILE_STATS.<worker>``; the report
sums them and lists the tests by time and by number of compilations. A test that
compiles a hundred one-operation programs runs its JAX eagerly, op by op (a
sampler, a Hessian, an estimator called outside ``jit``): ``tests.compiles.cheap_jit``
makes it one program (2026-11-29: five such tests 8-13 s -> 0.4-4.4 s). Most of
the suite's time is compilation (481 of 803 s of test time that day).
Not part of the tests.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

_counts = {"compiles": 0, "seconds": 0.0}
_rows: list = []
_listening = [False]


def _listen(event: str, duration: float, **_: object) -> None:
    if event.endswith("backend_compile_duration"):
        _counts["compiles"] += 1
        _counts["seconds"] += duration


try:
    import pytest
except ImportError:  # the report alone needs no pytest
    pytest = None

if pytest is not None:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):  # noqa: D103 - a pytest hook
        if not _listening[0]:
            from jax._src import monitoring

            monitoring.register_event_duration_secs_listener(_listen)
            _listening[0] = True
        compiles, seconds, start = _counts["compiles"], _counts["seconds"], time.perf_counter()
        yield
        _rows.append((item.nodeid, _counts["compiles"] - compiles, _counts["seconds"] - seconds,
                      time.perf_counter() - start))


def pytest_sessionfinish(session) -> None:  # noqa: D103 - a pytest hook
    path = os.environ.get("COMPILE_STATS")
    if path:
        with open(f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "w") as f:
            json.dump(_rows, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", help="the COMPILE_STATS path the suite ran with")
    parser.add_argument("--top", type=int, default=30)
    options = parser.parse_args()
    rows = [row for name in glob.glob(f"{options.prefix}.*") for row in json.load(open(name))]
    if not rows:
        raise SystemExit(f"no results under {options.prefix}.*: run the suite with COMPILE_STATS set")
    print(f"{len(rows)} tests, {sum(r[3] for r in rows):.0f} s in all, of which XLA compiled "
          f"{sum(r[2] for r in rows):.0f} s ({sum(r[1] for r in rows)} compilations)")
    for title, key in (("slowest", lambda r: -r[3]), ("most compilations", lambda r: -r[1])):
        print(f"\n{title}: seconds, compilations, compile seconds, test")
        for nodeid, compiles, seconds, wall in sorted(rows, key=key)[: options.top]:
            print(f"{wall:6.1f} {compiles:5d} {seconds:6.1f}  {nodeid}")


if __name__ == "__main__":
    main()
