"""Plan one fit: trace the model, lay out q, choose every factor's estimator.

:func:`make_plan` turns a model, its data and a :class:`~blrppl.blr.config.Config`
into a :class:`Plan`: the traced graph (with each edge's conjugacy verdict),
each variable's q, each factor's estimator, and the arrays the compiled fit
reads (:class:`~blrppl.estimators.base.PlanArrays`). Everything in a plan but
its arrays is static; :attr:`Plan.signature` describes it, so that a fit of
new data with the same signature reuses the compiled program.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import warnings
from typing import Any, Callable, Iterator, Mapping, Optional

import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions.transforms import biject_to

from blrppl.compile_mode import resident, to_device
from blrppl.eager_loops import with_loops_compiled_once
from blrppl.blr.config import MAX_JOINT_SIZE, Config
from blrppl.blr.fallback import with_gaussian_fallback
from blrppl.blr.orphans import integrate_orphans, masked_graph, orphan_rows
from blrppl.blr.sharding import follow_data_sharding
from blrppl.blr.signature import plan_signature
from blrppl.blr.starts import start_arrays
from blrppl.blr.tying import not_exact, tied, tied_candidates
from blrppl.errors import ModelError, needs_values_error
from blrppl.estimators.base import FactorEstimator, PlanArrays, q_space_examples
from blrppl.graph.concrete import example_latents, with_held_data
from blrppl.estimators.cubature import MAX_CUBATURE_DIM
from blrppl.estimators.select import Verdicts, choose_estimator, delta_estimator, graph_verdicts, with_verdicts
from blrppl.families import VariableQ
from blrppl.graph.blocks import as_blocks
from blrppl.graph.chains import discrete_loop_chain
from blrppl.families.registry import GAUSSIAN_NAMES
from blrppl.graph.families import variable_q
from blrppl.graph.nodes import FactorGraph, Plate
from blrppl.graph.points import as_point_estimates
from blrppl.graph.trace import CONCRETE_VALUE_ERRORS, build_graph, site_needing_values
from blrppl.symbolic.tied import UntiedChain


@dataclasses.dataclass(frozen=True)
class Subsample:
    """The subsampled plate of a minibatch plan and the variables local to it.

    Attributes:
      plate: the plate (N, M).
      local_axes: local variable -> the axis of its natural parameters that
        indexes the plate.
      plate_factors: the factors inside the plate.
    """

    plate: Plate
    local_axes: dict
    plate_factors: frozenset


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a fit builds before compiling: static, except ``arrays``.

    Attributes:
      graph: the traced model, each edge carrying its conjugacy verdict.
      qs: variable name -> its q.
      estimators: one per factor, in trace order.
      init_params: point estimates' starting values (``numpyro.param`` sites
        and ``point_estimates``), constrained.
      param_transforms: point estimate -> transform from its unconstrained space.
      verdicts: factor -> variable -> conjugacy :class:`~blrppl.graph.nodes.Edge`.
      subsample: the minibatch plate (stochastic VI), or None.
      arrays: the data the compiled fit reads (a pytree).
      data_static: the model's data could not be passed as arguments (the
        model needs concrete data values while it runs), so compiled code
        holds them as constants and the signature includes their content.
      held_data: where only some of the model's arrays must be concrete (an
        index array the model takes ``np.unique`` of), their positions in
        ``graph.data.arrays``: compiled code holds those as constants (the
        signature includes their content; ``arrays.data`` has None in their
        places, :meth:`~blrppl.graph.data.ModelData.rebuild` puts them back) and
        takes the others as arguments. Empty where all or none are held.
      imputed: missing-data latents (numpyro's ``obs_mask``) that no factor
        but their own prior touches: that factor integrates to one, so it
        sends no site parameter to other variables and leaves the ELBO out
        (the fit equals deleting the missing observations); their q are
        imputations (the prior given the other variables' q).
      orphans: variable -> mask of its rows that an unmasked factor touches,
        for plated latents with rows that none does (a mixture's assignment
        of a masked observation); those rows are integrated out the same way
        (:mod:`blrppl.blr.orphans`).
      start_estimators: the delta-method (Newton) estimators that start q
        near the mode before estimated site parameters take over
        (:mod:`blrppl.blr.starts`); empty when every factor is exact or an
        estimated neighbour is not Gaussian.
    """

    graph: FactorGraph
    qs: dict[str, VariableQ]
    estimators: tuple[FactorEstimator, ...]
    init_params: dict[str, Any]
    param_transforms: dict[str, Any]
    verdicts: Verdicts
    subsample: Optional[Subsample]
    arrays: PlanArrays
    data_static: bool = False
    start_estimators: tuple = ()
    imputed: frozenset = frozenset()
    orphans: dict = dataclasses.field(default_factory=dict)
    held_data: tuple = ()

    @functools.cached_property
    def signature(self) -> tuple:
        """A hashable description of everything static: equal signatures share compiled code."""
        return plan_signature(self)


