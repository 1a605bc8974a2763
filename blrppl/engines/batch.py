"""Many data sets in one compiled call (cross-validation, bootstrap, calibration).

Every array argument of the model carries a leading batch axis B. Data set 0
is planned (traced and analysed) on the host; where that plan records a
compiled planner (:mod:`blrppl.blr.replan`), every data set is planned by one
vmapped call of it, and those whose structure would differ (a Bernoulli data
set of all zeros, say, can drop a term) or whose data fail validation are
planned on the host one by one. Data sets whose plans share one signature (the
same structure, shapes and dtypes: usually all of them) have their arrays
stacked, so one compiled loop, :func:`blrppl.blr.driver.run_restarts` with
``batched_data``, fits them all at once, each with its own q, random stream,
ELBO trace and stopping step. Where ``run`` restarts (C starts: discrete
latents by default), every data set's C starts are those of its own ``run``
(:func:`blrppl.blr.driver.init_batched_restarts`) and the B x C fits share the
loop (the data repeated C times); each result is its best restart's. Each
member gets the checks of its own run; one whose fit fails is flagged
(``BatchResult.failed``), not raised, so the others stand.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr import driver
from blrppl.blr.checks import fit_error, sound_members
from blrppl.blr.newton import PLAIN_STEPS_FIRST
from blrppl.blr.restarts import default_restarts, restart_keys
from blrppl.compile_mode import to_device, to_host
from blrppl.errors import ModelError
from blrppl.graph.data import split_model_data
from blrppl.results import BatchResult, BLRResult, Convergence


def batch_size(model_args: tuple, model_kwargs: dict) -> int:
    """The common leading axis of the array arguments.

    Raises:
      ModelError: when there is no array argument or their leading axes differ.
    """
    data = split_model_data(model_args, model_kwargs)
    sizes = {int(np.shape(a)[0]) if np.ndim(a) else None for a in data.arrays}
    if not data.arrays or None in sizes or len(sizes) != 1:
        shapes = ", ".join(f"{name} {shape}" for name, shape in _array_shapes(model_args, model_kwargs)) or "none"
        raise ModelError(
            "run_batched needs every array argument of the model with the same leading batch axis B (one "
            f"entry per data set); got {shapes}; stack the data sets on a new first axis (np.stack), and "
            "name the arguments that every data set shares in shared=(...) (or broadcast them: "
            "np.broadcast_to(X, (B,) + X.shape))."
        )
    return sizes.pop()


def broadcast_shared(model: Callable, model_args: tuple, model_kwargs: dict, shared: Sequence[str]) -> tuple[tuple, dict]:
    """The arguments with those named in ``shared`` (the model's own parameter names, passed
    by position or keyword) broadcast to the batch's leading axis B, read from the others:
    read-only numpy views, each data set reading the same values.

    Raises:
      ModelError: where a name is not an argument of this call, or nothing is left to batch.
    """
    shared = (shared,) if isinstance(shared, str) else tuple(shared)
    if not shared:
        return tuple(model_args), dict(model_kwargs)
    positions = _positional_names(model)
    args, kwargs = list(model_args), dict(model_kwargs)
    where = {}
    for name in shared:
        if name in kwargs:
            where[name] = name
        elif name in positions and positions.index(name) < len(args):
            where[name] = positions.index(name)
        else:
            given = [positions[i] if i < len(positions) else f"argument {i}" for i in range(len(args))] + list(kwargs)
            raise ModelError(
                f"shared names {name!r}, which is not an argument of this call of the model (its arguments: "
                f"{', '.join(map(str, given)) or 'none'}); name the model's own parameters, as in its signature."
            )
    rest_args = tuple(None if i in where.values() else a for i, a in enumerate(args))
    rest_kwargs = {k: v for k, v in kwargs.items() if k not in where.values()}
    size = batch_size(rest_args, rest_kwargs)

    def broadcast(leaf: Any) -> Any:
        if isinstance(leaf, (np.ndarray, jax.Array)):
            return np.broadcast_to(np.asarray(leaf), (size,) + np.shape(leaf))
        return leaf

    for place in where.values():
        if isinstance(place, str):
            kwargs[place] = jax.tree.map(broadcast, kwargs[place])
        else:
            args[place] = jax.tree.map(broadcast, args[place])
    return tuple(args), kwargs


def _positional_names(model: Callable) -> list[str]:
    """The names of the model's parameters that can be passed by position, in order."""
    try:
        parameters = inspect.signature(model).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: keywords only
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in kinds]


