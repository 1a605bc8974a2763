"""``blrppl.choose``: the engine a model needs, read off its trace.

The default engine of ``python -m blrppl fit`` and a plain function for
Python users. The choice is the first of :data:`RULES` that applies, each a
fact of the traced graph (Khan & Rue, Table 1):

=====================================  ==================  ======================================
the trace shows                        engine              why
=====================================  ==================  ======================================
a plate with ``subsample_size``        ``SVI``             minibatches: local ρ = 1, global ρ_t
``numpyro.param`` sites, every         ``EM``              exact E-step, point estimates by
factor conjugate                                           M-steps (the delta method)
every factor conjugate, each on one    ``ConjugateBayes``  the posterior is in q's family: one
q block (Gaussian latents that share                       ρ = 1 step is exact
a factor in one joint block)
every factor conjugate                 ``VMP``             exact site parameters, coordinate
                                       (``blocks=          ascent over mean-field blocks, the
                                       "gaussian"``)       Gaussian latents that share a factor
                                                           joined
a Monte Carlo factor coupling a few   ``NonConjugateVI``  one full Gaussian over the latents of
continuous latents (at most            ``(blocks="all")``  the non-conjugate factors: mean-field
``MAX_DEFAULT_JOINT`` scalars)                             drops their posterior correlation, and
                                                           noisy steps crawl along its ridges
a non-conjugate factor                 ``NonConjugateVI``  exact where conjugate, estimated
                                                           natural gradients elsewhere
=====================================  ==================  ======================================

A rule is a :class:`Rule`: an engine name, its options and a test of the
:class:`Facts` that returns the reason it applies (or None). A new engine is one more rule
in the list (and one entry of :data:`ENGINES`), placed where it should win.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple, Optional

import numpy as np

from blrppl.blr.fallback import monte_carlo_edges, monte_carlo_exp_families
from blrppl.blr.plan import joint_gaussian_blocks, nonconjugate_block, reading_verdicts_of
from blrppl.engines.base import Engine
from blrppl.engines.blr import BLR
from blrppl.engines.conjugate import ConjugateBayes
from blrppl.engines.em import EM
from blrppl.engines.laplace import Laplace
from blrppl.engines.nonconjugate import NonConjugateVI
from blrppl.engines.svi import SVI
from blrppl.engines.vmp import VMP
from blrppl.errors import ModelError
from blrppl.graph.nodes import FactorGraph
from blrppl.linear_response import checked_sites, understated

ENGINES: dict[str, type] = {
    "VMP": VMP,
    "ConjugateBayes": ConjugateBayes,
    "EM": EM,
    "SVI": SVI,
    "NonConjugateVI": NonConjugateVI,
    "Laplace": Laplace,
    "BLR": BLR,
}
"""Engine name -> class: what ``--algorithm`` accepts."""


class Facts(NamedTuple):
    """What the rules read off a model's trace.

    Attributes:
      graph: the traced graph with every edge's conjugacy verdict.
      plan: the plan the facts come from (``NonConjugateVI``'s options), or
        None for a minibatch model.
      subsampled: plates with ``subsample_size < size``.
      params: ``numpyro.param`` site names.
      nonconjugate: ``(factor, variable, reason)`` for every edge without an
        exact site parameter.
      in_family: why the posterior lies in q's family (every factor on one q
        block: conjugate Bayes is exact), or None.
      not_in_family: why it does not, or None.
      model, args, kwargs: the model and its arguments.
      joint: ``ConjugateBayes``'s plan where joint Gaussian blocks (latents on the real line
        that share a factor: a regression's intercept and slopes) put the posterior in q's
        family though mean-field blocks do not, else None.
    """

    graph: FactorGraph
    plan: Any
    subsampled: tuple
    params: tuple
    nonconjugate: tuple
    in_family: Optional[str]
    not_in_family: Optional[str]
    model: Callable
    args: tuple
    kwargs: dict
    joint: Any = None


class Rule(NamedTuple):
    """One line of the choice: ``test(facts)`` returns why ``engine(**options)`` fits, or None."""

    engine: str
    test: Callable[[Facts], Optional[str]]
    options: Mapping[str, Any] = MappingProxyType({})


class Choice(NamedTuple):
    """The chosen engine and the reasons, from the trace.

    Attributes:
      engine: the engine, ready to ``run`` (``choice.engine.run(key, steps, *args, **kwargs)``).
      name: its class name (``"VMP"``).
      reasons: why, in words a user can check against the model.
      plan: the engine's plan of this model and data, when the choice made
        it (``choice.engine.fit(choice.plan, key, steps)`` skips planning
        again), else None.
    """

    engine: Engine
    name: str
    reasons: tuple
    plan: Any = None

    def __str__(self) -> str:
        return f"{self.name}: " + "; ".join(self.reasons)


def _conjugate(facts: Facts) -> Optional[str]:
    if facts.nonconjugate:
        return None
    return "every factor has exact (conjugate) site parameters"


def _svi(facts: Facts) -> Optional[str]:
    if not facts.subsampled:
        return None
    plate = facts.subsampled[0]
    return f"plate {plate.name!r} draws minibatches of {plate.subsample_size} of {plate.size}"


def _em(facts: Facts) -> Optional[str]:
    if not facts.params or facts.nonconjugate:
        return None
    return f"numpyro.param sites {list(facts.params)} are point estimates (M-steps) and every factor is conjugate"


def _conjugate_bayes(facts: Facts) -> Optional[str]:
    if facts.params or (facts.in_family is None and facts.joint is None):
        return None
    if facts.in_family is None:
        joined = [v for v, q in facts.joint.qs.items() if q.joint]
        return (
            f"{_conjugate(facts)} and every factor touches one q block once the Gaussian latents that share "
            f"a factor form joint blocks ({', '.join(map(repr, joined))}): one step is the exact posterior"
        )
    return f"{_conjugate(facts)} and {facts.in_family}: one step is the exact posterior"


def _vmp(facts: Facts) -> Optional[str]:
    reason = _conjugate(facts)
    if reason is None:
        return None
    return f"{reason}; {facts.not_in_family or 'the posterior is not in the family'}: coordinate ascent"


def _vmp_joint(facts: Facts) -> Optional[str]:
    reason = _vmp(facts)
    groups = joint_gaussian_blocks(facts.graph, list(facts.graph.variables)) if reason is not None else []
    if not groups:
        return None
    joined = ", ".join("+".join(group) for group in groups)
    return f"{reason} with the Gaussian latents that share a factor in joint blocks ({joined}): their correlation kept"


def _joint_block(facts: Facts) -> Optional[str]:
    if not facts.nonconjugate or facts.plan is None or facts.params:
        return None
    try:
        blocks = nonconjugate_block(facts.graph, facts.plan)  # its verdicts, where its q are mean-field
    except ModelError:  # larger than any full Gaussian: mean-field
        return None
    if not blocks or len(blocks[0]) < 2:
        return None
    sites = blocks[0]
    size = sum(int(np.prod(facts.graph.variables[v].shape)) for v in sites)
    sampled = {est.factor for est in facts.plan.estimators if est.method.estimator == "mc"}
    coupled = [
        f for f, _, _ in facts.nonconjugate
        if f in sampled and len(set(facts.graph.factors[f].neighbours) & set(sites)) >= 2
    ]
    if size > MAX_DEFAULT_JOINT or not coupled:
        return None
    return (
        f"factor {coupled[0]!r} couples {list(sites)} ({size} scalars) through a Monte Carlo estimate: one "
        "full Gaussian over them (blocks='all') keeps the posterior correlation that mean-field drops"
    )


def _nonconjugate(facts: Facts) -> Optional[str]:
    shown = [f"{f!r} in {v!r}" for f, v, _ in facts.nonconjugate[:3]]
    more = f" and {len(facts.nonconjugate) - 3} more" if len(facts.nonconjugate) > 3 else ""
    factor, var, reason = facts.nonconjugate[0]
    return f"factors not conjugate: {', '.join(shown)}{more} (e.g. {reason}); they get estimated natural gradients"


def _gaussian_fallback(facts: Facts, reason: str) -> Optional[Choice]:
    """Mean-field ``NonConjugateVI`` with a Gaussian q on the unconstrained space of the latents
    whose prior's family only Monte Carlo could update (``Config.gaussian_fallback``, named in
    ``families`` so that the engine plans once), where that leaves fewer edges to Monte Carlo;
    else None (the facts' plan stands)."""
    moved = monte_carlo_exp_families(facts.plan, NonConjugateVI(facts.model).config)
    if not moved:
        return None
    engine = NonConjugateVI(facts.model, families={v: "Normal" for v in moved})
    try:
        plan = engine.plan(*facts.args, **facts.kwargs)
    except ModelError:
        return None
    if monte_carlo_edges(plan) >= monte_carlo_edges(facts.plan):
        return None
    why = (
        f"{list(moved)} get a Gaussian q on their unconstrained space: in their prior's family a "
        "factor would need Monte Carlo for them, here it takes quadrature"
    )
    return Choice(engine, "NonConjugateVI", (reason, why), plan)


RULES: tuple[Rule, ...] = (
    Rule("SVI", _svi),
    Rule("EM", _em),
    Rule("ConjugateBayes", _conjugate_bayes),
    Rule("VMP", _vmp_joint, MappingProxyType({"blocks": "gaussian"})),
    Rule("VMP", _vmp),
    Rule("NonConjugateVI", _joint_block, MappingProxyType({"blocks": "all"})),
    Rule("NonConjugateVI", _nonconjugate),
)
"""The rules in order; the first that applies chooses (module docstring)."""

MAX_DEFAULT_JOINT = 30
"""The most latent scalars :func:`choose` joins in one full Gaussian by default (its cost is cubic)."""

REUSES_PLAN = frozenset({"EM", "ConjugateBayes", "VMP", "NonConjugateVI"})
"""Engines whose default plan equals the facts' plan when their rule applies (without options).

``NonConjugateVI`` made it; the exact engines plan the same fit when every
factor is conjugate (the same exact estimators, the same q, no other
options), which their rules require.
"""


def facts_of(model: Callable, args: tuple, kwargs: dict) -> Facts:
    """Plan ``model`` once and collect the :class:`Facts` the rules read.

    The plan is made with ``NonConjugateVI``'s options (exact site parameters
    where a factor is conjugate, estimated elsewhere), the most permissive
    default: every factor's verdict in one analysis.
    """
    from blrppl.graph.trace import build_graph

    def minibatch_facts(graph):  # planned by SVI itself (minibatch plans differ)
        subsampled = tuple(p for p in graph.plates.values() if p.subsampled)
        if subsampled:
            return Facts(graph, None, subsampled, tuple(graph.params), (), None, None, model, args, dict(kwargs))
        return None

    try:  # the plan traces the model once; a minibatch model may not plan here
        # With q in the priors' families: the rules see which factors would need Monte Carlo.
        plan = Engine(model, NonConjugateVI(model).config._replace(gaussian_fallback=False)).plan(*args, **kwargs)
    except ModelError:
        facts = minibatch_facts(build_graph(model, args, kwargs))
        if facts is None:
            raise
        return facts
    graph = plan.graph
    facts = minibatch_facts(graph)
    if facts is not None:
        return facts
    # A factor conjugate given its discrete neighbours has exact site parameters all the same
    # (a sum over their configurations: blrppl.estimators.conditional_enumeration).
    summed = {e.factor for e in plan.estimators if e.method.exact_given_enumerated}
    nonconjugate = tuple(
        (f, v, edge.reason or "not analysed")
        for f, edges in plan.verdicts.items()
        for v, edge in edges.items()
        if edge.conjugate is not True and f not in summed
    )
    nonconjugate = tuple(sorted(nonconjugate, key=lambda e: graph.factors[e[0]].kind == "prior"))  # likelihoods first
    in_family, not_in_family, joint = None, None, None
    if not nonconjugate:
        in_family, not_in_family = posterior_in_family(plan)
    if in_family is None and not nonconjugate and not graph.params and _one_block_each_once_joined(plan):
        try:
            joint = ConjugateBayes(model).plan(*args, **kwargs)
        except ModelError:
            joint = None
        if joint is not None and posterior_in_family(joint)[0] is None:
            joint = None
    return Facts(
        graph, plan, (), tuple(graph.params), nonconjugate, in_family, not_in_family, model, args, dict(kwargs), joint
    )


def _one_block_each_once_joined(plan: Any) -> bool:
    """Whether joint Gaussian blocks (:func:`~blrppl.blr.plan.joint_gaussian_blocks`) would leave every
    factor of the mean-field ``plan`` on one block: only then can ``ConjugateBayes`` be exact (its
    plan, made next, is the judge)."""
    groups = joint_gaussian_blocks(plan.graph, list(plan.graph.variables))
    if not groups:
        return False
    group_of = {v: i for i, group in enumerate(groups) for v in group}
    return all(len({group_of.get(v, v) for v in est.neighbours}) == 1 for est in plan.estimators)


def posterior_in_family(plan: Any) -> tuple[Optional[str], Optional[str]]:
    """``(why, why not)``: whether every factor touches one q block (Sec. 5.1), so that q can be exact.

    A factor on two q blocks (two variables, or two independent positions of
    one plated variable in one term) couples them, and a mean-field q cannot
    be the posterior.
    """
    for est in plan.estimators:
        if len(est.neighbours) > 1:
            return None, f"factor {est.factor!r} touches {len(est.neighbours)} q blocks {list(est.neighbours)}"
        for term in () if est.analysis is None else est.analysis.terms:
            reads = [read.var for read in term.reads]
            if len(reads) != len(set(reads)):
                return None, f"factor {est.factor!r} couples independent positions of {reads[0]!r}"
    return "every factor touches one q block", None


def choose(model: Callable, *args: Any, **kwargs: Any) -> Choice:
    """The engine ``python -m blrppl fit`` uses for ``model(*args, **kwargs)``, with its reasons.

    Args:
      model: a NumPyro model.
      *args, **kwargs: its arguments (data included), as for ``engine.run``.

    Returns:
      A :class:`Choice`: ``choice.engine`` (default options), ``choice.name``
      and ``choice.reasons``.

    Example:
      >>> choice = blrppl.choose(model, y=y)  # doctest: +SKIP
      >>> print(choice)  # doctest: +SKIP
      VMP: every factor has exact (conjugate) site parameters; factor 'y' touches 2 q blocks ...
      >>> result = choice.engine.run(jax.random.key(0), 100, y=y)  # doctest: +SKIP
    """
    facts = facts_of(model, args, kwargs)
    for rule in RULES:
        reason = rule.test(facts)
        if reason is not None:
            if rule.engine == "NonConjugateVI" and not rule.options:
                fallback = _gaussian_fallback(facts, reason)
                if fallback is not None:
                    return fallback
            engine = ENGINES[rule.engine](model, **rule.options)
            plan = facts.plan if rule.engine in REUSES_PLAN and not rule.options else None
            if rule.engine == "ConjugateBayes" and facts.in_family is None:
                plan = facts.joint
            if plan is None and rule.options.get("blocks") == "all" and facts.plan is not None:
                plan = _joint_plan(engine, facts.plan, args, kwargs)
            return Choice(engine, rule.engine, (reason,), plan)
    raise ModelError(  # unreachable with the rules above: the last one always applies
        f"site {getattr(model, '__name__', 'model')!r}: no engine rule applies; pass --algorithm."
    )


def _joint_plan(engine: Engine, mean_field: Any, args: tuple, kwargs: dict) -> Any:
    """``engine.plan(*args, **kwargs)`` of a ``blocks="all"`` engine, reading the factors' verdicts
    off ``mean_field`` (a plan of the same model and data with mean-field q) instead of analysing
    them again (a tenth of a second on UCBadmit); None where it raises (``run`` says why)."""
    with reading_verdicts_of(mean_field):
        try:
            return engine.plan(*args, **kwargs)
        except ModelError:
            return None


def jointly(model: Callable, result: Any, *args: Any, **kwargs: Any) -> Optional[Choice]:
    """The joint choice for a mean-field fit flagged by linear response, or None.

    Where ``result`` (a fit of ``model(*args, **kwargs)`` without joint blocks) carries
    :func:`blrppl.linear_response.understated_spread_flag`'s flag, the posterior correlation that
    mean-field drops leaves some sd that many times too small: ``NonConjugateVI(blocks="all")``,
    one full Gaussian over the latents of the non-conjugate factors, keeps it (crossed random
    effects: mu's sd 0.023 -> 0.137, NUTS 0.144); where every factor is conjugate (nothing for
    ``"all"`` to join), one block over the Gaussian latents the check read. None where the fit
    is not flagged, already has joint blocks, or the block would be too large
    (``MAX_JOINT_SIZE``). ``python -m blrppl fit`` refits with it.
    """
    if not understated(result) or any(q.joint for q in result.plan.qs.values()):
        return None
    for blocks in ("all", [checked_sites(result.plan)]):  # a conjugate model's Gaussians: one block
        engine = NonConjugateVI(model, blocks=blocks)
        with reading_verdicts_of(result.plan):
            try:
                plan = engine.plan(*args, **kwargs)
            except ModelError:  # larger than any full Gaussian, or a block the model cannot take
                continue
        if any(q.joint for q in plan.qs.values()):
            break
    else:
        return None
    joined = [v for v, q in plan.qs.items() if q.joint]
    reason = (
        f"the mean-field fit was flagged (linear response: some sd too small by the correlation it "
        f"drops): one full Gaussian over {joined[0]!r} (blocks={blocks!r}) keeps it"
    )
    return Choice(engine, "NonConjugateVI", (reason,), plan)
