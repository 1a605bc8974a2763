"""Tracing a NumPyro model into a :class:`~blrppl.graph.nodes.FactorGraph`.

``build_graph(model, args, kwargs)`` runs the model once under numpyro's
``seed``/``trace`` handlers (capturing distribution constructor arguments),
then:

1. sorts its sites into latent sample sites (variables), observed sample sites
   (likelihood factors), ``numpyro.factor`` terms, ``numpyro.param`` sites and
   deterministic sites; every sample site is one factor, vectorised over its
   plates;
2. finds each factor's neighbours by dependency analysis on the jaxpr of the
   model as a function of its latent and param values
   (:mod:`blrppl.graph.dependencies`); a model whose shapes or Python control
   flow depend on latent values fails here, and the site responsible is named;
3. checks every observed value (:mod:`blrppl.graph.validate`): its shape is
   the distribution's, it is finite and inside the support outside masked
   positions;
4. recognises latent chains (:mod:`blrppl.graph.chains`: ``scan`` bodies,
   random walks, Python loops; batches of sequences) and gives every variable
   its q family (:mod:`blrppl.graph.families`).

What the trace sees is what numpyro's handlers see: sites hidden by
``handlers.block`` are not in the graph (they are re-drawn with seed 0 on
every replay), a model wrapped in ``condition`` has those sites observed, and
sites the user fixed with ``substitute`` are treated as observed at the
substituted value. Reparameterised sites (``LocScaleReparam``) appear as the
auxiliary latent (``theta_decentered``) and a deterministic site (``theta``).
All validation happens here, in Python, before anything is jit-compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl.compile_mode import to_device
from blrppl.eager_loops import with_loops_compiled_once
from blrppl.errors import ModelError, needs_values_error, site_error
from blrppl.graph import chains as _chains
from blrppl.graph.capture import constructor_call
from blrppl.graph.dependencies import output_dependencies
from blrppl.graph.families import (
    CHAIN_FAMILIES,
    FamilyChoice,
    base_distribution,
    default_family,
    override_family,
)
from blrppl.graph.nodes import (
    ChainInfo,
    DeterministicNode,
    Edge,
    FactorGraph,
    FactorNode,
    ParamNode,
    VariableNode,
)
from blrppl.graph.plates import collect_plates, site_plates, subsample_indices
from blrppl.graph.replay import effective_mask, effective_scale, run_model, run_model_compiled
from blrppl.graph.validate import (
    INVALID_PARAMETER,
    Reached,
    invalid_parameter_error,
    model_code_error,
    validate_observations,
)


@with_loops_compiled_once
def build_graph(
    model: Callable,
    model_args: tuple = (),
    model_kwargs: Optional[Mapping[str, Any]] = None,
    *,
    families: Optional[Mapping[str, str]] = None,
    compiled_trace: bool = False,
) -> FactorGraph:
    """Trace ``model`` into its factor graph, with per-site q family overrides.

    Every edge's conjugacy slot is left unknown (``Edge()``): the verdicts
    come from estimator selection (``blrppl.trace`` composes the two).

    Args:
        model: an ordinary NumPyro model.
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.
        families: latent site (or chain variable) name -> q family name.
        compiled_trace: run the model's first trace as one compiled program
            (:func:`~blrppl.graph.replay.run_model_compiled`): for large data,
            which eager JAX would copy; it costs a compilation.

    Raises:
        ModelError: naming the site, for observations whose shape is not the
            distribution's, NaN, infinite or out-of-support observations
            outside masked positions, shapes or control flow that depend on
            latent values, latent discrete sites with infinite support, and a
            family override that names no latent site or does not fit its
            support.
    """
    model_args = tuple(model_args)
    model_kwargs = dict(model_kwargs or {})
    families = dict(families or {})
    run = run_model_compiled if compiled_trace else run_model
    try:
        tr, user_fixed = run(model, model_args, model_kwargs, placeholders=True, validate=True)
    except ValueError as error:
        if INVALID_PARAMETER not in str(error):
            raise
        raise invalid_parameter_error(model, model_args, model_kwargs, error) from None
    except (TypeError, IndexError) as error:  # the model's own code fails on its data
        raise model_code_error(model, model_args, model_kwargs, error) from error

    latents = [
        n
        for n, s in tr.items()
        if s["type"] == "sample" and not s["is_observed"] and n not in user_fixed
    ]
    observed = [n for n, s in tr.items() if s["type"] == "sample" and n not in latents]
    params = [n for n, s in tr.items() if s["type"] == "param"]

    for name in families:
        if name not in latents:
            raise site_error(
                name,
                "families= names a site that is not a latent sample site of the model",
                f"use one of {', '.join(repr(n) for n in latents) or 'no latent sites'}",
            )
    defaults: dict[str, Optional[FamilyChoice]] = {}
    for n in latents:
        try:
            defaults[n] = default_family(n, tr[n]["fn"])
        except ModelError:
            if n not in families:
                raise
            defaults[n] = None
    choices = {
        n: override_family(n, tr[n]["fn"], families[n], chain=_maybe_chain(tr[n]))
        if n in families
        else defaults[n]
        for n in latents
    }
    deps = _site_dependencies(model, model_args, model_kwargs, tr, latents, params)
    value_deps, dist_deps, dist_scans, scan_init = deps
    validate_observations(
        model, model_args, model_kwargs, tr, observed, latents + params, dist_deps
    )
    latent_set = set(latents)
    # Chains are recognised from the priors, so an override keeps the chain structure.
    chain_families = {n: defaults[n] or choices[n] for n in latents}
    latent_deps = {n: dist_deps[n] & latent_set for n in latents}
    joined = _chains.scan_chains(
        tr,
        latents,
        chain_families,
        latent_deps,
        dist_scans,
        {tag: names & latent_set for tag, names in scan_init.items()},
    )
    in_scan_chains = frozenset(site for info, _ in joined.values() for site in info.sites)
    loops = _chains.markov_chains(tr, latents, chain_families, latent_deps, in_scan_chains)
    joined.update(loops)
    variables, var_of = _variables(tr, latents, choices, joined, families)
    factors = _factors(tr, latents, observed, params, var_of, value_deps, dist_deps)
    factors = _join_loop_steps(factors, frozenset(loops))
    deterministics = {
        n: DeterministicNode(
            name=n,
            shape=tuple(np.shape(s["value"])),
            plates=site_plates(s),
            neighbours=_ordered({var_of[d] for d in value_deps[n] if d in var_of}, variables),
        )
        for n, s in tr.items()
        if s["type"] == "deterministic"
    }
    param_nodes = {
        n: ParamNode(
            name=n,
            shape=tuple(np.shape(tr[n]["value"])),
            constraint=tr[n]["kwargs"].get("constraint", constraints.real),
            init_value=tr[n]["value"],
        )
        for n in params
    }
    return FactorGraph(
        variables=variables,
        factors=factors,
        params=param_nodes,
        deterministics=deterministics,
        plates=collect_plates(tr),
        model=model,
        model_args=model_args,
        model_kwargs=model_kwargs,
        site_values={n: s["value"] for n, s in tr.items() if s["type"] == "sample"},
    )


def _maybe_chain(site: Mapping[str, Any]) -> bool:
    return _chains.distribution_chain(site) is not None or (
        "_scan_current_index" in site.get("infer", {})
    )


_DEPENDENCE_ERRORS = (
    TypeError,
    jax.errors.JAXTypeError,
    jax.errors.JAXIndexError,
    jax.errors.ConcretizationTypeError,
)

CONCRETE_VALUE_ERRORS = (
    jax.errors.TracerArrayConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)
"""What JAX raises when code needs the value of a traced array."""


def _site_dependencies(
    model: Callable,
    model_args: tuple,
    model_kwargs: dict,
    tr: Mapping[str, Any],
    latents: list[str],
    params: list[str],
) -> tuple[dict, dict, dict, dict]:
    """Which latent and param sites each site's value and distribution depend on.

    Returns ``(value_deps, dist_deps, dist_scans, scan_init)``: site name ->
    set of latent/param names (for its value and its distribution's arguments),
    site name -> top-level scan tags its distribution passes through, and scan
    tag -> names its initial carry depends on.
    """
    names = latents + params
    example = [to_device(tr[n]["value"]) for n in names]
    fixed = subsample_indices(tr)
    record: list[tuple[str, str]] = []

    def outputs(*flat: Any) -> list:
        data = dict(fixed)
        data.update(zip(names, flat))
        out_tr = run_model(model, model_args, model_kwargs, data).trace
        record.clear()
        outs = []
        for name, site in out_tr.items():
            if site["type"] not in ("sample", "deterministic"):
                continue
            if isinstance(site["value"], jax.Array):
                outs.append(site["value"])
                record.append((name, "value"))
            if site["type"] == "sample":
                for leaf in _distribution_leaves(site["fn"]):
                    outs.append(leaf)
                    record.append((name, "dist"))
        return outs

    try:
        analysis = output_dependencies(outputs, *example)
    except _DEPENDENCE_ERRORS as err:
        culprit = _find_culprit(model, model_args, model_kwargs, names, example, fixed)
        if culprit is None and isinstance(err, CONCRETE_VALUE_ERRORS):
            # Not a latent's value: the plates' indices or the data, traced (X[idx] of a numpy X).
            order = [n for n, s in tr.items() if s["type"] in ("sample", "deterministic")]
            site = _first_site_not_reached(model, model_args, model_kwargs, order, names, example, fixed)
            raise needs_values_error(site or order[-1], err, "blrppl traces it") from err
        if culprit is None:
            raise
        raise site_error(
            culprit,
            "a shape, an index or Python control flow in the model depends on this latent "
            f"site's value ({type(err).__name__})",
            "make shapes depend on data only (e.g. pad to a maximum size and mask), and use "
            "jnp.where / lax.cond instead of Python if on latent values",
        ) from err

    sites = [n for n, s in tr.items() if s["type"] in ("sample", "deterministic")]
    value_deps = {n: set() for n in sites}
    dist_deps = {n: set() for n in sites}
    dist_scans = {n: set() for n in sites}
    for position, (name, part) in enumerate(record):
        bad = analysis.out_of_range(position)
        if bad:
            raise site_error(
                name,
                f"an index from the data is out of range: {bad[0].detail}",
                "indices are 0-based and must be below the size of the axis they index (codes 1..G "
                "need `g - 1`; size a latent by the number of groups, e.g. `len(np.unique(g))` or "
                "`int(g.max()) + 1`)",
            )
        if name not in value_deps:
            continue
        found = {names[i] for i in analysis.inputs_of(position)}
        (value_deps if part == "value" else dist_deps)[name] |= found
        if part == "dist":
            dist_scans[name] |= analysis.scans_of(position)
    scan_init = {tag: frozenset(names[i] for i in ins) for tag, ins in analysis.scan_init.items()}
    freeze = lambda d: {k: frozenset(v) for k, v in d.items()}  # noqa: E731
    return freeze(value_deps), freeze(dist_deps), freeze(dist_scans), scan_init


def _distribution_leaves(fn: dist.Distribution) -> list:
    """Array arguments of a distribution: its constructor call and its pytree leaves."""
    out: list = []
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if isinstance(obj, dist.Distribution):
            if id(obj) in seen:
                return
            seen.add(id(obj))
            for value in constructor_call(obj).arguments.values():
                visit(value)
            try:
                leaves = jax.tree_util.tree_leaves(obj)
            except Exception:  # a distribution that is not a pytree: arguments suffice
                leaves = []
            for leaf in leaves:
                visit(leaf)
        elif isinstance(obj, jax.Array):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item)

    visit(fn)
    return out


def _first_site_not_reached(
    model: Callable, model_args: tuple, model_kwargs: dict, order: list[str], names: list[str], example: list,
    fixed: dict,
) -> Optional[str]:
    """The first site of ``order`` that a traced run of the model does not reach (the statement
    its code fails at), or None when the run does not fail."""
    reached: list = []

    def outputs(*flat: Any) -> None:
        with Reached(reached):
            run_model(model, model_args, model_kwargs, {**fixed, **dict(zip(names, flat))})

    try:
        jax.make_jaxpr(outputs)(*example)
    except _DEPENDENCE_ERRORS:
        return next((n for n in order if n not in reached), None)
    return None


def site_needing_values(graph: FactorGraph) -> Optional[str]:
    """The first sample site whose statement the model's code fails at when it runs traced at the
    traced values (the plates' indices traced too), or None: for an error that names it."""
    names = list(graph.site_values)
    example = [jnp.asarray(graph.site_values[n]) for n in names]
    return _first_site_not_reached(graph.model, graph.model_args, graph.model_kwargs, names, names, example, {})


def _find_culprit(
    model: Callable,
    model_args: tuple,
    model_kwargs: dict,
    names: list[str],
    example: list,
    fixed: dict,
) -> Optional[str]:
    """The first latent whose value, alone made abstract, breaks the model (or None)."""
    for i, name in enumerate(names):
        concrete = dict(fixed)
        concrete.update({n: v for j, (n, v) in enumerate(zip(names, example)) if j != i})

        def one(x: Any, name: str = name, concrete: dict = concrete) -> None:
            # Operations on concrete values run eagerly; only this latent is abstract.
            with jax.ensure_compile_time_eval():
                run_model(model, model_args, model_kwargs, {**concrete, name: x})

        try:
            jax.make_jaxpr(one)(example[i])
        except _DEPENDENCE_ERRORS:
            return name
    return None


# ------------------------------------------------------------------------ nodes


def _ordered(names: set, variables: Mapping[str, Any]) -> tuple[str, ...]:
    order = {n: i for i, n in enumerate(variables)}
    return tuple(sorted(names, key=lambda n: order.get(n, len(order))))


def _variables(
    tr: Mapping[str, Any],
    latents: list[str],
    choices: Mapping[str, FamilyChoice],
    joined: Mapping[str, tuple[ChainInfo, str]],
    families: Mapping[str, str],
) -> tuple[dict[str, VariableNode], dict[str, str]]:
    """VariableNodes in trace order, and site name -> variable name."""
    var_of = {n: n for n in latents}
    for name, (info, _) in joined.items():
        for site in info.sites:
            var_of[site] = name
    for site, var in var_of.items():
        if site != var and site in families:
            raise site_error(
                site,
                f"this site is a step of the latent chain {var!r} "
                "and has no q of its own",
                f"give the family for the whole chain: families={{{var!r}: ...}}",
            )
    variables: dict[str, VariableNode] = {}
    for name in latents:
        var = var_of[name]
        if var in variables:
            continue
        site = tr[var]
        fn = site["fn"]
        choice = choices[var]
        chain = _chains.distribution_chain(site)
        shape = tuple(np.shape(site["value"]))
        batch_shape, event_shape = tuple(fn.batch_shape), tuple(fn.event_shape)
        if var in joined:
            chain, chain_family = joined[var]
            shape = chain.shape
            batch_shape, event_shape = chain.batch_shape, shape[len(chain.batch_shape) :]
            if var not in families:
                choice = FamilyChoice(chain_family, None)
        if choice.family in CHAIN_FAMILIES and chain is None:
            raise site_error(
                var,
                f"family {choice.family!r} needs a latent chain, and this site is not one",
                "use it only on GaussianRandomWalk, GaussianStateSpace or scan chains",
            )
        variables[var] = VariableNode(
            name=var,
            family=choice.family,
            shape=shape,
            batch_shape=batch_shape,
            event_shape=event_shape,
            plates=site_plates(site),
            support=fn.support,
            transform=choice.transform,
            prior=fn,
            discrete=bool(fn.support.is_discrete),
            chain=chain,
            observed_mask=_observed_mask(tr, var),
        )
    return variables, var_of


def _observed_mask(tr: Mapping[str, Any], name: str) -> Optional[np.ndarray]:
    """For the ``y_unobserved`` latent of an ``obs_mask`` site: the observed positions."""
    suffix = "_unobserved"
    if not name.endswith(suffix):
        return None
    partner = tr.get(name[: -len(suffix)] + "_observed")
    if partner is None or partner["type"] != "sample" or not partner["is_observed"]:
        return None
    mask = effective_mask(tr[name])
    return None if mask is None else ~np.asarray(mask)


def _factors(
    tr: Mapping[str, Any],
    latents: list[str],
    observed: list[str],
    params: list[str],
    var_of: Mapping[str, str],
    value_deps: Mapping[str, frozenset],
    dist_deps: Mapping[str, frozenset],
) -> dict[str, FactorNode]:
    """One FactorNode per sample site, in trace order."""
    latent_set, observed_set, param_set = set(latents), set(observed), set(params)
    variable_order = {}
    for n in latents:
        variable_order.setdefault(var_of[n], len(variable_order))
    factors: dict[str, FactorNode] = {}
    for name, site in tr.items():
        if name not in latent_set and name not in observed_set:
            continue
        fn = site["fn"]
        is_latent = name in latent_set
        is_unit = isinstance(base_distribution(fn), dist.Unit)
        deps = dist_deps[name] | value_deps[name]
        others = sorted(
            {var_of[d] for d in deps if d in var_of} - ({var_of[name]} if is_latent else set()),
            key=variable_order.get,
        )
        neighbours = ((var_of[name],) if is_latent else ()) + tuple(others)
        mask = effective_mask(site)
        factors[name] = FactorNode(
            name=name,
            kind="prior" if is_latent else ("factor" if is_unit else "likelihood"),
            distribution=fn,
            observed=not is_latent and not is_unit,
            value=None if is_latent or is_unit else np.asarray(site["value"]),
            neighbours=neighbours,
            param_neighbours=tuple(p for p in params if p in deps and p in param_set),
            plates=site_plates(site),
            scale=effective_scale(site),
            mask=None if mask is None else np.asarray(mask),
            edges={v: Edge() for v in neighbours},
        )
    return factors


def _step_kind(node: FactorNode) -> Optional[tuple]:
    """What makes per-step factors of a loop chain one kind (None: keep the factor alone)."""
    fn = node.distribution
    scale = node.scale
    if scale is not None and np.ndim(scale) != 0:
        return None
    layers = []
    while fn is not None:
        layers.append(type(fn))
        fn = getattr(fn, "base_dist", None)
    return (
        node.kind,
        tuple(layers),
        tuple(node.distribution.batch_shape),
        tuple(node.distribution.event_shape),
        None if node.value is None else np.shape(node.value),
        node.neighbours,
        node.param_neighbours,
        node.plates,
        None if scale is None else float(scale),
        node.mask is None,
    )


def _join_loop_steps(factors: dict[str, FactorNode], chains: frozenset) -> dict[str, FactorNode]:
    """The per-step factors of Python-loop chains, joined into one factor per kind of step.

    A chain written as a loop gives one prior and one likelihood site per step;
    as separate factors, each would replay the model and carry site parameters
    the size of the whole chain (cost T^2). Factors that touch a loop chain and
    are alike (same kind, distribution type and shapes, neighbours, plates and
    scale) become one factor summing their sites' log densities, as a ``scan``
    chain has one factor per site.
    """
    groups: dict[tuple, list[str]] = {}
    for name, node in factors.items():
        if not chains & set(node.neighbours):
            continue
        kind = _step_kind(node)
        if kind is not None:
            groups.setdefault(kind, []).append(name)
    joined = {members[0]: members for members in groups.values() if len(members) > 1}
    absorbed = {m for members in joined.values() for m in members[1:]}
    out: dict[str, FactorNode] = {}
    for name, node in factors.items():
        if name in absorbed:
            continue
        members = joined.get(name)
        if members is None:
            out[name] = node
            continue
        nodes = [factors[m] for m in members]
        batch = tuple(node.distribution.batch_shape)
        out[name] = dataclasses.replace(
            node,
            sites=tuple(members),
            value=None if node.value is None else np.stack([n.value for n in nodes]),
            mask=None
            if node.mask is None
            else np.stack([np.broadcast_to(np.asarray(n.mask, bool), batch) for n in nodes]),
        )
    return out