def _array_shapes(model_args: tuple, model_kwargs: dict) -> list[tuple[str, tuple]]:
    """(argument, shape) of every array among the model's arguments, as ``split_model_data`` finds them."""
    leaves = jax.tree_util.tree_flatten_with_path((tuple(model_args), dict(model_kwargs)))[0]
    out = []
    for path, leaf in leaves:
        if isinstance(leaf, (np.ndarray, jax.Array)):
            head = f"argument {path[1].idx}" if path[0].idx == 0 else str(path[1].key)
            out.append((head + jax.tree_util.keystr(path[2:]), tuple(np.shape(leaf))))
    return out


def data_set(model_args: tuple, model_kwargs: dict, index: int) -> tuple[tuple, dict]:
    """Data set ``index`` of a batch: every array argument indexed on its first axis (a row of a
    (B,) argument stays a 0-d array, not a numpy scalar, which a plan would take as a constant), a
    JAX array's row a JAX array (transferred: nothing compiles), as the model may need it to be
    (``y[idx]`` with a plate's traced indices)."""
    data = split_model_data(model_args, model_kwargs)
    rows = [np.asarray(np.asarray(a)[index]) for a in data.arrays]
    return data.rebuild([to_device(r) if isinstance(a, jax.Array) else r for a, r in zip(data.arrays, rows)])


def run_batched(
    engine: Any,
    rng_key: jax.Array,
    num_steps: int,
    model_args: tuple,
    model_kwargs: dict,
    *,
    tol: Any = None,
    progress_bar: bool = False,
    num_restarts: Optional[int] = None,
    shared: Sequence[str] = (),
) -> BatchResult:
    """Fit every data set of a batch with ``engine`` in one compiled, vmapped run (``num_restarts``:
    as ``run``'s, each data set's restarts in the same run; None: ``run``'s default; ``shared``:
    arguments every data set shares, without the batch axis, :func:`broadcast_shared`)."""
    if num_restarts is not None and (int(num_restarts) != num_restarts or num_restarts < 1):
        raise ValueError(f"num_restarts must be a positive integer, got {num_restarts}.")
    model_args, model_kwargs = broadcast_shared(engine.model, model_args, model_kwargs, shared)
    size = batch_size(model_args, model_kwargs)
    plans: list = [None] * size
    fast, stacked = (), None
    first_args, first_kwargs = data_set(model_args, model_kwargs, 0)
    plans[0] = _member_plan(engine, 0, first_args, first_kwargs)
    replanner = engine.replanner(*first_args, **first_kwargs)
    if replanner is not None:  # every data set replanned in one compiled, vmapped call
        batch = split_model_data(model_args, model_kwargs)
        arrays, ok = replanner.batched(tuple(batch.arrays))
        ok = np.asarray(ok)
        members = np.flatnonzero(ok)
        if len(members) < size:
            arrays = jax.tree.map(lambda a: a[members], arrays)
        rows = jax.tree.map(np.asarray, arrays)
        host = tuple(np.asarray(a) for a in batch.arrays)
        for row, i in enumerate(members):
            data = batch._replace(arrays=tuple(a[i] for a in host))
            plans[i] = replanner.with_data(jax.tree.map(lambda a, row=row: a[row], rows), data)
        fast, stacked = tuple(int(i) for i in members), arrays
    for i in range(size):
        if plans[i] is None:  # planned on the host: its structure differs, or its data are invalid
            plans[i] = _member_plan(engine, i, *data_set(model_args, model_kwargs, i))
    groups: dict = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan.signature, []).append(i)
    keys = restart_keys(rng_key, size)
    results: list = [None] * size
    elbo = np.full((size, 0), np.nan)
    num_run, stopped, failed = np.zeros(size, int), np.zeros(size, bool), np.zeros(size, bool)
    for members in groups.values():
        arrays = stacked if tuple(members) == fast else None
        group = [plans[i] for i in members]
        restarts = default_restarts(group[0]) if num_restarts is None else int(num_restarts)
        run_group = _run_group if restarts == 1 else functools.partial(_run_group_with_restarts, num_restarts=restarts)
        fits = run_group(engine, group, keys[np.asarray(members)], num_steps, tol, progress_bar, arrays)
        for i, (result, trace, steps, stop, fail) in zip(members, fits):
            results[i] = result
            if trace.shape[0] > elbo.shape[1]:
                elbo = np.pad(elbo, ((0, 0), (0, trace.shape[0] - elbo.shape[1])), constant_values=np.nan)
            elbo[i, : trace.shape[0]] = trace
            num_run[i], stopped[i], failed[i] = steps, stop, fail
    return BatchResult(
        results=tuple(results), elbo=jnp.asarray(elbo), num_steps=num_run, stopped=stopped, failed=failed
    )


