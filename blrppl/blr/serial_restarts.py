"""The restarts of one data set, one after another, each with a single fit's programs.

``num_restarts=C`` fits one data set from C starts (:mod:`blrppl.blr.restarts`). Vmapped
over restarts (as :func:`blrppl.blr.driver.run_restarts` still fits a batch of data sets), a
``while_loop``'s body and every ``cond`` with a batched predicate run both ways with
selects, so the programs compile 1.5-3x longer than a single fit's (a mixture on 1,000
points: 3.0-3.9 s against 1.1-1.3 s, ``benchmarks/restarts_compile.py``). Here restart c
runs the single fit's loop (:func:`blrppl.blr.driver._chunk`, the very program that
``num_restarts=1`` runs) from its own start, and one start program serves every restart
(the restart's index traced), so a first call compiles two one-lane programs, side by side
(:mod:`blrppl.blr.ahead`). The restarts are dispatched one behind the other without a
wait, each stops on its own (none runs until the slowest stops), and the host reads the
results once.

Restart 0 is the plain start (``algorithm.init(rng_key)``) and restart c > 0 the random
start of ``fold_in(rng_key, c)``, as before: the results equal the vmapped run's up to
rounding.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr import driver, stopping
from blrppl.blr.ahead import compile_side_by_side
from blrppl.blr.state import BLRState, InferenceAlgorithm
from blrppl.blr.watchdog import block_until_ready
from blrppl.compile_mode import SizeDependentJit, planned_steps, size_dependent_jit, to_device, to_host


def run_serial_restarts(
    algorithm: InferenceAlgorithm,
    random_algorithm: Optional[InferenceAlgorithm],
    rng_key: jax.Array,
    num_restarts: int,
    num_steps: int,
    arrays: Any,
    tests: tuple,
    *,
    tol: Optional[float] = None,
    progress_bar: bool = True,
    num_updates: int = 20,
    after: Optional[Callable] = None,
    check_start: Optional[Callable[[np.ndarray], None]] = None,
    init_states: Optional[BLRState] = None,
) -> tuple[BLRState, jax.Array, jax.Array, jax.Array]:
    """``num_restarts`` runs of ``algorithm`` (:func:`~blrppl.blr.driver.run` each), one after another.

    Args:
      algorithm: the fit's algorithm; restart 0 starts with its ``init``.
      random_algorithm: the random starts' algorithm (``build(plan, random_starts=True)``), read
        only where ``algorithm`` has no ``start``/``finish`` split (a Newton start).
      rng_key: restart 0's key; restart c's is ``fold_in(rng_key, c)``.
      tests: ``(name, is_valid)`` pairs of restart 0's start (as :func:`~blrppl.blr.driver.checked_run`),
        whose verdicts go to ``check_start`` (on the host) before any result is read; a start
        that fails one takes no step.
      after: as :func:`~blrppl.blr.driver.checked_run`'s, for the best restart's final state.
      init_states: stacked states to resume from (``result.restarts.state``): restart c resumes
        from row c, and no start is made.

    Returns:
      As :func:`~blrppl.blr.driver.run_restarts`: ``(states, elbo, num_run, converged)``, the
      final states stacked (leading axis C), the ELBO traces ``(C, T)`` padded with NaN after a
      restart stopped, the steps each ran, and whether ``tol`` stopped each.
    """
    num_steps = driver._check_steps(num_steps)
    with planned_steps(num_steps):
        if init_states is None:
            starts = _starts(algorithm, random_algorithm, rng_key, num_restarts, arrays, tests, num_steps, tol, after)
        else:
            stop = np.asarray(num_steps, np.int32)
            starts = ((driver.take(init_states, c), None, stop) for c in range(num_restarts))
        if progress_bar:
            runs = _run_with_bars(algorithm, num_steps, arrays, starts, tol, num_updates, check_start)
        else:
            runs = _run_behind(algorithm, num_steps, arrays, starts, tol, check_start)
        states, traces, done = zip(*runs)
        states = _stack(states)
    ends = np.asarray([len(trace) for trace in traces], np.int32)
    elbo = np.full((num_restarts, int(ends.max())), np.nan, np.result_type(*traces))
    for c, trace in enumerate(traces):
        elbo[c, : len(trace)] = trace
    return states, to_device(elbo), to_device(ends), to_device(np.asarray(done, bool))


def _starts(algorithm, random_algorithm, rng_key, num_restarts, arrays, tests, num_steps, tol, after):
    """``(state, valid, stop)`` of each restart, made as the loop asks for them: restart 0's
    compiled beside the loop (and beside the stacking, the best row's take and ``after``)."""
    stop, zero = np.asarray(num_steps, np.int32), np.asarray(0, np.int32)
    shared = algorithm.finish is not None
    first = (_start, (algorithm, None, tests, rng_key, zero, arrays, stop)) if shared else (
        driver._init, (algorithm, tests, algorithm.exact, rng_key, arrays, stop)
    )
    threshold, buffer, previous, hits = driver._loop_inputs(num_steps, tol)

    def chunk_args(outputs):
        state, _, bound = outputs
        return algorithm, arrays, driver._lean(algorithm, state), buffer, zero, bound, previous, hits, threshold

    def then(args):  # what runs after the loops, lowered for the loop's output types (jit's cached trace)
        row = driver._run_chunk.variant(*args).trace(*args).out_info[1]
        row = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type), row)
        rows = (row,) * num_restarts
        stacked = jax.eval_shape(_stack_rows, rows)
        lowered = [_stack.lower(rows), driver._take.lower(stacked, zero, 0)]
        if not shared:
            lowered.append(_start.lower(algorithm, random_algorithm, (), rng_key, zero, arrays, stop))
        return lowered + ([] if after is None else [after(row, arrays)])

    def others(c):  # restart c's start (restart 0's program where shared; its verdicts unread)
        index = np.asarray(c, np.int32)
        return (algorithm, None, tests, rng_key, index, arrays, stop) if shared else (
            algorithm, random_algorithm, (), rng_key, index, arrays, stop
        )

    early: list = []

    def more(program):  # the other starts, run while the loop compiles (a core is free then)
        early.extend(program(*others(c)) for c in range(1, num_restarts))

    started = compile_side_by_side(*first, driver._run_chunk, chunk_args, then, more if shared else None)
    yield started if started is not None else first[0](*first[1])
    if started is not None and len(early) == num_restarts - 1:
        yield from early
        return
    for c in range(1, num_restarts):
        yield _start(*others(c))


