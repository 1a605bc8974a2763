"""Re-running a traced model at given latent values: the bridge to the estimators.

:func:`replay` runs the model under ``handlers.substitute`` (latent values,
``numpyro.param`` values and subsample indices), ``handlers.seed(rng_seed=0)``
and :func:`~blrppl.graph.capture.capturing_constructors`, and returns every
sample site's value, distribution, constructor call, scale, mask and plates.
It is a pure function of the arrays it is given, so estimators call it under
``jax.make_jaxpr``, ``jax.grad`` or ``jax.jit``.

A chain variable's value is the joined chain; :func:`split_latents` cuts it
back into the numpyro sites it came from (an initial state and the stacked
states of a ``scan``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.distribution import validation_enabled
from numpyro.distributions.transforms import biject_to

from blrppl.compile_mode import to_device
from blrppl.errors import site_error
from blrppl.graph.capture import ConstructorCall, capturing_constructors, constructor_call
from blrppl.graph.data import ModelData, split_model_data  # noqa: F401 - re-exported
from blrppl.graph.jaxpr import call_body, open_jaxpr, returns_operand, walk
from blrppl.graph.plates import site_plates

if TYPE_CHECKING:
    from blrppl.graph.nodes import FactorGraph


class ReplayedSite(NamedTuple):
    """One site of a model re-run at given values.

    Attributes:
        name: the site name.
        type: ``"sample"`` or ``"deterministic"``.
        value: the site's value (for a latent site, the value substituted).
        fn: the site's numpyro distribution, with the plate expansion numpyro
            applies (None for deterministic sites).
        call: the distribution's constructor call as the model wrote it
            (:func:`~blrppl.graph.capture.constructor_call`; None for
            deterministic sites).
        is_observed: True for observed sites (``obs=``, ``condition``,
            ``numpyro.factor``) and for sites the user fixed with ``substitute``.
        scale: the log-density scale (``handlers.scale`` times N / M of
            subsampled plates), or None for 1.
        mask: the site's effective mask, broadcast to ``fn.batch_shape``
            (``handlers.mask``, ``.mask()``, ``obs_mask``), or None.
            ``fn.log_prob`` already applies it.
        cond_indep_stack: numpyro's plate frames, innermost first.
        plates: plate names, outermost first.
        infer: the site's ``infer`` dict.
    """

    name: str
    type: str
    value: Any
    fn: Any
    call: Optional[ConstructorCall]
    is_observed: bool
    scale: Any
    mask: Any
    cond_indep_stack: tuple
    plates: tuple[str, ...]
    infer: dict


class ModelRun(NamedTuple):
    """One run of a model: numpyro's trace and the sites the user's ``substitute`` fixed."""

    trace: "OrderedDict[str, dict]"
    user_fixed: frozenset


def run_model(
    model: Callable,
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    data: Optional[Mapping[str, Any]] = None,
    *,
    placeholders: bool = False,
    validate: bool = False,
    needed: frozenset = frozenset(),
) -> ModelRun:
    """Run ``model`` once under ``seed(0)`` and ``trace``, capturing constructor calls.

    Args:
        model, model_args, model_kwargs: the model and its arguments.
        data: site, ``numpyro.param`` and plate names -> values to substitute
            (observed sites are never overridden).
        placeholders: latent sites not in ``data`` take a fixed point of their
            support (zero on the real line, one on the positive reals, the
            centre of the simplex, ...) instead of a random draw, and
            subsampled plates take their first M indices, so tracing never
            compiles a sampler.
        validate: keep numpyro's argument validation on (the first trace of
            the user's model, for numpyro's own messages); the analysis and
            the compiled steps re-run the model with it off, since it
            evaluates every constructor's constraints eagerly (about a third
            of the planning time).
        needed: the only sites the caller reads: the run stops at the first
            message after all of them are recorded (see :func:`replay`).

    Returns:
        The trace and the names of latent-looking sites whose value the
        user's own ``handlers.substitute`` had already set.
    """
    data = dict(data or {})
    fixed: set[str] = set()

    def substitute_fn(msg: dict) -> Any:
        name, kind = msg.get("name"), msg["type"]
        if kind == "sample" and not msg["is_observed"] and msg["value"] is not None:
            if "_scan_current_index" not in msg.get("infer", {}):
                fixed.add(name)  # set below us: by the user's substitute
            return None
        if kind in ("sample", "param", "plate") and name in data:
            return None if kind == "sample" and msg["is_observed"] else data[name]
        if placeholders and kind == "sample" and not msg["is_observed"]:
            _refuse_improper(msg)
            return placeholder(msg)
        if placeholders and kind == "plate" and msg["value"] is None:
            return jnp.arange(msg["args"][1])  # the first minibatch, not a random one
        return None

    with capturing_constructors(), validation_enabled(validate):
        with handlers.trace() as trace, handlers.seed(rng_seed=_seed_zero()):
            with handlers.substitute(substitute_fn=substitute_fn), _StopAfter(needed, trace):
                try:
                    model(*model_args, **model_kwargs)
                except _Enough:
                    pass
    return ModelRun(trace, frozenset(fixed))


class _Enough(BaseException):
    """Raised inside a replay once every needed site is recorded: the model's later code is not run.
    (A BaseException, as ``GeneratorExit``: a model's own ``except Exception`` does not swallow it.)"""


class _StopAfter(numpyro.primitives.Messenger):
    """Ends the model's run at the last of the ``needed`` sites, once ``trace`` holds them all.

    Entered inside ``handlers.trace``: numpyro post-processes a message from the outermost
    handler in, so the trace has recorded the site when this handler sees it.
    """

    def __init__(self, needed: frozenset, trace: Mapping[str, Any]):
        super().__init__()
        self.needed, self.trace = needed, trace

    def postprocess_message(self, msg: dict) -> None:
        if self.needed and msg.get("name") in self.needed and self.needed.issubset(self.trace):
            raise _Enough


def _seed_zero() -> Any:
    """``rng_seed=0`` for ``handlers.seed``: with JAX's default PRNG the raw key ``PRNGKey(0)``
    as the numpy array it equals, which compiles no seeding program (numpyro seeds an int
    eagerly: a one-operation compilation, 35-45 ms, in every process's first trace)."""
    if jax.config.jax_default_prng_impl == "threefry2x32" and not jax.config.jax_enable_custom_prng:
        return np.zeros(2, np.uint32)
    return 0


def run_model_compiled(
    model: Callable,
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    data: Optional[Mapping[str, Any]] = None,
    *,
    placeholders: bool = False,
    validate: bool = False,
) -> ModelRun:
    """:func:`run_model` with the model's array code run as one compiled program.

    For data too large to copy: eager JAX runs each operation on its own, and
    an eager ``X[idx]`` holds the gathered rows twice (JAX ends advanced
    indexing with an identity ``broadcast_in_dim``, a copy when run eagerly),
    so a model run at all N rows of a minibatch plate peaks at three times
    its data. Compiled, they would still be a temporary of the program, so the
    program skips the equations that return their operand unchanged
    (:func:`_without_copies`). The model is traced once with its arrays as
    arguments; the trace's traced leaves (site values, distribution
    parameters) are the program's outputs and are put back into the trace,
    whose distributions are rebuilt from their leaves (numpyro pytrees). What
    cannot be (a leaf that is not an array, a distribution that is not a
    pytree) falls back to :func:`run_model`.
    """
    model_data = split_model_data(model_args, dict(model_kwargs))
    box: dict = {}

    def traced(arrays: tuple) -> list:
        args, kwargs = model_data.rebuild(arrays)
        run = run_model(model, args, kwargs, data, placeholders=placeholders, validate=validate)
        leaves, treedef = jax.tree_util.tree_flatten(run.trace)
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)]
        box.update(leaves=leaves, treedef=treedef, positions=positions, fixed=run.user_fixed)
        return [leaves[i] for i in positions]

    try:
        closed = jax.make_jaxpr(traced)(model_data.arrays)
        outputs = jax.jit(_without_copies(closed))(*model_data.arrays)
        leaves = list(box["leaves"])
        for i, value in zip(box["positions"], outputs):
            leaves[i] = value
        trace = jax.tree_util.tree_unflatten(box["treedef"], leaves)
    except Exception:  # noqa: BLE001 - the eager run says what is wrong, or works where this cannot
        return run_model(model, model_args, model_kwargs, data, placeholders=placeholders, validate=validate)
    return ModelRun(OrderedDict(trace), box["fixed"])