@with_loops_compiled_once
@with_gaussian_fallback
def make_plan(model: Callable, model_args: tuple, model_kwargs: Mapping[str, Any], config: Config) -> Plan:
    """Trace ``model`` on its data and plan a fit with the options of ``config`` (with
    ``config.gaussian_fallback``, see :mod:`blrppl.blr.fallback`).

    Raises:
      ModelError: naming the site, for models or options the preset cannot fit.
    """
    graph = build_graph(model, model_args, model_kwargs, families=config.families or None)
    subsampled = [p for p in graph.plates.values() if p.subsampled]
    plate = None
    if config.minibatch:
        if len(subsampled) != 1:
            names = [p.name for p in subsampled]
            site = names[1] if len(names) > 1 else getattr(model, "__name__", "model")
            raise ModelError(
                f"site {site!r}: {config.name} needs exactly one plate with subsample_size, found "
                f"{names or 'none'}; subsample one data plate (use VMP for full-data fits)."
            )
        plate = subsampled[0]
        # All N rows: large data are traced compiled, so that the model's own indexing does not
        # copy them (small data are traced eagerly: a compilation costs more than a copy).
        size = sum(a.nbytes for a in graph.data.arrays)
        graph = build_graph(
            _full_data_model(model, plate), model_args, model_kwargs, families=config.families or None,
            compiled_trace=size >= COMPILED_TRACE_BYTES,
        )
    elif subsampled:
        plate = subsampled[0]
        raise ModelError(
            f"site {plate.name!r}: the plate subsamples {plate.subsample_size} of {plate.size}; "
            "fit minibatch models with blrppl.SVI."
        )
    if config.continuous_only:
        _check_continuous(graph, config, model)
    blocks = config.blocks
    if blocks == "all" and config.continuous_only:  # Laplace: one Gaussian over every latent
        blocks = [tuple(graph.variables)]
    elif blocks == "all":
        blocks = nonconjugate_block(graph, _MEAN_FIELD_PLAN.get())
    elif config.joint_gaussians and not blocks:
        blocks = joint_gaussian_blocks(graph, [s for s in graph.variables if s not in config.point_estimates])
    graph = as_point_estimates(graph, config.point_estimates)
    if config.joint_hyperparameters and not blocks:
        blocks = hyperparameter_blocks(graph)
    graph = as_blocks(graph, blocks)
    _check_options(graph, config, model)
    qs = {name: variable_q(node, graph.plates) for name, node in graph.variables.items()}
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples(example_latents(graph), transforms)
    init_params, param_transforms = param_examples(graph)
    if init_params and not config.point_params:
        raise ModelError(
            f"site {next(iter(init_params))!r}: numpyro.param sites need point estimates; "
            f"{config.name} has none; use blrppl.EM instead."
        )
    plate_factors = frozenset()
    if plate is not None:
        plate_factors = frozenset(f for f, node in graph.factors.items() if plate.name in node.plates)
    # Stationary discrete chains get the tied family where every factor allows (blrppl.blr.tying).
    candidates = tied_candidates(graph, qs, config, plate is not None)
    qs.update({v: tied(qs[v]) for v in candidates})
    built: dict = {}
    while True:
        try:
            for name in graph.factors:
                if name not in built:
                    built[name] = _estimator(graph, name, qs, examples, init_params, config, plate, plate_factors)
            untie = not_exact(qs, (est for est, _ in built.values()))
        except UntiedChain as error:
            untie = [error.var]
        if not untie:
            break
        for v in untie:  # in place: the estimators built already close over ``qs``
            qs[v] = variable_q(graph.variables[v], graph.plates)
            built = {f: b for f, b in built.items() if v not in graph.factors[f].neighbours}
    estimators = [built[name][0] for name in graph.factors]
    verdicts = {name: built[name][1] for name in graph.factors}
    orphans = {} if plate is not None else orphan_rows(graph, _imputed(graph))
    if orphans:
        estimators = _integrate_orphans(graph, orphans, estimators, qs, examples, init_params, config)
    start_estimators = ()
    # One full Gaussian starts from the prior: a Newton start would chase the joint mode, which a
    # centred hierarchy has at a group scale of zero. But Monte Carlo site parameters under the
    # prior can be astronomically large (E_q[exp(sd * eff)] with a broad q on log sd and eff), and
    # their first step collapses q where it starts (a non-centred Poisson hierarchy: q of mu and sd
    # pinned at their start): such a block gets the Newton start too.
    if config.blocks != "all" or any(e.method.estimator == "mc" for e in estimators):
        start_estimators = _start_estimators(graph, estimators, qs, examples, init_params, config)
    graph = with_verdicts(graph, verdicts)
    if config.posterior_in_family:
        _check_posterior_in_family(graph, estimators, config)
    subsample = None
    if plate is not None:
        subsample = Subsample(plate, _local_axes(graph, qs, plate), plate_factors)
    held = graph.held_data
    data_static = len(held) == len(graph.data.arrays) > 0
    held = () if data_static else held
    arrays = PlanArrays(
        factors=resident(follow_data_sharding({est.factor: est.arrays for est in estimators}, graph.data.arrays)),
        data=None if data_static else with_held_data(graph, held),
        starts=start_arrays(graph, qs, estimators, config.init),
        params=dict(init_params),
    )
    return Plan(
        graph, qs, tuple(estimators), init_params, param_transforms, verdicts, subsample, arrays, data_static,
        start_estimators, _imputed(graph), orphans, held,
    )


