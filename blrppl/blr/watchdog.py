"""No run may hang silently: wait for a dispatched computation while watching the CPU.

XLA:CPU computations do not sleep while they make progress, so a result that
is not ready while the whole process has used (almost) no CPU for
``BLRPPL_STALL_SECONDS`` (default 60) is deadlocked, not slow. jaxlib 0.10.x
has such a deadlock: a *batched* LAPACK call (Cholesky, triangular solve,
eigh, ... under ``vmap``) whose batch is worth more than about 2e5 flops is
split over XLA's intra-op thread pool, and its own thread then blocks waiting
for the pieces; when as many such calls run at once as the pool has threads
(2 on a 2-core machine), nobody is left to run the pieces (issue 14; fixed
upstream in jaxlib 0.11.2). blrppl avoids batched LAPACK calls where a
factor's code calls LAPACK (``lax.map`` over samples and restarts), so this is
a safety net: a deadlocked computation can never be cancelled, so
:func:`block_until_ready` raises :class:`~blrppl.errors.RuntimeDeadlock`
naming the cause and the workaround, and lets the process exit (its shutdown
would otherwise wait for the computation forever).

The waiting itself is done by a daemon thread (one per process) that calls
``jax.block_until_ready`` and signals when it returns, so a result is taken
as soon as it is ready; the caller wakes every ``POLL_SECONDS`` meanwhile to
watch the CPU. (A fixed 50 ms sleep between looks made every fit of a few
milliseconds, one Kalman smoother, wait 50 ms; sleeps that grow with the
wait still cost such a fit a few tenths of a millisecond.)

``BLRPPL_STALL_SECONDS=0`` turns the check off (a model whose code waits on
the host, e.g. a ``jax.pure_callback`` that sleeps, looks idle to it).
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time
from typing import Any, Optional

import jax

from blrppl.errors import RuntimeDeadlock

DEFAULT_STALL_SECONDS = 60.0
IDLE_FRACTION = 0.01
"""Below this fraction of one core over a window, the process counts as idle."""
POLL_SECONDS = 0.05
"""How often the caller looks at the CPU while the computation runs."""


def stall_seconds() -> float:
    """The patience of the check, from ``BLRPPL_STALL_SECONDS`` (0 or less: off)."""
    try:
        return float(os.environ.get("BLRPPL_STALL_SECONDS", DEFAULT_STALL_SECONDS))
    except ValueError:
        return DEFAULT_STALL_SECONDS


def block_until_ready(tree: Any, what: str = "the fit") -> Any:
    """``jax.block_until_ready`` that raises :class:`RuntimeDeadlock` instead of waiting forever.

    Raises:
      RuntimeDeadlock: when the computation is not ready and the process
        used less than ``IDLE_FRACTION`` of a core for ``stall_seconds()``.
    """
    patience = stall_seconds()
    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "is_ready")]
    waiting = _pending(leaves, 0)
    if patience <= 0 or waiting == len(leaves):
        return jax.block_until_ready(tree)
    done = _wait_in_background(leaves)
    since, cpu_since = time.monotonic(), time.process_time()
    last = since
    while True:
        if done.wait(POLL_SECONDS):
            waiting = _pending(leaves, waiting)
            if waiting == len(leaves):
                break
            time.sleep(POLL_SECONDS)  # a leaf that jax cannot wait on (not a jax array): look again later
        else:
            waiting = _pending(leaves, waiting)
            if waiting == len(leaves):
                break
        now, cpu = time.monotonic(), time.process_time()
        if now - last > 5.0:  # this thread was not scheduled (process stopped, machine suspended)
            since, cpu_since = now, cpu
        last = now
        if now - since >= 1.0 and cpu - cpu_since > IDLE_FRACTION * (now - since):
            since, cpu_since = now, cpu  # busy: the computation is progressing
        elif now - since > patience:
            import jaxlib

            atexit.register(_exit_now)  # runs before jax's own handlers, which would wait forever
            raise RuntimeDeadlock(
                f"{what}: the JAX computation made no progress for {now - since:.0f} s while this process "
                f"used {cpu - cpu_since:.2f} s of CPU: it is deadlocked, not slow. jaxlib {jaxlib.__version__} "
                "deadlocks when several batched LAPACK calls (Cholesky, triangular solves, eigh, ... of a "
                "model's log density evaluated under vmap) run at once on a machine with few cores. "
                "This process's JAX CPU runtime cannot recover; start Python again with the environment "
                "variable PJRT_NPROC=1 (one XLA intra-op thread; or run it under `taskset -c 0`), or use "
                "jaxlib >= 0.11.2. BLRPPL_STALL_SECONDS sets this check's patience (0: off; a model "
                "whose code waits on the host looks idle to it)."
            )
    return tree


_requests: Optional[queue.SimpleQueue] = None
_requests_lock = threading.Lock()


def _wait_in_background(leaves: list) -> threading.Event:
    """An event set once ``jax.block_until_ready(leaves)`` returned in the waiting thread."""
    global _requests
    with _requests_lock:
        if _requests is None:
            _requests = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(_requests,), name="blrppl-watchdog", daemon=True).start()
    done = threading.Event()
    _requests.put((leaves, done))
    return done


def _serve(requests: queue.SimpleQueue) -> None:
    """The waiting thread: one request after another (a deadlocked one blocks it for good,
    and later waits fall back to looking at the leaves every ``POLL_SECONDS``)."""
    while True:
        leaves, done = requests.get()
        try:
            jax.block_until_ready(leaves)
        except Exception:  # noqa: BLE001 - the caller meets the error where it reads the result
            pass
        done.set()
        del leaves, done  # hold no results between requests


def _pending(leaves: list, first: int) -> int:
    """The index of the first leaf from ``first`` on that is not ready (``len(leaves)``: all are);
    one look per wake while the computation runs, whatever the number of leaves."""
    while first < len(leaves) and leaves[first].is_ready():
        first += 1
    return first


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