MAX_FOLDED_INDICES = 1 << 26
"""Index arrays (integer or boolean) up to this many elements are computed while tracing."""


def _without_copies(closed: Any) -> Callable:
    """A function evaluating ``closed`` without its equations that return their operand.

    Index arithmetic that depends on no input (``iota``, index normalisation)
    is computed while tracing, so that a gather at ``arange(N)`` is seen for
    what it is (:func:`~blrppl.graph.jaxpr.returns_operand`) and skipped,
    like a broadcast to the operand's own shape; call-like equations are
    entered. Everything else is staged as it is.
    """

    def apply(eqn: Any, invals: list) -> list:
        name = eqn.primitive.name
        concrete = not any(isinstance(v, jax.core.Tracer) for v in invals) and not eqn.effects
        if name == "gather" and not isinstance(invals[1], jax.core.Tracer) and returns_operand(eqn, invals[1]):
            return [invals[0]]
        if name == "broadcast_in_dim" and returns_operand(eqn):
            return [invals[0]]
        body = call_body(eqn)
        if body is not None and not concrete:
            return walk(*open_jaxpr(body), invals, apply)
        params = eqn.primitive.get_bind_params(eqn.params)
        indices = all(
            jnp.issubdtype(v.aval.dtype, jnp.integer) or v.aval.dtype == jnp.bool_ for v in eqn.outvars
        ) and sum(np.prod(v.aval.shape, dtype=np.int64) for v in eqn.outvars) <= MAX_FOLDED_INDICES
        if concrete and indices:
            with jax.ensure_compile_time_eval():
                out = eqn.primitive.bind(*invals, **params)
        else:
            out = eqn.primitive.bind(*invals, **params)
        return list(out) if eqn.primitive.multiple_results else [out]

    return lambda *args: walk(closed.jaxpr, closed.consts, args, apply)