def _estimator(graph, name, qs, examples, params, config, plate, plate_factors) -> tuple:
    """``choose_estimator`` for one factor of the plan, its errors in the user's terms."""
    full_plate = None if plate is None else dataclasses.replace(plate, subsample_size=plate.size)
    try:
        return choose_estimator(
            graph, name, qs, examples, params, config.estimators, full_plate if name in plate_factors else None,
            plate if name in plate_factors else None,
        )
    except ModelError as error:
        if config.posterior_in_family:
            raise ModelError(
                f"{error} {config.name} needs conjugate factors; VMP fits the same model by coordinate ascent."
            ) from None
        raise
    except CONCRETE_VALUE_ERRORS as error:
        site = site_needing_values(graph) or name
        raise needs_values_error(site, error, "blrppl traces it") from error


def _integrate_orphans(graph, orphans, estimators, qs, examples, params, config) -> list:
    """Each orphaned variable's prior factor integrates its orphan rows out (see :mod:`blrppl.blr.orphans`)."""
    masked = masked_graph(graph, orphans)
    out = []
    for est in estimators:
        if est.factor in orphans:
            alone, _ = choose_estimator(masked, est.factor, qs, examples, params, config.estimators, None)
            est = integrate_orphans(est, alone, est.factor)
        out.append(est)
    return out


def _imputed(graph: FactorGraph) -> frozenset:
    """Missing-data latents touched by their own prior factor only (see :class:`Plan`)."""
    out = set()
    for v, node in graph.variables.items():
        if node.observed_mask is None:
            continue
        touching = [f for f, factor in graph.factors.items() if v in factor.neighbours]
        if touching == [v]:
            out.add(v)
    return frozenset(out)


