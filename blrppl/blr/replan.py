"""Plan once, replan compiled: a new data set of the same shapes without tracing the model.

:func:`make_plan` traces the model and analyses every factor on the host,
with numpy on the concrete data: tens of milliseconds per data set, and what
a refit (cross-validation, bootstrap, calibration) pays again and again. The
plan's structure (graph, q, estimators, the analyses' reads) depends on the
data's shapes; only its arrays (:class:`~blrppl.estimators.base.PlanArrays`)
depend on their values. :func:`record_plan` makes the first plan under a
:func:`~blrppl.graph.tape.recording`, so that the data-dependent arithmetic
of the symbolic analysis is on a tape, and returns with the plan (exactly
today's) a :class:`Replanner`: one compiled function from the model's data
arrays to the plan's arrays, and whether

- every value-dependent decision of the first planning holds for the new
  data (a term dropped for a zero coefficient, a ``where`` on data, reads
  merged because their index arrays were equal; index data in range: the
  tape's guards; the positions index data read are themselves replayed), and
- the observations are finite and inside their distributions' supports
  (outside masked positions), as :mod:`blrppl.graph.validate` checks them.

When both hold, :meth:`Replanner.plan_for` returns the plan for the new data
(the reference plan with new arrays and the new arguments); else None, and
the caller plans on the host (which raises the proper ``ModelError`` for bad
data). ``jax.vmap`` of the same function replans a batch of data sets at once
(:mod:`blrppl.engines.batch`).

Two kinds of arrays come from elsewhere than the recorded analyses and are
replayed their own way: a GLM's design matrix and offset (computed by JAX
from the model's code, :mod:`~blrppl.estimators.linear_predictor`) by the
estimator's ``replay``, which also re-runs the checks that accepted the
linear predictor (affinity, elementwise likelihood) on the new data; and the
observations k-means starts from (mixtures, HMMs), re-read from the model
replayed on the new data (:func:`~blrppl.blr.starts.points_reader`). Plans
with missing data imputed as latents, minibatches, data the model needs as
concrete values, a continuous latent's distribution (or one its start reads)
or a point estimate's initial value computed from the data get no replanner
(a discrete chain masked by each sequence's length is replanned: its
distribution enters the fit only through its factors' replayed arrays); analyses that read data values off
the tape get one whose guards fail on data that differ there. Those are
planned on the host every time, as before.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax._src.lax import lax as lax_internal
from numpyro.distributions import constraints

from blrppl.blr.ahead import CompiledInBackground
from blrppl.blr.config import Config
from blrppl.blr.plan import Plan, make_plan
from blrppl.blr.starts import points_reader
from blrppl.compile_mode import SizeDependentJit, resident
from blrppl.graph.concrete import example_latents
from blrppl.graph import tape
from blrppl.graph.data import ModelData, split_model_data
from blrppl.graph.dependencies import output_dependencies
from blrppl.graph.families import base_distribution
from blrppl.graph.replay import replay, run_model, split_latents
from blrppl.symbolic.compiled import Analysis


class Replanner(NamedTuple):
    """A plan's arrays as one compiled function of the model's data (module docstring).

    Attributes:
      plan: the reference plan (planned on the host from the first data).
      replan: ``data arrays -> (replayed leaves, ok)``, jitted (vmap-able).
      compiled: ``replan`` compiled for the reference shapes (in a thread, while
        the first fit runs: :class:`~blrppl.blr.ahead.CompiledInBackground`).
      treedef: the structure of ``(plan.arrays.factors, plan.arrays.starts)``.
      constants: per leaf of it, the reference value where it does not depend
        on the data, else None (the replayed value is used).
      batched: ``data arrays -> (PlanArrays, ok)`` vmapped over a leading
        batch axis of every array (every leaf of the result gets it), jitted.
      reference: the first data's values, copied (:func:`_snapshot`: a numpy array the user
        changes in place is new data), or None where they are too large to compare.
    """

    plan: Plan
    replan: Callable
    compiled: Any
    treedef: Any
    constants: tuple
    batched: Callable
    reference: Optional[tuple] = None

    def arrays_for(self, leaves: list, data_arrays: tuple) -> Any:
        """The plan's :class:`~blrppl.estimators.base.PlanArrays` from replayed leaves."""
        it = iter(leaves)
        merged = [c if c is not None else next(it) for c in self.constants]
        factors, starts = jax.tree_util.tree_unflatten(self.treedef, merged)
        return self.plan.arrays._replace(factors=factors, starts=starts, data=_argument_data(self.plan, data_arrays))

    def plan_for(self, data: ModelData) -> Optional[Plan]:
        """The plan for new data of the reference signature, or None (plan on the host).

        The reference data themselves (equal values) get the reference plan, so
        that two runs on the same data are equal bit for bit (the compiled
        replay may differ from the host's numpy in the last bit).
        """
        same = self.reference is not None and _same_values(self.reference, data.arrays)
        try:  # dispatched first: the host's work below overlaps the device's
            leaves, ok = self.compiled(tuple(data.arrays))
        except (TypeError, ValueError):  # arguments the compiled planner was not built for
            return self.plan if same else None
        if same:
            return self.plan
        plan = self.with_data(self.arrays_for(leaves, data.arrays), data)
        return plan if bool(ok) else None

    def with_data(self, arrays: Any, data: ModelData) -> Plan:
        """The reference plan with new arrays, its graph holding the new arguments."""
        args, kwargs = data.rebuild()
        graph = _replaced(self.plan.graph, model_args=args, model_kwargs=kwargs)
        graph.__dict__["data"] = data
        plan = _replaced(self.plan, graph=graph, arrays=arrays)
        plan.__dict__["signature"] = self.plan.signature  # the same structure, shapes and dtypes
        return plan