def _refuse_improper(msg: Mapping[str, Any]) -> None:
    """A latent with an improper prior (``ImproperUniform``) has no q to start from."""
    fn = msg["fn"]
    while True:
        if isinstance(fn, dist.ImproperUniform):
            raise site_error(
                msg["name"],
                "an ImproperUniform prior has no normalised density (no exponential-family q, no start, "
                "no ELBO)",
                "give the site a proper prior (a broad one such as Normal(0, 100) or HalfNormal(100)), "
                "or make it a numpyro.param (a point estimate, fitted by EM)",
            )
        fn = getattr(fn, "base_dist", None)
        if fn is None:
            return


def placeholder(msg: Mapping[str, Any]) -> Any:
    """A fixed value in the support of a latent site, or None to let the sampler draw."""
    fn = msg["fn"]
    sample_shape = tuple(msg["kwargs"].get("sample_shape", ()))
    try:
        out = jax.eval_shape(
            lambda key: fn.sample(key, sample_shape), jax.ShapeDtypeStruct((2,), jnp.uint32)
        )
        value = support_point(fn.support, out.shape)
        if value is None:
            transform = biject_to(fn.support)
            return jnp.asarray(transform(jnp.zeros(transform.inverse_shape(out.shape))), out.dtype)
        return to_device(np.asarray(value).astype(out.dtype))
    except Exception:  # an exotic support or sampler: let the seeded sampler draw a value
        return None


def support_point(support: Any, shape: tuple) -> Optional[np.ndarray]:
    """A point of ``support`` with the given shape, in numpy (no compilation), or None."""
    while isinstance(support, constraints._IndependentConstraint):
        support = support.base_constraint
    c = constraints
    if isinstance(support, (c._Real, c._Boolean)):
        return np.zeros(shape)
    if isinstance(support, (c._IntegerInterval, c._IntegerGreaterThan)):
        return np.broadcast_to(np.asarray(support.lower_bound), shape)
    if isinstance(support, c._Positive) or support is c.nonnegative:
        return np.ones(shape)
    if isinstance(support, c._UnitInterval):
        return np.full(shape, 0.5)
    if isinstance(support, c._Simplex):
        return np.full(shape, 1.0 / shape[-1])
    if isinstance(support, (c._PositiveDefinite, c._LowerCholesky, c._CorrCholesky, c._CorrMatrix)):
        return np.broadcast_to(np.eye(shape[-1]), shape)
    if isinstance(support, c._Interval):
        return np.broadcast_to(
            (np.asarray(support.lower_bound) + np.asarray(support.upper_bound)) / 2, shape
        )
    if isinstance(support, c._GreaterThan):
        return np.broadcast_to(np.asarray(support.lower_bound) + 1.0, shape)
    return None