def _start_estimators(graph, estimators, qs, examples, params, config) -> tuple:
    """Delta-method versions of the estimated factors (all exact ones kept), or ()."""
    if config.estimators.forced is not None or not any(e.method.estimated for e in estimators):
        return ()
    out = []
    for est in estimators:
        if not est.method.estimated:
            out.append(est)
            continue
        delta = delta_estimator(graph, est, qs, examples, params, config.estimators.num_samples)
        if delta is None:
            return ()
        out.append(delta)  # a hybrid's exact part is the same analysis: it reads the same arrays
    return tuple(out)


def joint_gaussian_blocks(graph: FactorGraph, candidates) -> list[tuple[str, ...]]:
    """Groups of real-valued Gaussian latents linked through shared factors (union-find).

    Only groups of two or more sites up to ``MAX_JOINT_SIZE`` scalars; a
    larger group stays mean-field (the result says so: ``EM``'s bound is
    then below the log likelihood).
    """
    gaussian = {
        v for v in candidates
        if graph.variables[v].family in GAUSSIAN_NAMES and graph.variables[v].transform is None
        and graph.variables[v].chain is None and not graph.variables[v].discrete
        and graph.variables[v].observed_mask is None
    }
    parent = {v: v for v in gaussian}

    def find(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for node in graph.factors.values():
        linked = [v for v in node.neighbours if v in gaussian]
        for a, b in zip(linked, linked[1:]):
            parent[find(a)] = find(b)
    groups: dict = {}
    for v in graph.variables:
        if v in gaussian:
            groups.setdefault(find(v), []).append(v)
    out = []
    for members in groups.values():
        size = sum(int(np.prod(graph.variables[v].shape)) for v in members)
        if len(members) > 1 and size <= MAX_JOINT_SIZE:
            out.append(tuple(members))
    return out


_MEAN_FIELD_PLAN: contextvars.ContextVar[Optional[Plan]] = contextvars.ContextVar("mean_field_plan", default=None)


@contextlib.contextmanager
def reading_verdicts_of(plan: Optional[Plan]) -> Iterator[None]:
    """Within, a ``blocks="all"`` plan of the same model and data reads the factors' verdicts
    off ``plan`` (a mean-field plan, such as :func:`blrppl.choose`'s), where its q are the
    mean-field ones, instead of analysing every factor again (:func:`nonconjugate_block`)."""
    token = _MEAN_FIELD_PLAN.set(plan)
    try:
        yield
    finally:
        _MEAN_FIELD_PLAN.reset(token)


def nonconjugate_block(graph: FactorGraph, planned: Optional[Plan] = None) -> list[tuple[str, ...]]:
    """``blocks="all"`` of NonConjugateVI: one block over the continuous latents of non-conjugate factors.

    Every continuous, non-chain latent that neighbours a factor with a
    non-conjugate edge (under mean-field q) joins one full Gaussian on the
    unconstrained space; the others keep their own (exact) q. A single site
    whose q is already one full Gaussian is left as it is. ``planned``: a
    plan of ``graph`` whose verdicts are read instead of analysing every
    factor again, where its q are these mean-field ones.

    Raises:
      ModelError: when the block would exceed ``MAX_JOINT_SIZE`` scalars.
    """
    qs = {name: variable_q(node, graph.plates) for name, node in graph.variables.items()}
    if planned is not None and planned.graph.factors.keys() == graph.factors.keys() and _same_qs(planned.qs, qs):
        verdicts = planned.verdicts
    else:
        transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
        examples = q_space_examples(example_latents(graph), transforms)
        params, _ = param_examples(graph)
        verdicts = graph_verdicts(graph, qs, {}, examples, params)
    touching = {
        v for f, edges in verdicts.items() if any(e.conjugate is False for e in edges.values())
        for v in graph.factors[f].neighbours
    }
    sites = [
        v for v, node in graph.variables.items()
        if v in touching and not node.discrete and node.chain is None and node.observed_mask is None
    ]
    if not sites:
        return []
    if len(sites) == 1:
        q = qs[sites[0]]
        if q.family.event_ndim == 1 and q.num_batch == 0 and q.transform is None:
            return []
    size = sum(math.prod(qs[v].shape) for v in sites)
    if size > MAX_JOINT_SIZE:
        raise ModelError(
            f"site {sites[0]!r}: blocks='all' would join {size} scalars ({sites}) in one full Gaussian, "
            f"more than {MAX_JOINT_SIZE}; name smaller blocks=[...] or use the mean-field default."
        )
    return [tuple(sites)]


def _same_qs(planned: Mapping[str, VariableQ], qs: Mapping[str, VariableQ]) -> bool:
    """Whether a plan's q are ``qs``: the same variables, families, shapes and transforms."""
    return planned.keys() == qs.keys() and all(
        (p.family.name, tuple(p.shape), p.num_batch, p.joint, type(p.transform))
        == (q.family.name, tuple(q.shape), q.num_batch, q.joint, type(q.transform))
        for p, q in ((planned[v], qs[v]) for v in qs)
    )


def hyperparameter_blocks(graph: FactorGraph) -> tuple:
    """Scalar hyperparameters to join: the ``joint_hyperparameters`` option of :class:`Config`.

    Sites whose q is a scalar Gaussian on an unconstrained space (a
    LogNormal, HalfCauchy, ... prior: non-conjugate wherever they enter) and
    that are together the only neighbours of a likelihood factor (a Gaussian
    process's ``MultivariateNormal(0, K(var, noise, length))``) are grouped,
    as long as each group stays small enough for the degree-5 cubature
    (``MAX_CUBATURE_DIM`` scalars): mean-field would miss their correlation.
    """
    candidates = {
        v for v, node in graph.variables.items()
        if node.family in GAUSSIAN_NAMES and node.transform is not None and math.prod(node.shape) == 1
        and node.chain is None and not node.discrete and not node.members and node.observed_mask is None
    }
    groups: list[list[str]] = []
    for name, factor in graph.factors.items():
        neighbours = list(factor.neighbours)
        if factor.kind == "prior" or factor.param_neighbours or len(neighbours) < 2:
            continue
        if not set(neighbours) <= candidates:
            continue
        touching = [g for g in groups if set(g) & set(neighbours)]
        merged = list(dict.fromkeys([v for g in touching for v in g] + neighbours))
        if len(merged) > MAX_CUBATURE_DIM:
            continue
        groups = [g for g in groups if g not in touching] + [merged]
    return tuple(tuple(g) for g in groups)


def param_examples(graph: FactorGraph) -> tuple[dict, dict]:
    """Initial values (constrained) and transforms of the graph's point estimates."""
    values, transforms = {}, {}
    for name, node in graph.params.items():
        values[name] = to_device(node.init_value)
        transforms[name] = biject_to(node.constraint)
    return values, transforms


COMPILED_TRACE_BYTES = 1 << 26
"""Minibatch models whose data take this many bytes (64 MiB) or more are traced on all rows
compiled (:func:`~blrppl.graph.replay.run_model_compiled`), not eagerly."""


def _full_data_model(model: Callable, plate: Plate) -> Callable:
    """The model with the plate's indices fixed to all N positions."""

    def full_model(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="subsample_size does not match")
            with handlers.substitute(data={plate.name: jnp.arange(plate.size)}):
                return model(*args, **kwargs)

    full_model.__name__ = getattr(model, "__name__", "model")
    full_model.__wrapped__ = model
    return full_model


def _check_continuous(graph: FactorGraph, config: Config, model: Callable) -> None:
    for name, node in graph.variables.items():
        if node.discrete or node.chain is not None:
            raise ModelError(
                f"site {name!r}: {config.name} needs continuous latents without chains; marginalise or "
                "fix the site, or use another engine."
            )
    if not graph.variables:
        raise ModelError(f"site {getattr(model, '__name__', 'model')!r}: the model has no latent sites to approximate.")


def _check_options(graph: FactorGraph, config: Config, model: Callable) -> None:
    for site in config.families:
        members = (m.name for n in graph.variables.values() for m in n.members)
        if site not in graph.variables and site not in members:
            raise ModelError(
                f"site {site!r}: families names a site that is not a latent of the model; use one of "
                f"{sorted(graph.variables)}."
            )
    for site in config.init:
        if site not in graph.variables:
            raise ModelError(
                f"site {site!r}: init names a site that is not a latent variable of the model; use one of "
                f"{sorted(graph.variables)}."
            )
    choice = config.estimators.choice
    if isinstance(choice, Mapping):
        for factor in choice:
            if factor not in graph.factors:
                raise ModelError(
                    f"site {factor!r}: estimator names a factor the model does not have; use one of "
                    f"{sorted(graph.factors)}."
                )
    linked = discrete_loop_chain(graph)
    if linked is not None:
        raise ModelError(
            f"site {linked[0]!r}: the discrete latents {', '.join(repr(s) for s in linked[:3])}"
            f"{', ...' if len(linked) > 3 else ''} form a Markov chain written one site per step "
            "(a Python loop or numpyro.markov) that blrppl could not join into one chain q (each "
            "step must be one site of one shape whose distribution depends on the previous step "
            "only); write the chain with numpyro.contrib.control_flow.scan (the initial state "
            "sampled before the scan, each step's state inside it) so that it gets a "
            "ChainCategorical q."
        )
    if config.order is not None and sorted(config.order) != sorted(graph.variables):
        raise ModelError(
            f"site {getattr(model, '__name__', 'model')!r}: order must list every latent variable once: "
            f"{sorted(graph.variables)}; got {list(config.order)}."
        )


def _check_posterior_in_family(graph: FactorGraph, estimators, config: Config) -> None:
    """Conjugate Bayes: every factor touches one q block, so ρ = 1 is exact (Sec. 5.1)."""
    for name, node in graph.factors.items():
        if len(node.neighbours) > 1:
            raise ModelError(
                f"site {name!r}: the factor touches {len(node.neighbours)} q blocks "
                f"{list(node.neighbours)}, so the posterior is not in the q family; "
                "use blrppl.VMP (coordinate ascent) instead."
            )
    for est in estimators:
        coupled = _coupled_variable(est)
        if coupled is not None:
            raise ModelError(
                f"site {est.factor!r}: the factor couples independent positions of {coupled!r} "
                "(more than one q block), so the posterior is not in the q family; use "
                "blrppl.VMP instead, or give the site a joint q (declare its axes as an event "
                "with .to_event instead of a plate)."
            )


def on_one_block_each(plan: Plan) -> bool:
    """Whether every factor touches one q block (no two variables, no two independent
    positions of one variable in a term): then each site parameter is free of q (Sec. 5.1)."""
    return all(len(est.neighbours) <= 1 and _coupled_variable(est) is None for est in plan.estimators)


def exact_target_variables(plan: Plan) -> frozenset:
    """The variables every one of whose site parameters is exact (symbolic, or an exact sum
    over enumerated neighbours): each E_q[log f] is then affine in the variable's μ (each of
    its q blocks'), so with ρ = 1 its step is the coordinate maximum of the ELBO (Khan & Rue,
    Sec. 5.3), and a target λ = Σ_f λ̃_f outside the family means the ELBO has no maximum
    in that q (no VI solution; see :func:`blrppl.blr.checks.unbounded_elbo_error`)."""
    exact = set(plan.qs)
    for est in plan.estimators:
        method = est.method
        summed = set(method.estimated) <= set(method.enumerated)
        for v in est.neighbours:
            if est.factor in plan.imputed and v != est.factor:
                continue  # an integrated-out factor informs its own latent only
            if not (summed and v in method.exact):
                exact.discard(v)
    return frozenset(exact)


def _coupled_variable(estimator: FactorEstimator) -> Optional[str]:
    """A variable two of whose independent q blocks meet in one term, if any."""
    analysis = estimator.analysis
    if analysis is None:
        return None
    for term in analysis.terms:
        seen = set()
        for read in term.reads:
            if read.var in seen:
                return read.var
            seen.add(read.var)
    return None


def _local_axes(graph: FactorGraph, qs: Mapping[str, VariableQ], plate: Plate) -> dict:
    local_axes = {}
    for v, node in graph.variables.items():
        if plate.name in node.plates:
            axis = len(qs[v].batch_shape) + plate.dim
            if axis < 0:
                raise ModelError(f"site {v!r}: cannot locate the plate {plate.name!r} axis of its q; declare the plate's dim.")
            local_axes[v] = axis
    return local_axes