def _member_plan(engine: Any, index: int, args: tuple, kwargs: dict) -> Any:
    """Data set ``index``'s plan; its data's errors name it (the other data sets may be fine)."""
    try:
        return engine.plan(*args, **kwargs)
    except ModelError as error:
        raise ModelError(f"data set {index} of the batch: {error}") from error


def _batchable(plans: list) -> None:
    """Raise where the plans' data cannot be arguments of one batched program."""
    first = plans[0]
    if first.data_static or any(est.closed_data for est in first.estimators):
        raise ModelError(
            f"site {next(iter(first.qs), 'model')!r}: the model needs concrete data values while it runs, so "
            "its data are constants of the compiled fit and cannot be batched; fit the data sets one by one."
        )
    if first.subsample is not None:
        raise ModelError(
            f"site {first.subsample.plate.name!r}: minibatch fits cannot be batched over data sets; fit them one by one."
        )


def _stacked(plans: list, arrays: Any) -> Any:
    """The plans' arrays stacked on a leading axis on the host and transferred (nothing compiles),
    strongly typed as the compiled planner's batch is (stacked Python floats were weakly typed, and
    the batched fit compiled again)."""
    if arrays is None:
        arrays = jax.tree.map(lambda *leaves: to_device(np.stack([np.asarray(x) for x in leaves])), *[p.arrays for p in plans])
    return arrays


def _run_group(engine, plans, keys, num_steps, tol, progress_bar, arrays=None) -> list:
    """Data sets whose plans share one signature: one compiled, vmapped run (``arrays``: already stacked)."""
    _batchable(plans)
    first, arrays = plans[0], _stacked(plans, arrays)
    algorithm = engine.build(first)
    # As ``run``: Newton candidates only for the data sets whose plain steps did not converge.
    tiered = algorithm.newton and num_steps > PLAIN_STEPS_FIRST
    plain = engine.build(first, newton=False) if tiered else algorithm
    steps = PLAIN_STEPS_FIRST if tiered else num_steps
    states = driver.init_restarts(plain, keys, arrays, batched_data=True, loop=(steps, tol))
    states, elbo, num_run, stopped = driver.run_restarts(
        plain, steps, arrays, states, tol=tol, progress_bar=progress_bar, batched_data=True
    )
    num_run, stopped = np.asarray(num_run), np.asarray(stopped)
    elbo = np.asarray(elbo)  # read once: per-data-set slices of device arrays would each dispatch (and compile)
    if tiered:
        states, elbo, num_run, stopped = _with_newton(
            algorithm, num_steps - steps, arrays, states, elbo, num_run, stopped, tol, progress_bar
        )
    out = []
    natural = to_host(states.natural)  # every member's λ for the checks, in one transfer
    last = np.where(num_run > 0, elbo[np.arange(len(plans)), np.maximum(num_run - 1, 0)], np.nan)
    scales = None if states.elbo_scale is None else np.asarray(states.elbo_scale)
    sound = sound_members(first.qs, natural, last, scales, _peaks(elbo))
    for i, plan in enumerate(plans):
        n = int(num_run[i])
        state = _row(states, i)
        member = None if sound[i] else jax.tree.map(lambda a, i=i: a[i], natural)  # may have failed: checked
        flags, failed = engine.batch_member_flags(plan, state, elbo[i, :n], bool(stopped[i]), algorithm.noisy, member)
        result = BLRResult(
            plan=plan,
            state=state,
            elbo=elbo[i, :n],
            mode=engine.mode,
            convergence=Convergence.of(bool(stopped[i]), tol, n, algorithm.noisy, algorithm.exact, elbo.dtype),
            flags=flags,
        )
        out.append((result, elbo[i], n, bool(stopped[i]), failed))
    return out


def _peaks(elbo: np.ndarray) -> np.ndarray:
    """Each trace's highest finite ELBO (-inf where none)."""
    return np.max(np.where(np.isfinite(elbo), elbo, -np.inf), axis=1, initial=-np.inf)


