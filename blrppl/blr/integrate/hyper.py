"""Which latents are the hyperparameters h, and how q(c | h) is fitted.

Many models are conjugate once a few latents h are fixed (a group scale, a
noise scale, the two variances of a local level). :func:`choose_hyper` picks
the smallest such set (by its dimension on the unconstrained space):

1. *Exact*: every latent with a non-conjugate edge (a mean-field verdict of
   :func:`~blrppl.estimators.select.graph_verdicts`) is in h, and given h the
   other latents split into groups that no factor joins; a group of several
   latents is one joint Gaussian block (all of them Gaussian on the real
   line: ``(mu, theta)`` in eight schools), a group of one keeps its own q
   (a chain Gaussian for a local level, a Gamma, ...). ConjugateBayes is then
   exact on q(c | h) and its ELBO is log p(y | h) + log p(h) (the prior of h
   read at the held values). Gamma precisions that are conjugate under
   mean-field still go into h when they join a chain to another latent.
2. *Laplace* (INLA-like, Rue, Martino & Chopin 2009), only with
   ``inner="laplace"`` (experimental: not yet validated against a reference,
   and every such result is flagged): h is every latent whose q is not a
   Gaussian on the real line and c, one Gaussian block over the rest, is
   fitted by Laplace's method; its evidence is Laplace's approximation of
   log p(y | h).

h is held as point estimates of the conditional plan (built with
``fixed_params``: no M-step), so
its values travel in the plan's arrays (``arrays.params``): one compiled
conditional fit serves every h, and a grid of h is one ``jax.vmap``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np

from blrppl.blr.config import Config, make_config
from blrppl.blr.integrate.options import IntegratedConfig
from blrppl.blr.plan import Plan, joint_gaussian_blocks, make_plan, param_examples
from blrppl.errors import ModelError
from blrppl.estimators.base import q_space_examples
from blrppl.graph.concrete import example_latents
from blrppl.estimators.select import EstimatorOptions, graph_verdicts
from blrppl.graph import build_graph
from blrppl.graph.families import variable_q
from blrppl.graph.nodes import FactorGraph

#: Prior quantiles of h tried as starts of the mode search, and the prior draws they come from.
QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)
PRIOR_DRAWS = 1000
#: At most this many exact candidates are planned (symbolically analysed) before
#: the Laplace route is tried.
MAX_EXACT_ATTEMPTS = 3
#: Candidate sets of h are searched up to this many sites beyond the forced ones.
MAX_EXTRA_SITES = 4


class HyperChoice(NamedTuple):
    """The hyperparameters and the conditional fit given them.

    Attributes:
      sites: the hyperparameter sites h, in trace order.
      sizes: each site's dimension on its unconstrained space.
      inner: ``"exact"`` or ``"laplace"``.
      config: the conditional fit's :class:`~blrppl.blr.config.Config`.
      reason: why these sites (for messages and the result).
      starts: site -> prior quantiles ``QUANTILES`` of the site, shape
        ``(len(QUANTILES), *shape)``: candidate starts of the mode search.
    """

    sites: tuple
    sizes: tuple
    inner: str
    config: Config
    reason: str
    starts: Mapping[str, Any] = {}

    @property
    def dim(self) -> int:
        """The total dimension of h on its unconstrained space."""
        return int(sum(self.sizes))


def choose_hyper(model: Callable, model_args: tuple, model_kwargs: Mapping[str, Any], options: IntegratedConfig) -> tuple[HyperChoice, Plan]:
    """Choose h (or check the user's) and plan the conditional fit (module docstring).

    Returns:
      The :class:`HyperChoice` and the conditional :class:`~blrppl.blr.plan.Plan`.

    Raises:
      ModelError: naming the sites, when h would be too large for a grid, the
        model has ``numpyro.param`` sites, or no conditional fit applies.
    """
    graph = build_graph(model, model_args, model_kwargs, families=options.families or None)
    name = getattr(model, "__name__", "model")
    if graph.params:
        raise ModelError(
            f"site {next(iter(graph.params))!r}: Integrated integrates latent hyperparameters and has no "
            "point estimates; give the numpyro.param site a prior, or fit it with blrppl.EM."
        )
    if not graph.variables:
        raise ModelError(f"site {name!r}: the model has no latent sites to fit.")
    qs, missing = {}, {}
    for v, node in graph.variables.items():
        try:
            qs[v] = variable_q(node, graph.plates)
        except ModelError as error:
            missing[v] = str(error)
    sizes = {v: int(math.prod(q.shape)) for v, q in qs.items()}
    eligible = {v for v, node in graph.variables.items() if v in qs and not node.discrete and node.chain is None}
    if options.hyper is not None:
        return _user_hyper(model, model_args, model_kwargs, graph, qs, sizes, eligible, options)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples({k: x for k, x in example_latents(graph).items() if k in qs}, transforms)
    params, _ = param_examples(graph)
    verdicts = graph_verdicts(graph, qs, missing, examples, params)
    forced = {v for edges in verdicts.values() for v, e in edges.items() if e.conjugate is not True}
    forced |= set(missing)
    order = tuple(graph.variables)
    exact_sets = _exact_candidates(graph, qs, sizes, eligible, forced, order)
    laplace_set = _laplace_candidate(graph, qs, eligible, order)
    if options.inner in ("laplace", "vi"):
        exact_sets = []
    if options.inner == "exact":
        laplace_set = None
    tried = 0
    for sites, blocks in exact_sets:
        dim = sum(sizes[v] for v in sites)
        if dim > options.max_dim:
            break
        if tried >= MAX_EXACT_ATTEMPTS:
            break
        tried += 1
        planned = _plan_exact(model, model_args, model_kwargs, graph, qs, sites, blocks, sizes, options)
        if planned is not None:
            return planned
    if laplace_set is not None and sum(sizes[v] for v in laplace_set) <= options.max_dim:
        if options.inner == "auto":
            raise ModelError(
                f"site {laplace_set[0]!r}: no set of at most {options.max_dim} dimensions makes the rest of the "
                "model conjugate, so q(c | h) cannot be exact; Integrated's Laplace inner fits (INLA-like) are "
                "experimental (results flagged as such): ask for variational inner fits with inner='vi' "
                "(validated on a hierarchical logistic regression against NUTS), Laplace's with inner='laplace', "
                "or use blrppl.NonConjugateVI."
            )
        reason = (
            f"no set of at most {options.max_dim} dimensions makes every factor conjugate; the latents "
            "whose q is not a Gaussian on the real line are integrated, the others fitted by Laplace's method"
        )
        return _plan_laplace(model, model_args, model_kwargs, graph, sizes, laplace_set, options, reason)
    smallest = [s for s, _ in exact_sets[:1]] + ([laplace_set] if laplace_set is not None else [])
    if smallest:
        best = min(smallest, key=lambda s: sum(sizes[v] for v in s))
        dim = sum(sizes[v] for v in best)
        site = best[0] if best else name
        raise ModelError(
            f"site {site!r}: the hyperparameters that make the rest of the model conjugate "
            f"({', '.join(repr(v) for v in best)}) have {dim} dimensions, more than a grid can integrate "
            f"(max_dim={options.max_dim}); use blrppl.NonConjugateVI(model, blocks='all') (one full "
            "Gaussian), or raise max_dim."
        )
    raise ModelError(
        f"site {name!r}: no hyperparameters make the rest of the model conjugate or Gaussian (discrete "
        "latents or chains meet non-conjugate factors); use blrppl.NonConjugateVI or blrppl.VMP."
    )


def prior_starts(graph: FactorGraph, sites: Sequence[str]) -> dict:
    """Site -> the prior's ``QUANTILES`` (from a fixed set of prior draws), the mode search's scouts.

    A start where the prior puts mass matters: the points that hold h in the
    plan (the prior mean, or 1 for a positive site) may lie where log p(y | h)
    is many thousands of units down and far from quadratic.
    """
    out = {}
    for v in sites:
        draws = np.asarray(graph.variables[v].prior.sample(jax.random.key(0), (PRIOR_DRAWS,)))
        out[v] = np.quantile(draws, QUANTILES, axis=0)
    return out


def _gaussian_on_reals(q: Any) -> bool:
    return q.family.gaussian and not q.family.chain and q.transform is None and not q.family.index_valued


def _exact_blocks(graph: FactorGraph, forced: set, sites: Sequence[str]) -> Optional[list]:
    """The joint Gaussian blocks that make ConjugateBayes exact given ``sites``, or None.

    The blocks are EM's (:func:`~blrppl.blr.plan.joint_gaussian_blocks`: real
    Gaussians linked by factors); given h, every factor must then touch at
    most one block or one other latent (Sec. 5.1).
    """
    if not forced <= set(sites):
        return None
    remaining = [v for v in graph.variables if v not in sites]
    blocks = joint_gaussian_blocks(graph, remaining)
    owner = {v: block for block in blocks for v in block}
    for node in graph.factors.values():
        touched = {owner.get(v, (v,)) for v in node.neighbours if v not in sites}
        if len(touched) > 1:
            return None
    return blocks


def _exact_candidates(graph, qs, sizes, eligible, forced, order) -> list:
    """Structurally valid exact sets ``(sites, blocks)``, smallest dimension first."""
    if not forced <= eligible:
        return []
    free = [v for v in order if v in eligible and v not in forced]
    found = []
    for r in range(min(len(free), MAX_EXTRA_SITES) + 1):
        for extra in itertools.combinations(free, r):
            sites = tuple(v for v in order if v in forced or v in extra)
            blocks = _exact_blocks(graph, forced, sites)
            if blocks is not None:
                found.append((sites, blocks))
    found.sort(key=lambda c: (sum(sizes[v] for v in c[0]), len(c[0])))
    return found


def _laplace_candidate(graph, qs, eligible, order) -> Optional[tuple]:
    """h for the Laplace route: every latent whose q is not a Gaussian on the reals."""
    if set(order) - eligible:
        return None  # discrete latents or chains: no Laplace block over them
    sites = tuple(v for v in order if not _gaussian_on_reals(qs[v]))
    if len(sites) == len(order):
        return None
    return sites


def _point_only(graph: FactorGraph, sites: Sequence[str]) -> dict:
    """Exact site parameters everywhere, except the factors that touch h alone (its priors, say
    a HalfCauchy without an exact form): they are read at the held values (the delta method)."""
    only = {f: "delta" for f, node in graph.factors.items() if node.neighbours and set(node.neighbours) <= set(sites)}
    return {f: only.get(f, "exact") for f in graph.factors}


def exact_config(graph: FactorGraph, sites: Sequence[str], blocks: Sequence[Sequence[str]], options: IntegratedConfig) -> Config:
    """ConjugateBayes given h: one ρ = 1 step of every block, h held (Sec. 5.1)."""
    return make_config(
        name=f"{options.name} (exact q(c | h))",
        mode="global",
        schedule="parallel",
        learning_rate=1.0,
        estimators=EstimatorOptions(choice=_point_only(graph, sites)),
        families=options.families,
        blocks=tuple(tuple(b) for b in blocks),
        point_estimates=tuple(sites),
        posterior_in_family=True,
    )


def laplace_config(graph: FactorGraph, sites: Sequence[str], options: IntegratedConfig) -> Config:
    """Laplace's method given h: one Gaussian over the other latents, delta method (Sec. 4.4)."""
    remaining = tuple(v for v in graph.variables if v not in sites)
    return make_config(
        name=f"{options.name} (Laplace q(c | h))",
        learning_rate=1.0,
        estimators=EstimatorOptions(forced="delta"),
        families=options.families,
        blocks=(remaining,),
        point_estimates=tuple(sites),
        continuous_only=True,
    )


