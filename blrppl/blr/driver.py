"""Run an inference algorithm: one jit-compiled loop, a progress bar between chunks.

The algorithm (its static structure) is a static argument of the compiled
functions and the plan's arrays a dynamic one, so running the same algorithm
on new data of the same shapes reuses the compiled program. The driver waits
for results through :func:`~blrppl.blr.watchdog.block_until_ready`, so a
computation that stops making progress (a JAX runtime deadlock) becomes a
:class:`~blrppl.errors.RuntimeDeadlock` naming the cause and the workaround,
never a silent hang.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tqdm.auto as tqdm

from blrppl.blr import stopping
from blrppl.blr.ahead import compile_side_by_side
from blrppl.blr.restarts import folded_keys
from blrppl.blr.state import BLRState, InferenceAlgorithm
from blrppl.blr.watchdog import block_until_ready
from blrppl.compile_mode import FIRST_STEPS, SizeDependentJit, first_steps, planned_steps, size_dependent_jit, to_device, to_host


def init(algorithm: InferenceAlgorithm, rng_key: jax.Array, arrays: Any) -> BLRState:
    """``algorithm.init``, compiled once per algorithm."""
    return _init(algorithm, (), False, rng_key, arrays, np.zeros((), np.int32))[0]


def checked_init(
    algorithm: InferenceAlgorithm, rng_key: jax.Array, arrays: Any, tests: tuple
) -> tuple[BLRState, np.ndarray]:
    """``algorithm.init`` and whether each start passes its test, in one compiled call.

    ``tests`` is a tuple of ``(name, is_valid)`` pairs (static); the second
    result holds ``all(is_valid(state.natural[name]))`` per pair, on the host.
    """
    state, valid, _ = _init(algorithm, tests, False, rng_key, arrays, np.zeros((), np.int32))
    return state, np.asarray(block_until_ready(valid))


@size_dependent_jit(data_argnum=4, static_argnums=(0, 1, 2), one_shot=True)
def _init(algorithm, tests, lean, rng_key, arrays, stop):
    """The start, its tests, and ``stop`` where every test passed (else 0: no step);
    ``lean``: the state without λ (:func:`_lean`), which then is not made unless tested."""
    state = algorithm.init(rng_key, arrays)
    valid = _valid(tests, state.natural)
    if lean:
        state = _lean(algorithm, state)
    return state, valid, jnp.where(jnp.all(valid), stop, jnp.zeros_like(stop))


def _lean(algorithm: InferenceAlgorithm, state: BLRState) -> BLRState:
    """An exact algorithm's state without λ, which its step does not read: the loop then
    starts from ``algorithm.blank`` (placeholders, no pass over the data) inside its own
    program, written straight into the λ it returns, instead of a start made, returned and
    copied in by another call. (For other algorithms, the state.)"""
    return state._replace(natural=None) if algorithm.exact else state


def _valid(tests: tuple, natural: Any) -> jax.Array:
    return jnp.stack([jnp.all(is_valid(natural[v])) for v, is_valid in tests]) if tests else jnp.zeros(0, bool)


def _buffer_length(num_steps: int) -> int:
    # The ELBO buffer's length is rounded up (at least 1024, then powers of two)
    # so that runs of different lengths share one compilation.
    return max(1024, 1 << (num_steps - 1).bit_length())


def _check_steps(num_steps: Any) -> int:
    if int(num_steps) != num_steps or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps}.")
    return int(num_steps)


def run(
    algorithm: InferenceAlgorithm,
    rng_key: jax.Array,
    num_steps: int,
    arrays: Any,
    *,
    init_state: Optional[BLRState] = None,
    tol: Optional[float] = None,
    progress_bar: bool = True,
    num_updates: int = 20,
) -> tuple[BLRState, jax.Array]:
    """Run ``algorithm`` for up to ``num_steps`` steps.

    The loop is a jit-compiled ``lax.while_loop`` that writes the ELBO after
    each step into a buffer. Without a progress bar it runs in one call
    (dispatched right behind the start, with no wait between them); with one,
    it runs in ``num_updates`` chunks (the host is touched ~20 times, never
    once per step) with the same compiled loop, so both paths give identical
    results.

    Convergence (``tol``): with deterministic site parameters, the run stops
    once ``|ELBO_t - ELBO_{t-1}| <= tol * |ELBO_t|`` and the gain still to come
    by Aitken's extrapolation of shrinking steps
    (:func:`~blrppl.blr.stopping.remaining_gain`) is within the same bound, both
    for two steps in a row (``tol`` at least
    :func:`~blrppl.blr.stopping.elbo_resolution` of the ELBO's dtype); with Monte Carlo site parameters (``algorithm.noisy``), once the
    averaged q moved by at most ``tol`` (the largest KL divergence of a block
    over a window of steps) in two windows in a row, never on one noisy step;
    for an exact algorithm (``algorithm.exact``: conjugate Bayes), after the
    first step taken, which is the fixed point.

    Args:
      algorithm: the ``InferenceAlgorithm`` to run; ``num_steps``: at most this many steps.
      rng_key: a JAX PRNG key; ``init`` draws the run's stream from it (ignored when resuming).
      arrays: the plan's data, an argument of the compiled loop.
      init_state: a state to resume from (``result.state``); else ``init``.
      tol: optional convergence threshold (see above); ``progress_bar``: a tqdm bar with the
        current ELBO, updated ``num_updates`` times.

    Returns:
      ``(state, elbo, converged)``: the final state, the ELBO after each step
      run, and whether ``tol`` stopped the run.
    """
    if init_state is None:
        state, elbo, converged, _ = checked_run(
            algorithm, rng_key, num_steps, arrays, (), tol=tol, progress_bar=progress_bar, num_updates=num_updates
        )
        return state, elbo, converged
    num_steps = _check_steps(num_steps)
    with planned_steps(num_steps):
        return _loop(algorithm, num_steps, arrays, init_state, tol, progress_bar, num_updates)


def checked_run(
    algorithm: InferenceAlgorithm,
    rng_key: jax.Array,
    num_steps: int,
    arrays: Any,
    tests: tuple,
    *,
    tol: Optional[float] = None,
    progress_bar: bool = True,
    num_updates: int = 20,
    after: Optional[Any] = None,
) -> tuple[BLRState, jax.Array, bool, np.ndarray]:
    """:func:`run` from ``algorithm.init``, its start tested as by :func:`checked_init`.

    Without a progress bar the loop is dispatched right behind the start, with
    no wait between them: a start that fails a test bounds the loop to no
    step on the device, and the host reads the verdicts with the results.
    ``after``: ``(state, arrays) -> lowered program or None``, one the caller runs on the final
    state (abstract here), compiled beside the fit's (``compile_side_by_side``'s ``then``).

    Returns:
      ``(state, elbo, converged, valid)``: as :func:`run`, and on the host
      whether the start passed each test (when one failed, no step was run:
      ``state`` is the start and ``elbo`` is empty).
    """
    num_steps = _check_steps(num_steps)
    with planned_steps(num_steps):
        return _checked_run(algorithm, rng_key, num_steps, arrays, tests, tol, progress_bar, num_updates, after)


def _checked_run(algorithm, rng_key, num_steps, arrays, tests, tol, progress_bar, num_updates, after=None):
    if algorithm.exact and not progress_bar:
        return _checked_exact_run(algorithm, rng_key, num_steps, arrays, tests, tol)
    first = _first_steps(algorithm, num_steps)  # the loop's first call runs at most these steps
    init_args = (algorithm, tests, algorithm.exact, rng_key, arrays, np.asarray(first or num_steps, np.int32))
    threshold, buffer, previous, hits = _loop_inputs(num_steps, tol)

    def chunk_args(init_outputs):
        state, _, stop = init_outputs
        stop = np.asarray(first or num_steps, np.int32) if progress_bar else stop
        return algorithm, arrays, _lean(algorithm, state), buffer, np.asarray(0, np.int32), stop, previous, hits, threshold

    def then(args):  # the final state's types: the loop's outputs' (jit's cached trace; weak types made strong)
        return after(_run_chunk.variant(*args).trace(*args).out_info[1], args[1])
    with first_steps(bool(first)):  # (the loop compiled beside the start is the one its first call runs)
        started = compile_side_by_side(_init, init_args, _run_chunk, chunk_args, None if after is None else then)
    state, valid, stop = started if started is not None else _init(*init_args)
    if progress_bar:
        valid = np.asarray(block_until_ready(valid))
        if not bool(np.all(valid)):
            return init(algorithm, rng_key, arrays), _head(np.zeros(0, jnp.result_type(float)), 0), False, valid
        state, elbo, converged = _loop(algorithm, num_steps, arrays, state, tol, progress_bar, num_updates)
        return state, elbo, converged, valid
    state, elbo, converged = _loop(algorithm, num_steps, arrays, state, tol, False, num_updates, stop)
    return state, elbo, converged, np.asarray(valid)


def _checked_exact_run(algorithm, rng_key, num_steps, arrays, tests, tol):
    """:func:`checked_run` of an exact algorithm without a progress bar: one compiled call
    (:func:`_exact_chunk`), start and loop, with one transfer of the results back."""
    threshold, buffer, previous, hits = _loop_inputs(num_steps, tol)
    zero, stop = np.asarray(0, np.int32), np.asarray(num_steps, np.int32)
    outputs = _run_exact_chunk(algorithm, arrays, rng_key, buffer, zero, stop, previous, hits, threshold, tests)
    end, state, buffer, _, hits, valid = block_until_ready(outputs)
    end, hits, buffer, valid = to_host((end, hits, buffer, valid))  # one transfer
    return state, _head(buffer, int(end)), int(hits) >= stopping.CONFIRMATIONS, np.asarray(valid)


def _exact_chunk(algorithm, arrays, rng_key, buffer, start, stop, previous, hits, threshold, tests):
    """:func:`_chunk` of an exact algorithm from ``algorithm.init(rng_key)`` made in the same
    program: its step does not read the start's λ (:func:`_lean`: the loop starts from
    placeholders), so the start's pass over the data is left out by the compiler, but where
    ``tests`` (static) ask for it: the start (the prior pushed through the graph) is then tested
    and no step is taken unless it passes (as :func:`_init`'s ``stop``). One dispatch: a small
    model's refit and a long chain's smoother pay no second call."""
    state = algorithm.init(rng_key, arrays)
    valid = _valid(tests, state.natural)
    stop = jnp.where(jnp.all(valid), stop, start)
    return _chunk(algorithm, arrays, _lean(algorithm, state), buffer, start, stop, previous, hits, threshold) + (valid,)


_run_exact_chunk = SizeDependentJit(_exact_chunk, data_argnum=1, static_argnums=(0, 9), loop=lambda args: _costed(args[0]))


def _loop_inputs(num_steps: int, tol: Optional[float]) -> tuple:
    """``(threshold, buffer, previous, hits)``, the loop's first inputs.

    Made in numpy (and the outputs read there): an eager jnp call on the host
    compiles a one-operation program per new shape. Read-only and made once per
    buffer length, ``tol`` and precision (a small model's refit pays microseconds).
    """
    return _made_loop_inputs(_buffer_length(num_steps), None if tol is None else float(tol), bool(jax.config.jax_enable_x64))


@functools.lru_cache(maxsize=64)
def _made_loop_inputs(length: int, tol: Optional[float], x64: bool) -> tuple:
    dtype = jnp.result_type(float)  # float64 where x64 (part of the key), else float32
    threshold = np.asarray(-1.0 if tol is None else tol, dtype)
    inputs = threshold, np.full((length,), np.nan, dtype), np.asarray(np.inf, dtype), np.zeros((), np.int32)
    for array in inputs:
        array.setflags(write=False)
    return inputs


def _first_steps(algorithm: InferenceAlgorithm, num_steps: int) -> int:
    """How many steps a run starts with in the cheaply compiled loop (0: none): after a Newton start,
    ``compile_mode.FIRST_STEPS`` (:func:`~blrppl.compile_mode.first_steps`)."""
    return min(FIRST_STEPS, num_steps) if algorithm.newton_started else 0


def _loop(algorithm, num_steps, arrays, state, tol, progress_bar, num_updates, stop=None, desc=None, tiered=True):
    """The loop of :func:`run` from ``state``: ``(state, elbo, converged)``; ``stop``: the
    bound of a run without a progress bar (default ``num_steps``), a device array if need be
    (after a Newton start at most the first steps', :func:`_first_steps`: the caller's start
    bounds it so); ``desc``: the progress bar's label. Where ``tiered``, steps before
    :func:`_first_steps` run in the loop compiled for them, the others in the loop compiled for
    ``num_steps`` (restarts, dispatched one behind the other, take the latter throughout)."""
    threshold, buffer, previous, hits = _loop_inputs(num_steps, tol)
    first = _first_steps(algorithm, num_steps) if tiered else 0
    if not progress_bar:
        stop = np.asarray(first or num_steps, np.int32) if stop is None else stop
        with first_steps(bool(first)):
            end, state, buffer, previous, hits = block_until_ready(_run_chunk(
                algorithm, arrays, _lean(algorithm, state), buffer, np.asarray(0, np.int32), stop, previous, hits, threshold
            ))
        end, hits = to_host((end, hits))
        if first and int(end) == first < num_steps and int(hits) < stopping.CONFIRMATIONS:
            end, state, buffer, previous, hits = block_until_ready(_run_chunk(
                algorithm, arrays, state, buffer, np.asarray(end, np.int32), np.asarray(num_steps, np.int32), previous,
                hits, threshold,
            ))
        end, hits, buffer = to_host((end, hits, buffer))  # one transfer
        return state, _head(buffer, int(end)), int(hits) >= stopping.CONFIRMATIONS

    chunk = -(-num_steps // num_updates)
    end = 0
    bounds = sorted({min(stop, num_steps) for stop in range(chunk, num_steps + chunk, chunk)} | ({first} if first else set()))
    with tqdm.tqdm(total=num_steps, desc=desc) as bar:
        for stop in bounds:
            with first_steps(stop <= first):
                new_end, state, buffer, previous, hits = _run_chunk(
                    algorithm, arrays, _lean(algorithm, state), buffer, np.asarray(end, np.int32),
                    np.asarray(stop, np.int32), previous, hits, threshold,
                )
            block_until_ready((new_end, state, previous, hits))
            new_end = int(new_end)
            bar.update(new_end - end)
            end = new_end
            done = int(hits) >= stopping.CONFIRMATIONS
            bar.set_postfix(elbo=f"{float(previous):.6g}", converged=done)
            if done:
                break
    return state, _head(buffer, end), done


def _head(buffer: jax.Array, end: int) -> jax.Array:
    """``buffer[:end]``, cut on the host (no compiled slice per length) and transferred
    (:func:`~blrppl.compile_mode.to_device`: nothing compiles)."""
    return to_device(np.asarray(buffer)[:end])


def _chunk(algorithm, arrays, state, buffer, start, stop, previous, hits, threshold):
    """Steps ``start`` to ``stop`` (or until converged) in one ``while_loop``."""
    if state.natural is None:  # an exact algorithm's lean state (:func:`_lean`): any valid start
        state = state._replace(natural=algorithm.blank(arrays))

    def cond(carry):
        i, _, _, _, hits = carry
        return (i < stop) & (hits < stopping.CONFIRMATIONS)

    def body(carry):
        i, state, buffer, previous, hits = carry
        state, info = algorithm.step(state, arrays)
        elbo = info.elbo.astype(buffer.dtype)
        before = jnp.where(i >= 2, buffer[jnp.maximum(i - 2, 0)], jnp.nan)  # (the buffer holds the run's ELBOs)
        buffer = buffer.at[i].set(elbo)
        hits = stopping.count_hits(algorithm, info, elbo, previous, hits, threshold, before)
        return i + 1, state, buffer, elbo, hits

    return jax.lax.while_loop(cond, body, (start, state, buffer, previous, hits))


def _costed(algorithm: InferenceAlgorithm) -> bool:
    """Whether a loop of ``algorithm`` may compile cheaply by its estimated work over larger data
    (``compile_mode.LOOP_FLOP_BUDGET``): not where some q is a chain, whose passes are loops over
    its length that the operation count sees once (an HMM over 10,000 steps would look cheap)."""
    return not getattr(algorithm, "chained", True)


_run_chunk = SizeDependentJit(_chunk, data_argnum=1, static_argnums=0, loop=lambda args: _costed(args[0]))
""":func:`_chunk`, compiled once per algorithm (a static argument), whatever the chunk
bounds, tolerance, number of steps or data (``arrays``, of fixed shapes); small data,
and larger data where the run's estimated work is small, compile with cheap settings
(:mod:`blrppl.compile_mode`)."""


def init_restarts(
    algorithm: InferenceAlgorithm, rng_keys: jax.Array, arrays: Any, *, batched_data: bool = False,
    loop: Optional[tuple[int, Optional[float]]] = None,
) -> BLRState:
    """``init`` of every restart key, stacked (leading axis C).

    With ``batched_data``, ``arrays`` has the same leading axis: restart c
    starts on data set c (see :func:`run_restarts`). ``loop``: ``(num_steps,
    tol)`` of the :func:`run_restarts` that follows, whose loop then compiles
    beside the starts (:mod:`blrppl.blr.ahead`).
    """
    init_args = (algorithm, rng_keys, arrays, batched_data)
    started = None
    if loop is not None:
        threshold, buffer, previous, hits = _restart_loop_inputs(int(jnp.shape(rng_keys)[0]), *loop)

        def chunk_args(states):
            zero = np.asarray(0, np.int32)
            return algorithm, arrays, states, buffer, zero, zero, previous, hits, threshold, batched_data

        with planned_steps(loop[0]):
            started = compile_side_by_side(_init_many, init_args, _run_chunks, chunk_args)
    return started if started is not None else _init_many(*init_args)


def _restart_starts(algorithm, random_algorithm, num_restarts, rng_key, arrays):
    """The starts of ``num_restarts`` restarts of one data set, stacked, batched over restarts
    (traced inside :func:`_init_batched_restarts`): restart 0 is ``algorithm.init(rng_key)``
    (the plain run's start), restart c > 0 ``random_algorithm.init(fold_in(rng_key, c))`` (see
    :mod:`blrppl.blr.restarts`); as :mod:`blrppl.blr.serial_restarts` makes them one by one."""
    keys = folded_keys(rng_key, range(1, num_restarts))
    if algorithm.finish is None:
        first = algorithm.init(rng_key, arrays)
        index = np.arange(1, num_restarts, dtype=np.int32)
        others = _over_restarts(random_algorithm, random_algorithm.init, (0, None, 0), keys, arrays, index)
        return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, others)
    # The starts differ (restart 0: the plain start; the others: random) by a flag, the rest
    # of init not at all: start and finish are each traced once, batched over every restart
    # (the plain start's own copy would double the program: k-means, priors).
    all_keys = jnp.concatenate([rng_key[None], keys])
    moved = np.arange(num_restarts) > 0
    index = np.arange(num_restarts, dtype=np.int32)
    natural, params = _over_restarts(
        algorithm, lambda k, r, c, a: algorithm.start(k, a, r, c), (0, 0, 0, None), all_keys, moved, index, arrays
    )
    return _over_restarts(algorithm, algorithm.finish, (0, 0, 0, None), all_keys, natural, params, arrays)


def last_elbos(algorithm: InferenceAlgorithm, arrays: Any, states: BLRState, num_steps: int, tol: float) -> jax.Array:
    """The ELBO after up to ``num_steps`` steps (stopping by ``tol`` as :func:`run`) from each
    state of ``states`` (stacked on a leading axis): one vmapped loop, to be traced inside a
    compiled caller (no host round trip)."""
    threshold, buffer, previous, hits = _loop_inputs(num_steps, tol)
    start, stop = np.asarray(0, np.int32), np.asarray(num_steps, np.int32)

    def one(state):
        end, _, trace, _, _ = _chunk(algorithm, arrays, _lean(algorithm, state), buffer, start, stop, previous, hits, threshold)
        return trace[end - 1]

    return _over_restarts(algorithm, one, (0,), states)


def take(tree: Any, index: Any, axis: int = 0) -> Any:
    """Row ``index`` of every leaf of ``tree`` along ``axis``, in one compiled call (compiled
    once per tree structure and shapes, whatever the index; cheaply where the tree is small)."""
    return _take(tree, index if isinstance(index, jax.Array) else np.asarray(index, np.int32), axis)


def select_rows(mask: np.ndarray, new: Any, old: Any) -> Any:
    """Row i of every leaf from ``new`` where ``mask[i]``, else from ``old`` (leading axis), in one
    compiled call (once per tree structure and shapes; cheaply where the tree is small)."""
    return _select(np.asarray(mask, bool), new, old)


def _select_rows(mask: jax.Array, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.where(jnp.reshape(mask, mask.shape + (1,) * (a.ndim - 1)), a, b), new, old)


_select = SizeDependentJit(_select_rows, data_argnum=1, one_shot=True)


def _take_rows(tree: Any, index: jax.Array, axis: int) -> Any:
    return jax.tree.map(lambda a: jnp.take(a, index, axis=axis), tree)


_take = SizeDependentJit(_take_rows, data_argnum=0, static_argnums=2, one_shot=True)


def _over_restarts(algorithm: InferenceAlgorithm, fn, in_axes, *xs):
    """``vmap`` of ``fn`` over the restart axis (``in_axes``: 0 or None per
    argument), or ``lax.map`` when the algorithm's factors call LAPACK
    (batched LAPACK calls can deadlock, see :mod:`blrppl.blr.watchdog`)."""
    if not algorithm.sequential:
        return jax.vmap(fn, in_axes=in_axes)(*xs)
    mapped = tuple(x for x, axis in zip(xs, in_axes) if axis is not None)

    def one(args):
        it = iter(args)
        return fn(*[next(it) if axis is not None else x for x, axis in zip(xs, in_axes)])

    return jax.lax.map(one, mapped)


@size_dependent_jit(data_argnum=2, static_argnums=(0, 3), one_shot=True)
def _init_many(algorithm, rng_keys, arrays, batched_data):
    return _over_restarts(algorithm, algorithm.init, (0, 0 if batched_data else None), rng_keys, arrays)


def init_batched_restarts(
    algorithm: InferenceAlgorithm, random_algorithm: InferenceAlgorithm, rng_keys: jax.Array, num_restarts: int,
    arrays: Any, loop: Optional[tuple[int, Optional[float]]] = None,
) -> BLRState:
    """The starts of ``num_restarts`` restarts (:func:`_restart_starts`) of every data set of a
    batch, in one compiled call.

    Data set b (key ``rng_keys[b]``, every leaf of ``arrays`` with the leading
    axis B) gets the C starts that ``run`` with ``num_restarts=C`` makes for it
    alone; the states are stacked data set by data set (row ``b * C + c``: data
    set b, restart c), for :func:`run_restarts` with ``batched_data`` over
    ``repeat_rows(arrays, C)``. ``loop``: as :func:`init_restarts`.
    """
    init_args = (algorithm, random_algorithm, num_restarts, rng_keys, arrays)
    started = None
    if loop is not None:
        threshold, buffer, previous, hits = _restart_loop_inputs(int(jnp.shape(rng_keys)[0]) * num_restarts, *loop)

        def chunk_args(states):
            zero = np.asarray(0, np.int32)
            tiled = jax.eval_shape(functools.partial(_repeat_rows, times=num_restarts), arrays)  # weak types kept
            return algorithm, tiled, states, buffer, zero, zero, previous, hits, threshold, True

        with planned_steps(loop[0]):
            started = compile_side_by_side(_init_batched_restarts, init_args, _run_chunks, chunk_args)
    return started if started is not None else _init_batched_restarts(*init_args)


@size_dependent_jit(data_argnum=4, static_argnums=(0, 1, 2), one_shot=True)
def _init_batched_restarts(algorithm, random_algorithm, num_restarts, rng_keys, arrays):
    def starts(key, data):
        return _restart_starts(algorithm, random_algorithm, num_restarts, key, data)

    states = _over_restarts(algorithm, starts, (0, 0), rng_keys, arrays)
    return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), states)


def repeat_rows(arrays: Any, times: int) -> Any:
    """Every leaf's rows repeated ``times`` times in place (row b -> rows b*times .. b*times+times-1)."""
    return _repeat_rows(arrays, times)


@functools.partial(jax.jit, static_argnums=1)
def _repeat_rows(arrays: Any, times: int) -> Any:
    return jax.tree.map(lambda a: jnp.repeat(a, times, axis=0), arrays)


def run_restarts(
    algorithm: InferenceAlgorithm,
    num_steps: int,
    arrays: Any,
    init_states: BLRState,
    *,
    tol: Optional[float] = None,
    progress_bar: bool = True,
    num_updates: int = 20,
    batched_data: bool = False,
) -> tuple[BLRState, jax.Array, jax.Array]:
    """Run C copies of ``algorithm`` at once: :func:`run` vmapped over restarts.

    Restart c runs from ``init_states[c]`` (a state with a leading axis C,
    each with its own random stream), so restart c equals ``run`` from the
    same start. The loop is the same ``while_loop`` vmapped over the restart
    axis; with ``tol`` each restart stops on its own (the batched loop runs
    until the last one stops, and a stopped restart's state no longer changes).
    With ``batched_data``, every leaf of ``arrays`` has the leading axis C
    too and copy c fits data set c (many data sets in one compiled call).

    Returns:
      ``(states, elbo, num_run, converged)``: the final states (leading axis
      C), the ELBO traces ``(C, num_steps)`` (NaN after a restart stopped),
      the number of steps each restart ran, shape ``(C,)``, and whether
      ``tol`` stopped each, shape ``(C,)``.
    """
    num_steps = _check_steps(num_steps)
    num_restarts = int(jnp.shape(jax.tree.leaves(init_states.step)[0])[0])
    threshold, buffer, previous, hits = _restart_loop_inputs(num_restarts, num_steps, tol)
    states, ends, done = init_states, np.zeros((num_restarts,), np.int32), np.zeros((num_restarts,), bool)
    chunk = num_steps if not progress_bar else -(-num_steps // num_updates)
    bar = tqdm.tqdm(total=num_steps) if progress_bar else None
    end = 0
    for stop in range(chunk, num_steps + chunk, chunk):
        stop = min(stop, num_steps)
        stopped = done
        with planned_steps(num_steps):
            new_ends, states, buffer, previous, hits = _run_chunks(
                algorithm, arrays, states, buffer, np.asarray(end, np.int32), np.asarray(stop, np.int32),
                previous, hits, threshold, batched_data,
            )
        block_until_ready((new_ends, states, previous, hits))
        done = np.asarray(hits) >= stopping.CONFIRMATIONS
        ends = np.where(stopped, ends, np.asarray(new_ends))  # a restart stopped earlier keeps its end
        new_end = int(np.max(ends))
        if bar is not None:
            bar.update(new_end - end)
            bar.set_postfix(elbo=f"{float(np.nanmax(np.asarray(previous))):.6g}")
        end = new_end
        if bool(np.all(done)):
            break
    if bar is not None:
        bar.close()
    return states, to_device(np.asarray(buffer)[:, :end]), to_device(ends), to_device(done)


def _restart_loop_inputs(num_restarts: int, num_steps: int, tol: Optional[float]) -> tuple:
    """:func:`_loop_inputs` for ``num_restarts`` restarts (host arrays: see there)."""
    threshold, buffer, previous, hits = _loop_inputs(num_steps, tol)
    return (
        threshold, np.tile(buffer, (num_restarts, 1)), np.full((num_restarts,), previous),
        np.zeros((num_restarts,), hits.dtype),
    )


@size_dependent_jit(data_argnum=1, static_argnums=(0, 9), loop=lambda args: _costed(args[0]))
def _run_chunks(algorithm, arrays, states, buffers, start, stop, previous, hits, threshold, batched_data):
    """:func:`_run_chunk` vmapped over restarts (shared bounds and tolerance; data shared or batched)."""

    def one(arrays, state, buffer, previous, hits):
        return _chunk(algorithm, arrays, state, buffer, start, stop, previous, hits, threshold)

    in_axes = (0 if batched_data else None, 0, 0, 0, 0)
    return _over_restarts(algorithm, one, in_axes, arrays, states, buffers, previous, hits)