@size_dependent_jit(data_argnum=5, static_argnums=(0, 1, 2), one_shot=True)
def _start(algorithm, random_algorithm, tests, rng_key, index, arrays, stop):
    """Restart ``index``'s start (traced), its tests, and ``stop`` where they passed or the
    start is random (else 0: no step; :func:`~blrppl.blr.driver._init`'s bound). Without
    ``random_algorithm``, ``algorithm.start``'s traced flag chooses the plain start (index 0)
    or the random one, and ``algorithm.finish`` completes either: one program for every
    restart. With it (a plain start that ``finish`` does not share), the random start."""
    moved = index > 0
    key = jax.lax.cond(moved, lambda: jax.random.fold_in(rng_key, index), lambda: rng_key)
    if random_algorithm is None:
        natural, params = algorithm.start(key, arrays, moved, index)
        state = algorithm.finish(key, natural, params, arrays)
    else:
        state = random_algorithm.init(key, arrays, index)
    valid = driver._valid(tests, state.natural)
    return driver._lean(algorithm, state), valid, jnp.where(jnp.all(valid) | moved, stop, jnp.zeros_like(stop))


def _run_behind(algorithm, num_steps, arrays, starts, tol, check_start):
    """Every restart's start and loop dispatched one behind the other, then read at once."""
    threshold, buffer, previous, hits = driver._loop_inputs(num_steps, tol)
    zero, outputs, valid = np.asarray(0, np.int32), [], None
    for c, (state, verdicts, stop) in enumerate(starts):
        valid = verdicts if c == 0 else valid
        outputs.append(driver._run_chunk(
            algorithm, arrays, driver._lean(algorithm, state), buffer, zero, stop, previous, hits, threshold
        ))
    block_until_ready(outputs)
    if check_start is not None and valid is not None:
        check_start(np.asarray(valid))
    read = to_host([(end, buffer, count) for end, _, buffer, _, count in outputs])  # one transfer
    for (end, buffer, count), (_, state, *_) in zip(read, outputs):
        yield state, buffer[: int(end)], int(count) >= stopping.CONFIRMATIONS


def _run_with_bars(algorithm, num_steps, arrays, starts, tol, num_updates, check_start):
    """Each restart in turn, with its own progress bar (as NumPyro's sequential chains)."""
    for c, (state, valid, _) in enumerate(starts):
        if c == 0 and check_start is not None and valid is not None:
            check_start(np.asarray(block_until_ready(valid)))
        state, elbo, done = driver._loop(
            algorithm, num_steps, arrays, state, tol, True, num_updates, desc=f"restart {c}", tiered=False
        )
        yield state, np.asarray(elbo), done


def _stack_rows(rows: tuple) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *rows)


_stack = SizeDependentJit(_stack_rows, data_argnum=0, one_shot=True)
""":func:`_stack_rows`: the restarts' final states stacked (leading axis C), in one compiled call."""