def _plan_exact(model, model_args, model_kwargs, graph, qs, sites, blocks, sizes, options) -> Optional[tuple]:
    reason = "given them, every factor is conjugate and the other latents form blocks ConjugateBayes fits exactly"
    config = exact_config(graph, sites, blocks, options)
    try:
        plan = make_plan(model, model_args, model_kwargs, config)
    except ModelError:
        return None
    choice = HyperChoice(tuple(sites), tuple(sizes[v] for v in sites), "exact", config, reason, prior_starts(graph, sites))
    return choice, plan


def vi_config(graph: FactorGraph, sites: Sequence[str], options: IntegratedConfig) -> Config:
    """Non-conjugate VI given h: one full Gaussian over the other latents (Sec. 5.4).

    Site parameters exact where conjugate and deterministic elsewhere
    (Gauss-Hermite on GLM linear predictors, the block estimators of
    :mod:`blrppl.estimators.block_hybrid`), ρ = 1 with a strict ELBO guard,
    so each inner fit settles in tens of steps; its ELBO, a lower bound on
    log p(y | h), stands in for the evidence (INLA with variational inner fits).
    """
    remaining = tuple(v for v in graph.variables if v not in sites)
    return make_config(
        name=f"{options.name} (VI q(c | h))",
        learning_rate=1.0,
        estimators=EstimatorOptions(choice="exact", fallback="auto"),
        families=options.families,
        blocks=(remaining,),
        point_estimates=tuple(sites),
        strict_guard=True,
    )