def _argument_data(plan: Plan, arrays: Sequence[Any]) -> tuple:
    """The data arrays a compiled fit takes as arguments: None where the plan holds one as a
    constant (``Plan.held_data``), as :func:`~blrppl.graph.concrete.with_held_data` makes them."""
    return tuple(None if i in plan.held_data else a for i, a in enumerate(arrays))


def _replaced(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace(obj, **changes)`` for the plan's frozen dataclasses, without their
    ``__init__`` (a tenth of a small model's replanning): the fields copied, ``changes`` set,
    cached properties left to be computed again."""
    cls = type(obj)
    if hasattr(cls, "__post_init__"):
        return dataclasses.replace(obj, **changes)
    new = object.__new__(cls)
    new.__dict__.update({name: getattr(obj, name) for name in _field_names(cls)}, **changes)
    return new


@functools.cache
def _field_names(cls: type) -> tuple:
    return tuple(field.name for field in dataclasses.fields(cls))


#: Most elements compared on the host to recognise the reference data (larger data are replayed).
SAME_DATA_MAX_SIZE = 1 << 20


def _snapshot(arrays: tuple) -> Optional[tuple]:
    """``arrays`` with every numpy array copied (JAX arrays are immutable), or None beyond
    ``SAME_DATA_MAX_SIZE`` elements: the reference that :func:`_same_values` compares with.
    The plan holds the user's own arrays; one changed in place is not the data it was made from."""
    if sum(np.size(a) for a in arrays) > SAME_DATA_MAX_SIZE:
        return None
    return tuple(a if isinstance(a, jax.Array) else np.array(a, copy=True) for a in arrays)


def _same_values(reference: tuple, arrays: tuple) -> bool:
    """Whether ``arrays`` hold the reference data's values (small, single-device arrays only)."""
    if len(reference) != len(arrays) or sum(np.size(a) for a in arrays) > SAME_DATA_MAX_SIZE:
        return False
    for a, b in zip(reference, arrays):
        if a is b and isinstance(a, jax.Array):
            continue  # immutable: the same values
        if any(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 for x in (a, b)):
            return False  # comparing would gather sharded data onto one device
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            return False
    return True


def record_plan(model: Callable, model_args: tuple, model_kwargs: Mapping[str, Any], config: Config):
    """``make_plan``, and its :class:`Replanner` (None where the plan cannot be replayed).

    The plan is exactly what :func:`~blrppl.blr.plan.make_plan` returns.
    """
    data = split_model_data(model_args, model_kwargs)
    if not data.arrays or config.minibatch:
        # A minibatch plan is never replayed (see _unsupported), and recording it would
        # read its data into numpy: a copy, for arrays that JAX holds apart from numpy.
        return make_plan(model, model_args, model_kwargs, config), None
    try:
        with tape.recording(data.arrays) as rec, warnings.catch_warnings():
            warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
            plan = make_plan(model, model_args, model_kwargs, config)
    except Exception:  # noqa: BLE001 - whatever the recording tripped on, plain planning says it properly
        return make_plan(model, model_args, model_kwargs, config), None
    taped = (plan.arrays.factors, plan.arrays.starts)
    plan = _concrete(plan)
    reason = rec.failed or _unsupported(plan)
    if reason is not None:
        return plan, None
    try:
        replanner = _build(plan, rec, taped, data)
    except Exception:  # noqa: BLE001 - no fast path; the host plan stands
        return plan, None
    return plan, replanner


def _concrete(plan: Plan) -> Plan:
    """The plan with every Dual read as its numpy value (what make_plan computes without a tape)."""
    estimators = tuple(_concrete_estimator(e) for e in plan.estimators)
    starts = tuple(_concrete_estimator(e) for e in plan.start_estimators)
    factors = {f: _strip(a) for f, a in plan.arrays.factors.items()}
    arrays = tape.strip(plan.arrays._replace(factors=factors))
    arrays = arrays._replace(factors=resident(arrays.factors))  # as make_plan's (its Duals were not numpy)
    return dataclasses.replace(plan, estimators=estimators, start_estimators=starts, arrays=arrays)


def _concrete_estimator(est: Any) -> Any:
    arrays = _strip(est.arrays)
    analysis = arrays if est.analysis is est.arrays else _strip(est.analysis)
    delta = None if est.delta is None else _concrete_estimator(est.delta)
    return est._replace(arrays=arrays, analysis=analysis, delta=delta)


def _strip(tree: Any) -> Any:
    """Duals read as numpy values; an analysis's coefficients as the Python floats they are untaped."""
    if not isinstance(tree, Analysis):
        return tape.strip(tree)
    terms = tuple(
        dataclasses.replace(
            t, coeff=float(t.coeff.value) if tape.is_dual(t.coeff) else t.coeff, operand=tape.strip(t.operand),
            reads=tuple(dataclasses.replace(r, index=tuple(_strip_index(i) for i in r.index)) for r in t.reads),
        )
        for t in tree.terms
    )
    return dataclasses.replace(tree, terms=terms)


def _strip_index(index: Any) -> Any:
    """A read's index with a data-computed (leaf) array read as its numpy value."""
    return dataclasses.replace(index, array=tape.strip(index.array)) if tape.is_dual(index.array) else index


def _unsupported(plan: Plan) -> Optional[str]:
    """Why the plan's arrays are not all replayed from the tape, or None."""
    graph = plan.graph
    if plan.data_static or any(e.closed_data for e in plan.estimators):
        return "the model needs concrete data"
    if plan.held_data and any(e.replay is not None for e in plan.estimators):
        return "a linear predictor over data the model needs as values"
    if plan.subsample is not None or plan.imputed or plan.orphans:
        return "minibatches or missing data"
    if any(node.observed_mask is not None for node in graph.variables.values()):
        return "missing data"
    for est in plan.estimators + plan.start_estimators:
        if est.arrays is not None and not isinstance(est.arrays, Analysis) and est.replay is None:
            return f"the estimator of {est.factor!r} reads arrays computed from the data"
    for v, entry in plan.arrays.starts.items():
        if "points" in entry and not points_reader(graph, v, plan.qs[v]).replayable:
            return "k-means starts on observations that are partly missing"
    return None


def _build(plan: Plan, rec: tape.Recording, taped: tuple, data: ModelData) -> Replanner:
    """The compiled replan of ``taped``, the recorded ``(factors, starts)`` of the plan's arrays.

    Each leaf is replayed from the tape (a value the symbolic analysis computed from the
    data), from its estimator's own ``replay`` (a GLM's design matrix), or re-read from the
    observations (k-means points); any other leaf is a constant of the plan.
    """
    replayed = {est.factor: est for est in plan.estimators if est.replay is not None}
    readers = {v: points_reader(plan.graph, v, plan.qs[v]) for v, e in plan.arrays.starts.items() if "points" in e}
    paths, treedef = jax.tree_util.tree_flatten_with_path(taped)
    values = jax.tree_util.tree_leaves((plan.arrays.factors, plan.arrays.starts))
    constants, sources, nodes, avals = [], [], [], []
    for (path, leaf), value in zip(paths, values):
        part, key = path[0].idx, path[1].key
        if part == 0 and key in replayed:
            source = ("estimator", key)
        elif part == 1 and key in readers and path[2].key == "points":
            source = ("points", key)
        elif tape.is_dual(leaf):
            source = ("tape", len(nodes))
            nodes.append(leaf.node)
        else:
            constants.append(leaf)
            continue
        constants.append(None)
        sources.append(source)
        avals.append(jax.typeof(value))
    order = tape.needed(nodes, rec.guards)
    guards = list(rec.guards)
    held = {i: np.array(plan.graph.data.arrays[i], copy=True) for i in plan.held_data}  # (see _snapshot)
    sites = _site_replay(plan, held)

    def replan(arrays):
        taped_values, ok = tape.replay(order, nodes, guards, arrays)
        for i, value in held.items():  # the plan holds them as constants: valid for the same values only
            ok = ok & (jnp.shape(arrays[i]) == value.shape) & jnp.all(arrays[i] == value)
        own = {}
        for f, est in replayed.items():
            out, good = est.replay(arrays)
            own[f], ok = iter(jax.tree_util.tree_leaves(out)), ok & good
        observed = sites(arrays)
        ok = ok & _observations_valid(observed)
        points = {}
        for v, reader in readers.items():
            points[v] = reader.read(lambda node: _observed_value(observed, node))
            ok = ok & jnp.all(jnp.isfinite(points[v]))
        out = []
        for (kind, key), aval in zip(sources, avals):
            value = taped_values[key] if kind == "tape" else next(own[key]) if kind == "estimator" else points[key]
            out.append(lax_internal._convert_element_type(value, aval.dtype, weak_type=aval.weak_type))
        return out, ok

    def full(arrays):
        values, ok = replan(arrays)
        it = iter(values)
        factors, starts = jax.tree_util.tree_unflatten(treedef, [c if c is not None else next(it) for c in constants])
        return plan.arrays._replace(factors=factors, starts=starts, data=_argument_data(plan, arrays)), ok

    fn = SizeDependentJit(replan, data_argnum=0, one_shot=True)  # once per refit, one pass over its data
    reference = tuple(data.arrays)
    compiled = CompiledInBackground(lambda: fn.lower(reference))  # during the first fit (ahead.idle_time)
    return Replanner(plan, fn, compiled, treedef, tuple(constants), jax.jit(jax.vmap(full)), _snapshot(reference))


def _site_replay(plan: Plan, held: Mapping[int, np.ndarray]) -> Callable:
    """``data arrays -> {site: replayed site}``: the model replayed on new data at fixed latents
    (``held``: the values of the arrays the model needs as values, by position).

    Raises:
      ValueError: when a latent's distribution depends on the data (its start
        would be stale).
    """
    graph = plan.graph
    values = {}
    for v, value in example_latents(graph).items():
        values.update(value if isinstance(value, dict) else {v: value})

    def sites(arrays):
        # The arrays the model needs as values are the reference ones (the replan checks them).
        arrays = [held[i] if i in held else a for i, a in enumerate(arrays)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return replay(graph, values, {}, data=arrays)

    owners: list = []  # the latent of each leaf prior_leaves returns

    def prior_leaves(*arrays):
        leaves = [(name, leaf) for name, s in sites(arrays).items() if not s.is_observed and s.fn is not None
                  for leaf in jax.tree.leaves(s.fn)]
        owners[:] = [name for name, _ in leaves]
        return [leaf for _, leaf in leaves]

    deps = output_dependencies(prior_leaves, *graph.data.arrays)
    moved = {owners[k] for k in range(len(deps.outputs)) if deps.inputs_of(k)}  # data inputs, not a scan's tags
    stale = sorted(name for name in moved if _prior_read(plan, name))
    if stale:
        raise ValueError(f"the distribution of latent {stale[0]!r} depends on the data")
    if graph.params:  # point estimates (EM) start from their initial values, which the plan keeps

        def initial_params(*arrays):
            args, kwargs = graph.data.rebuild(arrays)
            trace = run_model(graph.model, args, kwargs, split_latents(graph, values)).trace
            return [trace[name]["value"] for name in graph.params]

        deps = output_dependencies(initial_params, *graph.data.arrays)
        if any(deps.inputs_of(k) for k in range(len(deps.outputs))):
            raise ValueError("a point estimate's initial value depends on the data")
    return sites


def _prior_read(plan: Plan, site: str) -> bool:
    """Whether the plan keeps values read from latent ``site``'s prior distribution, which a
    replay on new data would leave stale: a start from the prior (``"placeholder"``,
    ``"gaussian"``), or, for a continuous site, the prior itself (diagnostics read its spread).

    A discrete site whose start reads no prior (a chain of states with random or k-means
    responsibilities) is free to depend on the data: its distribution enters the fit only
    through its factors, whose arrays are replayed (a mask on each sequence's length, as
    numpyro's ``hmm_enum`` example writes it).
    """
    for v, node in plan.graph.variables.items():
        members = {member.name: member for member in node.members or (node,)}
        chain_sites = node.chain.sites if node.chain is not None else ()
        if site != v and site not in members and site not in chain_sites:
            continue
        member = members.get(site, node)
        return bool(set(plan.arrays.starts.get(v, {})) - {"points"}) or not member.discrete
    return True  # a site the plan does not know: assume the worst


def _observations_valid(sites: Mapping[str, Any]) -> jax.Array:
    """Whether the observations are valid (see :mod:`blrppl.graph.validate`).

    Raises:
      ValueError: where an observation cannot be checked here.
    """
    ok = jnp.asarray(True)
    for site in sites.values():
        if site.is_observed and site.fn is not None:
            ok = ok & _valid(site)
    return ok


def _observed_value(sites: Mapping[str, Any], node: Any) -> jax.Array:
    """A factor's observed value from replayed sites (a loop chain's steps stacked, as traced)."""
    if node.sites:
        return jnp.stack([jnp.asarray(sites[s].value) for s in node.sites])
    return jnp.asarray(sites[node.name].value)


def _valid(site: Any) -> jax.Array:
    fn, value = site.fn, jnp.asarray(site.value)
    if isinstance(base_distribution(fn), dist.Delta):
        raise ValueError("Delta observations are checked on the host")
    batch_ndim = value.ndim - fn.event_dim
    good = jnp.ones(value.shape[:batch_ndim], bool)
    if jnp.issubdtype(value.dtype, jnp.inexact):
        good = good & jnp.all(jnp.isfinite(value).reshape(value.shape[:batch_ndim] + (-1,)), -1)
    support, base = fn.support, fn.support
    while isinstance(base, constraints._IndependentConstraint):
        base = base.base_constraint
    if support is not None and not isinstance(base, (constraints._Dependent, constraints._Real)):
        inside = jnp.asarray(support(value), bool)
        inside = jnp.all(inside.reshape(inside.shape[:batch_ndim] + (-1,)), -1) if inside.ndim > batch_ndim else inside
        good = good & jnp.broadcast_to(inside, good.shape)
    if site.mask is not None:
        good = good | ~jnp.broadcast_to(jnp.asarray(site.mask, bool), good.shape)
    return jnp.all(good)
