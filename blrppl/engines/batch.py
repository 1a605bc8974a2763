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
ELBO trace and stopping step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr import driver
from blrppl.blr.checks import sound_members
from blrppl.blr.restarts import restart_keys
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
            f"entry per data set); got {shapes}; stack the data sets on a new first axis (np.stack), "
            "broadcasting shared arrays (np.broadcast_to(X, (B,) + X.shape))."
        )
    return sizes.pop()


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
    """Data set ``index`` of a batch: every array argument indexed on its first axis."""
    data = split_model_data(model_args, model_kwargs)
    return data.rebuild([np.asarray(a)[index] for a in data.arrays])


def run_batched(
    engine: Any,
    rng_key: jax.Array,
    num_steps: int,
    model_args: tuple,
    model_kwargs: dict,
    *,
    tol: Any = None,
    progress_bar: bool = False,
) -> BatchResult:
    """Fit every data set of a batch with ``engine`` in one compiled, vmapped run."""
    size = batch_size(model_args, model_kwargs)
    plans: list = [None] * size
    fast, stacked = (), None
    first_args, first_kwargs = data_set(model_args, model_kwargs, 0)
    plans[0] = engine.plan(*first_args, **first_kwargs)
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
            args, kwargs = data_set(model_args, model_kwargs, i)
            plans[i] = engine.plan(*args, **kwargs)
    groups: dict = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan.signature, []).append(i)
    keys = restart_keys(rng_key, size)
    results: list = [None] * size
    elbo = np.full((size, 0), np.nan)
    num_run, stopped, failed = np.zeros(size, int), np.zeros(size, bool), np.zeros(size, bool)
    for members in groups.values():
        arrays = stacked if tuple(members) == fast else None
        fits = _run_group(
            engine, [plans[i] for i in members], keys[np.asarray(members)], num_steps, tol, progress_bar, arrays
        )
        for i, (result, trace, steps, stop, fail) in zip(members, fits):
            results[i] = result
            if trace.shape[0] > elbo.shape[1]:
                elbo = np.pad(elbo, ((0, 0), (0, trace.shape[0] - elbo.shape[1])), constant_values=np.nan)
            elbo[i, : trace.shape[0]] = trace
            num_run[i], stopped[i], failed[i] = steps, stop, fail
    return BatchResult(
        results=tuple(results), elbo=jnp.asarray(elbo), num_steps=num_run, stopped=stopped, failed=failed
    )


def _run_group(engine, plans, keys, num_steps, tol, progress_bar, arrays=None) -> list:
    """Data sets whose plans share one signature: one compiled, vmapped run (``arrays``: already stacked)."""
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
    if arrays is None:
        arrays = jax.tree.map(lambda *leaves: jnp.stack([jnp.asarray(x) for x in leaves]), *[p.arrays for p in plans])
    algorithm = engine.build(first)
    states = driver.init_restarts(algorithm, keys, arrays, batched_data=True, loop=(num_steps, tol))
    states, elbo, num_run, stopped = driver.run_restarts(
        algorithm, num_steps, arrays, states, tol=tol, progress_bar=progress_bar, batched_data=True
    )
    out = []
    num_run, stopped = np.asarray(num_run), np.asarray(stopped)
    elbo = np.asarray(elbo)  # read once: per-data-set slices of device arrays would each dispatch (and compile)
    natural = jax.device_get(states.natural)  # every member's λ for the checks, in one transfer
    last = np.where(num_run > 0, elbo[np.arange(len(plans)), np.maximum(num_run - 1, 0)], np.nan)
    sound = sound_members(first.qs, natural, last)
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


@jax.jit
def _row(tree: Any, i: jax.Array) -> Any:
    """Row ``i`` of every leaf: one compiled call per data set, whatever the leaves."""
    return jax.tree.map(lambda a: a[i], tree)