def _plan_laplace(model, model_args, model_kwargs, graph, sizes, sites, options, reason) -> tuple:
    inner = "vi" if options.inner == "vi" else "laplace"
    config = (vi_config if inner == "vi" else laplace_config)(graph, sites, options)
    plan = make_plan(model, model_args, model_kwargs, config)
    noisy = [e.factor for e in plan.estimators if e.method.noisy]
    if noisy:
        raise ModelError(
            f"site {noisy[0]!r}: variational inner fits need deterministic site parameters, and this factor's "
            "would be Monte Carlo estimates; use inner='laplace' or blrppl.NonConjugateVI."
        )
    choice = HyperChoice(tuple(sites), tuple(sizes[v] for v in sites), inner, config, reason, prior_starts(graph, sites))
    return choice, plan


def _user_hyper(model, model_args, model_kwargs, graph, qs, sizes, eligible, options) -> tuple:
    sites = tuple(options.hyper)
    for v in sites:
        if v not in graph.variables:
            raise ModelError(f"site {v!r}: hyper names a site that is not a latent of the model; use some of {sorted(graph.variables)}.")
        if v not in eligible:
            raise ModelError(f"site {v!r}: hyperparameters must be continuous latents outside chains; choose other sites.")
    dim = sum(sizes[v] for v in sites)
    if dim > options.max_dim:
        raise ModelError(
            f"site {sites[0]!r}: the hyperparameters {list(sites)} have {dim} dimensions, more than a grid can "
            f"integrate (max_dim={options.max_dim}); use blrppl.NonConjugateVI(model, blocks='all'), or raise max_dim."
        )
    order = tuple(graph.variables)
    sites = tuple(v for v in order if v in sites)
    if options.inner in ("auto", "exact"):
        blocks = _exact_blocks(graph, set(), sites)
        if blocks is not None:
            planned = _plan_exact(model, model_args, model_kwargs, graph, qs, sites, blocks, sizes, options)
            if planned is not None:
                return planned
        if options.inner == "exact":
            raise ModelError(
                f"site {sites[0]!r}: given {list(sites)}, the rest of the model is not conjugate in joint "
                "blocks, so q(c | h) cannot be exact; add sites to hyper, or use inner='laplace'."
            )
    remaining = [v for v in order if v not in sites]
    if not all(v in eligible and _gaussian_on_reals(qs[v]) for v in remaining):
        bad = next(v for v in remaining if not (v in eligible and _gaussian_on_reals(qs[v])))
        raise ModelError(
            f"site {bad!r}: given {list(sites)}, its q is not a Gaussian on the real line, so neither an exact "
            "nor a Laplace conditional fit applies; add it to hyper."
        )
    return _plan_laplace(model, model_args, model_kwargs, graph, sizes, sites, options, "named by the user")