def effective_mask(site: Mapping[str, Any]) -> Any:
    """A sample site's mask (``handlers.mask`` and ``.mask()`` wrappers), or None.

    Masks of ``MaskedDistribution`` wrappers below ``Independent`` act on event
    dimensions and are not included.
    """
    masks = [] if site.get("mask") is None else [site["mask"]]
    fn = site["fn"]
    while isinstance(fn, (dist.MaskedDistribution, dist.ExpandedDistribution)):
        if isinstance(fn, dist.MaskedDistribution) and fn._mask is not None:
            masks.append(fn._mask)
        fn = fn.base_dist
    if not masks:
        return None
    mask = masks[0]
    for m in masks[1:]:
        mask = jnp.logical_and(mask, m)
    return jnp.broadcast_to(jnp.asarray(mask, dtype=bool), site["fn"].batch_shape)


def effective_scale(site: Mapping[str, Any]) -> Any:
    """A sample site's log-density scale, or None when it is 1."""
    scale = site.get("scale")
    if scale is None:
        return None
    if isinstance(scale, (int, float)) and scale == 1:
        return None
    return scale


def to_replayed(site: Mapping[str, Any], is_latent: bool = True) -> ReplayedSite:
    """A numpyro trace entry as a :class:`ReplayedSite` (``is_latent``: a latent of the graph)."""
    if site["type"] == "deterministic":
        return ReplayedSite(
            name=site["name"],
            type="deterministic",
            value=site["value"],
            fn=None,
            call=None,
            is_observed=False,
            scale=None,
            mask=None,
            cond_indep_stack=tuple(site.get("cond_indep_stack", ())),
            plates=site_plates(site),
            infer=dict(site.get("infer") or {}),
        )
    return ReplayedSite(
        name=site["name"],
        type="sample",
        value=site["value"],
        fn=site["fn"],
        call=constructor_call(site["fn"]),
        is_observed=not is_latent,
        scale=effective_scale(site),
        mask=effective_mask(site),
        cond_indep_stack=tuple(site["cond_indep_stack"]),
        plates=site_plates(site),
        infer=dict(site.get("infer") or {}),
    )


def split_latents(graph: "FactorGraph", latent_values: Mapping[str, Any]) -> dict[str, Any]:
    """Variable values -> numpyro site values (chains cut back into their sites)."""
    data: dict[str, Any] = {}
    for name, value in latent_values.items():
        node = graph.variables.get(name)
        chain = None if node is None else node.chain
        if chain is None:
            data[name] = value
        else:
            data.update(split_chain(value, chain))
    return data


def split_chain(value: Any, chain: Any) -> dict[str, Any]:
    """A chain variable's value (batch, time, state) -> its sites' values.

    A Python-loop chain gives one site per time step; a scan chain its
    initial state (if it has one) and the stacked states, time moved back to
    the site's ``time_axis``.
    """
    axis = len(chain.batch_shape)
    leading = jnp.ndim(value) - len(chain.shape)  # leading sample axes (vmapped callers have none)
    axis += leading
    if chain.kind == "markov":
        return {site: jnp.take(value, t, axis=axis) for t, site in enumerate(chain.sites)}
    out = {}
    if len(chain.sites) > 1:
        out[chain.sites[0]] = jnp.take(value, 0, axis=axis)
        value = jax.lax.slice_in_dim(value, 1, jnp.shape(value)[axis], axis=axis)
    out[chain.sites[-1]] = jnp.moveaxis(value, axis, leading + chain.time_axis)
    return out