def _with_newton(algorithm, num_steps, arrays, states, elbo, num_run, stopped, tol, progress_bar) -> tuple:
    """The data sets that ``PLAIN_STEPS_FIRST`` plain steps did not converge (and that ran), continued
    with ``algorithm``'s Newton candidates for up to ``num_steps`` more, as ``Engine.fit`` continues a
    single fit: their states, ELBO traces (joined), steps and stops; the others' unchanged."""
    going = ~stopped & (num_run > 0)
    if not going.any():
        return states, elbo, num_run, stopped
    more, more_elbo, more_run, more_stopped = driver.run_restarts(
        algorithm, num_steps, arrays, states, tol=tol, progress_bar=progress_bar, batched_data=True
    )
    more_elbo, more_run = np.asarray(more_elbo), np.where(going, np.asarray(more_run), 0)
    more_elbo = more_elbo if more_elbo.shape[1] else np.full((len(more_elbo), 1), np.nan, elbo.dtype)
    total = num_run + more_run
    length = max(elbo.shape[1], int(total.max()))
    steps = np.arange(length)[None, :]
    first, later = steps < num_run[:, None], steps - num_run[:, None]  # step t of the joined trace
    padded = np.pad(elbo, ((0, 0), (0, length - elbo.shape[1])), constant_values=np.nan)
    after = np.take_along_axis(more_elbo, np.clip(later, 0, more_elbo.shape[1] - 1), axis=1)
    joined = np.where(first, padded, np.where((later >= 0) & (later < more_run[:, None]), after, np.nan))
    states = driver.select_rows(going, more, states)
    return states, joined, total, np.where(going, np.asarray(more_stopped), stopped)


def _run_group_with_restarts(engine, plans, keys, num_steps, tol, progress_bar, arrays=None, *, num_restarts) -> list:
    """:func:`_run_group` with ``num_restarts`` restarts per data set, all in one vmapped run:
    data set b's restarts are ``run``'s for it alone (same keys and starts), and its result is
    the best of them, with every restart in ``restarts`` (as ``run`` with ``num_restarts``)."""
    _batchable(plans)
    first, arrays = plans[0], _stacked(plans, arrays)
    algorithm, count = engine.build(first), num_restarts
    states = driver.init_batched_restarts(
        algorithm, engine.build(first, random_starts=True), keys, count, arrays, loop=(num_steps, tol)
    )
    states, elbo, num_run, stopped = driver.run_restarts(
        algorithm, num_steps, driver.repeat_rows(arrays, count), states, tol=tol, progress_bar=progress_bar,
        batched_data=True,
    )
    elbo, num_run, stopped = np.asarray(elbo), np.asarray(num_run), np.asarray(stopped)  # one read each
    natural = to_host(states.natural)
    last = np.where(num_run > 0, elbo[np.arange(len(num_run)), np.maximum(num_run - 1, 0)], np.nan)
    scales = None if states.elbo_scale is None else np.asarray(states.elbo_scale)
    sound = sound_members(first.qs, natural, last, scales, _peaks(elbo))
    out = []
    for b, plan in enumerate(plans):
        rows = slice(b * count, (b + 1) * count)
        restarts = _rows(states, np.asarray(b * count, np.int32), count)
        chosen = {}

        def checks(index, state, trace, stop, rows=rows, chosen=chosen):
            chosen["row"] = best = rows.start + index
            member = None if sound[best] else jax.tree.map(lambda a: a[best], natural)
            flags, chosen["failed"] = engine.batch_member_flags(plan, state, trace, stop, algorithm.noisy, member)
            return flags

        traces = elbo[rows, : int(num_run[rows].max())]  # as run's: up to the longest restart
        result = engine.best_of_restarts(plan, restarts, traces, num_run[rows], stopped[rows], tol, checks)
        if result is None:  # every restart diverged: the data set's fit failed
            trace = elbo[rows.start, : num_run[rows.start]]
            error = fit_error(
                plan.qs, jax.tree.map(lambda a: a[rows.start], natural), trace, algorithm.exact, algorithm.exact_targets
            )
            message = "this data set's fit failed: every restart diverged (q or its ELBO not finite)" + (
                f"; the first: {error}" if error is not None else ""
            )
            result = BLRResult(plan=plan, state=driver.take(restarts, 0), elbo=trace, mode=engine.mode, flags=(message,))
            out.append((result, elbo[rows.start], int(num_run[rows.start]), bool(stopped[rows.start]), True))
            continue
        best = chosen["row"]
        out.append((result, elbo[best], int(num_run[best]), bool(stopped[best]), chosen["failed"]))
    return out


@functools.partial(jax.jit, static_argnums=2)
def _rows(tree: Any, start: jax.Array, count: int) -> Any:
    """Rows ``start .. start + count - 1`` of every leaf: one compiled call per data set."""
    return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, count), tree)


@jax.jit
def _row(tree: Any, i: jax.Array) -> Any:
    """Row ``i`` of every leaf: one compiled call per data set, whatever the leaves."""
    return jax.tree.map(lambda a: a[i], tree)