def join_chain(values: Mapping[str, Any], chain: Any) -> Any:
    """The chain variable's value (batch, time, state) from its sites' values.

    Concrete values (planning's examples) are joined in numpy: eagerly, each ``jnp``
    operation would compile a program of its own (a scan HMM's plan compiled three).
    """
    sites = [values[site] for site in chain.sites]
    if any(isinstance(v, jax.core.Tracer) for v in sites):
        return _join_chain(jnp, sites, chain)
    return to_device(_join_chain(np, [np.asarray(v) for v in sites], chain))


def _join_chain(xp: Any, sites: list, chain: Any) -> Any:
    axis = len(chain.batch_shape)
    if chain.kind == "markov":
        return xp.stack([xp.asarray(v) for v in sites], axis=axis)
    rest = xp.moveaxis(xp.asarray(sites[-1]), chain.time_axis, axis)
    if len(sites) == 1:
        return rest
    return xp.concatenate([xp.expand_dims(xp.asarray(sites[0]), axis), rest], axis=axis)


def replay(
    graph: "FactorGraph",
    latent_values: Mapping[str, Any],
    param_values: Optional[Mapping[str, Any]] = None,
    plate_indices: Optional[Mapping[str, Any]] = None,
    *,
    deterministic: bool = False,
    data: Optional[Sequence[Any]] = None,
    sites: Sequence[str] = (),
) -> dict[str, ReplayedSite]:
    """Re-run ``graph``'s model at the given values; every sample site, in trace order.

    Args:
        graph: a traced :class:`~blrppl.graph.nodes.FactorGraph`.
        latent_values: variable name -> value in the site's own support (a
            chain variable's joined chain). Variables left out are drawn from
            their priors with ``rng_seed=0``.
        param_values: ``numpyro.param`` name -> constrained value; missing
            params keep their initial values.
        plate_indices: subsampled plate name -> minibatch indices (length M).
        deterministic: also return ``numpyro.deterministic`` sites (with
            ``fn`` and ``call`` None).
        data: the model's array arguments (``ModelData.arrays`` of
            ``graph.data``) to run with instead of the traced ones, so that
            compiled code takes the data as arguments.
        sites: the sites the caller reads, if only some: the model's code after
            the last of them is not run (a prior's log density traces no
            likelihood: its operations, dead code, cost tracing, lowering and
            the symbolic analysis' walk all the same). The others may be missing.

    Returns:
        Site name -> :class:`ReplayedSite`. Sites hidden by ``handlers.block``
        are not visible.
    """
    values = split_latents(graph, latent_values)
    values.update(param_values or {})
    values.update(plate_indices or {})
    if data is None:
        model_args, model_kwargs = graph.model_args, graph.model_kwargs
    else:
        model_args, model_kwargs = graph.data.rebuild(data)
    trace = run_model(graph.model, model_args, model_kwargs, values, needed=frozenset(sites)).trace
    kinds = ("sample", "deterministic") if deterministic else ("sample",)
    latent_sites = latent_site_names(graph)
    return {
        name: to_replayed(site, name in latent_sites)
        for name, site in trace.items()
        if site["type"] in kinds
    }


def latent_site_names(graph: "FactorGraph") -> frozenset:
    """Names of the numpyro sites behind the graph's variables (chain sites included)."""
    names = set()
    for name, node in graph.variables.items():
        names.update(node.chain.sites if node.chain is not None else (name,))
    return frozenset(names)


def safe_observation(site: "ReplayedSite") -> Any:
    """An observed site's value with its masked positions replaced by a point of the support.

    Masked observations carry no information, and may be NaN (missing data);
    their log density is multiplied by zero, but a NaN would still poison
    gradients and the symbolic pre-contractions, so it never reaches them.
    """
    value = site.value
    if site.mask is None or not site.is_observed:
        return value
    fn = site.fn
    event_ndim = len(fn.event_shape)
    mask = jnp.reshape(site.mask, jnp.shape(site.mask) + (1,) * event_ndim)
    point = support_point(fn.support, tuple(jnp.shape(value)))
    if point is None:
        point = np.zeros(jnp.shape(value))
    return jnp.where(mask, value, jnp.asarray(point, jnp.result_type(value)))
