"""Specialise the Bayesian learning rule to one plan: the one ``step`` of blrppl.

``build_blr`` closes over the static pieces of a :class:`~blrppl.blr.plan.Plan`
(each variable's q, each factor's estimator) and the options of a
:class:`~blrppl.blr.config.Config` (mode, schedule, learning rate, minibatches),
and returns an :class:`~blrppl.blr.state.InferenceAlgorithm` of pure
functions of ``(state, arrays)``. Every engine runs this step: exact Bayes,
VMP, EM (with its M-step), stochastic VI (minibatches of one plate),
non-conjugate VI (estimated site parameters, iterate averaging, the ELBO
guard) and Laplace. Python loops over the (static) graph unroll when the step
is traced; plates are handled inside each estimator's array arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from blrppl.blr import damping
from blrppl.blr.averaging import polynomial_average, window_change
from blrppl.blr.config import AUTO_NOISY_RATE, Config
from blrppl.blr.elbo import elbo_terms, exact_evidence, log_joint_at_mean, mean_params, moments
from blrppl.blr.incremental import build_store
from blrppl.blr.minibatch import batch_key, minibatch, put_rows, take_rows
from blrppl.blr.mstep import build_m_step
from blrppl.blr.newton import MAX_NEWTON_SIZE, natural_size, newton_candidate
from blrppl.blr.plan import Plan, exact_target_variables, on_one_block_each
from blrppl.blr.restarts import random_params, random_start
from blrppl.blr.schedules import as_schedule
from blrppl.blr.starts import initial_natural, placeholder_natural
from blrppl.blr.state import BLRInfo, BLRState, InferenceAlgorithm
from blrppl.blr.update import checked_global_update, is_valid_natural, local_update, safe_global_update, tree_sum
from blrppl.estimators.gaussian import has_point_mass

GUARD_SLACK = 1e-3
STRICT_GUARD_SLACK = 1e-12
MAX_GUARD_HALVINGS = 12
NEGLIGIBLE_DROP = 1e-4
"""A full step that lowers the guard's objective by at most this many nats does not flag a stall."""


def build_blr(
    plan: Plan, config: Config, *, random_starts: bool = False, fixed_params: bool = False, by_merit: bool = False
) -> InferenceAlgorithm:
    """Build ``init``, ``step`` and ``elbo`` for one plan.

    The step, for the variables in ``config.order`` (coordinate-wise with
    ``schedule="sequential"``, all from the same q with ``"parallel"``):

    - site parameters λ̃_f(μ) of every factor touching the variable, from its
      estimator (on the step's minibatch for factors in a subsampled plate,
      rescaled by N / M for variables outside the plate);
    - the update: Eq. 58 (``mode="global"``, kept in the natural parameter
      space by the family's safe step), Eq. 60 (``mode="local"``: one site
      parameter per factor; with minibatches, one per observation), or, for
      variables local to a subsampled plate, ρ = 1 on the batch's rows;
    - EM's M-step for point estimates, then iterate averaging (Monte Carlo
      site parameters) and the ELBO guard (deterministic estimated site
      parameters: a step whose ELBO collapses is retried with ρ/2, ρ/4, ...).

    Args:
      plan: the planned fit.
      config: its options.
      random_starts: ``init`` re-centres each q at a draw from its start
        (restarts; see :mod:`blrppl.blr.restarts`).
      fixed_params: no M-step: point estimates stay where the state has them
        (EM's E-step alone, to evaluate the bound at other parameter values).
      by_merit: steps judged by log p̄(m) report it as their value (a Newton start's).

    Returns:
      The :class:`InferenceAlgorithm`.
    """
    qs, estimators, graph = plan.qs, plan.estimators, plan.graph
    auto_rate = config.learning_rate == "auto"
    config = config._replace(learning_rate=learning_rate(plan, config))
    rho = as_schedule(config.learning_rate)
    mode, schedule = config.mode, config.schedule
    order = tuple(config.order) if config.order is not None else default_order(plan)
    sub = plan.subsample
    local = tuple(v for v in order if sub is not None and v in sub.local_axes)
    ordered = local + tuple(v for v in order if v not in local)
    plate_factors = sub.plate_factors if sub is not None else frozenset()
    scale = sub.plate.size / sub.plate.subsample_size if sub is not None else 1.0
    incremental = None
    if sub is not None and mode == "local":
        incremental = build_store(qs, estimators, plate_factors, sub.local_axes, sub.plate.size)
    m_step = build_m_step(plan) if plan.init_params and not fixed_params else None
    average = _average(plan, config)
    guard = _guard(plan) and sub is None
    # One full Gaussian (blocks="all"): any drop of the deterministic ELBO is retried with a
    # smaller ρ, so the run ascends monotonically instead of circling its optimum.
    slack = STRICT_GUARD_SLACK if config.blocks == "all" or config.strict_guard else GUARD_SLACK
    newton_start = _newton_start(plan, config) if plan.start_estimators and not random_starts else None
    # Newton on the ELBO needs the ELBO itself to be exact up to quadrature: a degree-3 cubature's
    # error is a ridge Newton would climb (UCBadmit), so cubature fits keep the BLR step alone.
    cubature = any(e.method.estimator == "cubature" for e in plan.estimators)
    newton = config.newton and guard and mode == "global" and not plan.init_params and not average and not cubature
    newton = newton and natural_size(qs, plan.arrays) <= MAX_NEWTON_SIZE
    # ρ = 1 with deterministic site parameters: where the iteration oscillates around its fixed
    # point, damp it (one full Gaussian's strict guard keeps its ascent monotone already).
    damped = auto_rate and guard and mode == "global" and not average and config.blocks != "all"
    exact = exact_after_one_step(plan, config, fixed_params=fixed_params)
    # Its step's ELBO is the log evidence, read off A(λ) and each factor's constant
    # (:func:`~blrppl.blr.elbo.exact_evidence`) where every E_q[log f] is affine in μ.
    evidence = exact and not plan.imputed and all(e.constant is not None for e in plan.estimators)
    # A variable whose site parameters are all exact has the coordinate maximum of the ELBO as
    # its target: one outside the family means the ELBO has no maximum (an improper
    # conditional), reported as such. With ρ = 1 the step is that target, taken plainly (Eq. 58,
    # no safeguard, which would replace it by a valid q: a confident wrong answer).
    unit_rate = not callable(config.learning_rate) and float(config.learning_rate) == 1.0
    exact_targets = exact_target_variables(plan) if sub is None else frozenset()
    # With the delta method (Newton steps: Laplace) a fixed point has λ = Σ_f λ̃_f, a valid q, at
    # a mode: a last target outside the family (the safeguard's step taken instead) is flagged.
    # Other estimators are left out (on a small model the check's few operations per step cost
    # a fifth of the step), and so are chains (their check is a forward pass).
    newton_steps = guard and all(e.method.estimator == "delta" for e in plan.estimators if e.method.estimated)
    # Where every factor is by the delta method the guard judges a step by log p̄(m), the objective
    # Newton's method climbs, not by the delta ELBO (:func:`judged_by_mode`); ``by_merit`` (a Newton
    # start, never reported): the steps report and carry it too, and no delta ELBO is evaluated.
    by_mode = guard and sub is None and mode == "global" and judged_by_mode(plan)
    by_merit = by_merit and by_mode
    checked_targets = frozenset(
        v for v in ordered
        if newton_steps and mode == "global" and v not in exact_targets and not qs[v].family.chain
    )

    def batch_of(state: BLRState, t: jax.Array) -> Optional[jax.Array]:
        if sub is None:
            return None
        return minibatch(batch_key(state.rng_key), t, sub.plate.size, sub.plate.subsample_size)

    # Each estimator's Python code is traced once per step's shapes (a coordinate-wise step estimates
    # a factor once per variable; the start and the loop, the same factors): jit caches the jaxpr.
    estimates = [jax.jit(est.estimate) for est in estimators]

    def messages(rng_key, natural, params, arrays, variables, batch):
        """λ̃_f(μ) for every factor touching ``variables``: variable -> {factor -> λ̃}."""
        mean = mean_params(qs, natural)
        out: dict = {v: {} for v in variables}
        for i, est in enumerate(estimators):
            touched = [v for v in est.neighbours if v in out]
            if est.factor in plan.imputed:  # an integrated-out factor informs its own latent only
                touched = [v for v in touched if v == est.factor]
            if not touched:
                continue
            key = jax.random.fold_in(rng_key, i)
            if batch is not None and est.factor in plate_factors:
                _, grads = estimates[i](key, mean, params, arrays, batch=batch)
                for v in touched:
                    out[v][est.factor] = grads[v] if v in local else jax.tree.map(lambda g: scale * g, grads[v])
            else:
                _, grads = estimates[i](key, mean, params, arrays)
                for v in touched:
                    out[v][est.factor] = grads[v]
        return out

    def apply(v, natural, sites, known, site_messages, r, batch):
        """Update one variable from its factors' site parameters; ``known[v]``: ``(μ, A, rejected,
        unbounded, off_target)`` of its new λ where the update checked it (``unbounded``: for an
        exact target, whether it is outside the family; ``off_target``: the same for a checked
        estimated one; else None)."""
        plain = exact or (unit_rate and v in exact_targets)  # the posterior (coordinate maximum) or nothing
        messages_v = list(site_messages.values())

        def unbounded(rejected):
            if v not in exact_targets or (not unit_rate and qs[v].family.chain):
                return None  # (at ρ < 1 a chain's check would be a forward pass per step)
            return rejected if unit_rate else ~jnp.all(qs[v].family.is_valid(tree_sum(messages_v)))

        def off_target():
            return ~is_valid_natural(qs[v].family, tree_sum(messages_v)) if v in checked_targets else None

        if v in local:  # ρ = 1 on the minibatch rows: the exact local step (Sec. 5.3)
            axis = sub.local_axes[v]
            target = tree_sum(messages_v)
            natural[v] = put_rows(natural[v], batch, take_rows(target, batch, axis), axis)
        elif mode == "global" and qs[v].family.checked_moments is not None:
            # Eq. 58; the new λ's validity and its moments (the ELBO's) from one pass (chains).
            natural[v], rejected, moments_v = checked_global_update(qs[v].family, natural[v], messages_v, r, plain=plain)
            known[v] = (*moments_v, rejected, unbounded(rejected), None)
        elif mode == "global":
            natural[v], rejected = safe_global_update(qs[v].family, natural[v], messages_v, r, plain=plain)  # Eq. 58
            known[v] = (None, None, rejected, unbounded(rejected), off_target())
        else:
            current = {f: sites[f][v] for f in site_messages}
            natural[v], new = local_update(current, site_messages, r)  # Eq. 60
            for f, site in new.items():
                sites[f][v] = site
            if plain or v in exact_targets:
                rejected = ~is_valid_natural(qs[v].family, natural[v]) if plain else None
                known[v] = (None, None, rejected, unbounded(rejected), None)
        return natural, sites, known

    def update(rng_key, natural, sites, known, params, arrays, variables, r, batch):
        """One update of ``variables``; ``known`` gathers ``(μ, A, rejected, unbounded, off_target)``
        of the variables whose new λ came with them (each variable is updated once per step, so
        they stay its own)."""
        natural, sites, known = dict(natural), {f: dict(s) for f, s in sites.items()}, dict(known)
        if incremental is not None:
            for i, v in enumerate(variables):
                key = jax.random.fold_in(rng_key, i)
                if v in local:
                    msgs = messages(key, natural, params, arrays, (v,), batch)
                    natural, sites, known = apply(v, natural, sites, known, msgs[v], r, batch)
                else:  # Eq. 60, one site per observation: swap the batch's sites
                    mean = mean_params(qs, natural)
                    natural[v], sites = incremental.refresh(key, mean, params, arrays, v, batch, sites, r)
            return natural, sites, known
        msgs = messages(rng_key, natural, params, arrays, variables, batch)
        for v in variables:
            natural, sites, known = apply(v, natural, sites, known, msgs[v], r, batch)
        return natural, sites, known

    def start(rng_key: jax.Array, arrays: Any, random: Any = random_starts, index: Any = 0) -> tuple[dict, dict]:
        """The first half of ``init``: q's start and the point estimates (``random``: a restart's, a
        traced boolean selecting between the two; ``index``: the restart's, which relabels k-means clusters)."""
        init_key, _ = jax.random.split(rng_key)
        # A Newton start's own (delta) estimators give its first λ: no factor is estimated twice.
        first = plan.start_estimators if newton_start is not None else estimators
        natural = initial_natural(init_key, graph, qs, first, arrays, config.init, index)
        params = dict(arrays.params)
        if random is False:
            return natural, params
        moved = random_start(jax.random.fold_in(init_key, 1), qs, natural, keep=config.init)
        moved_params = random_params(jax.random.fold_in(init_key, 2), plan.param_transforms, params)
        if random is True:
            return moved, moved_params
        return jax.tree.map(lambda a, b: jnp.where(random, a, b), (moved, moved_params), (natural, params))

    def finish(rng_key: jax.Array, natural: dict, params: dict, arrays: Any) -> BLRState:
        """The second half of ``init``, from :func:`start`'s output."""
        init_key, run_key = jax.random.split(rng_key)
        natural = dict(natural)
        globals_ = tuple(v for v in ordered if v not in local)
        if local and globals_:
            # The local latents start from symmetry-breaking responsibilities; one
            # full coordinate step of the globals carries that start over
            # (otherwise the first local step would erase it).
            for i, v in enumerate(globals_):
                msgs = messages(jax.random.fold_in(init_key, 2 + i), natural, params, arrays, (v,), None)
                natural[v] = tree_sum(list(msgs[v].values()))
        if newton_start is not None:
            natural = newton_start(jax.random.fold_in(init_key, 4), natural, params, arrays)
        sites: dict = {}
        if incremental is not None:
            sites = incremental.init(natural, params, arrays)
        elif mode == "local":
            sites = _initial_sites(qs, estimators, natural)
        state = BLRState(
            natural=natural,
            site_params=sites,
            params=params,
            step=jnp.zeros((), jnp.int32),
            average=natural if average else None,
            rng_key=run_key,
            anchor=natural if average else None,
            off_target=jnp.zeros((), bool) if checked_targets or guard else None,
            damping=damping.init(natural) if damped else None,
        )
        if guard:
            value, size = elbo_and_scale(jax.random.fold_in(init_key, 3), state, arrays)
            state = state._replace(elbo=value, elbo_scale=size)
        else:  # every step measures the size of its ELBO's terms
            state = state._replace(elbo_scale=jnp.zeros((), jnp.result_type(float)))
        return state

    def init(rng_key: jax.Array, arrays: Any, index: Any = 0) -> BLRState:  # index: a restart's (start)
        natural, params = start(rng_key, arrays, index=index)
        return finish(rng_key, natural, params, arrays)

    def attempt(state: BLRState, arrays: Any, r: jax.Array) -> tuple[BLRState, jax.Array]:
        t = state.step + 1
        update_key, m_key, elbo_key = jax.random.split(jax.random.fold_in(state.rng_key, state.step), 3)
        batch = batch_of(state, t)
        natural, sites, params = state.natural, state.site_params, state.params
        known: dict = {}
        if schedule == "parallel":
            natural, sites, known = update(update_key, natural, sites, known, params, arrays, ordered, r, batch)
        else:
            for i, v in enumerate(ordered):
                key = jax.random.fold_in(update_key, i)
                natural, sites, known = update(key, natural, sites, known, params, arrays, (v,), r, batch)
        # The M-step and the ELBO read the same q: its moments (a chain's
        # forward-backward) are computed once for both, most by the update itself.
        rejected = [k[2] for k in known.values() if k[2] is not None]
        unbounded = [k[3] for k in known.values() if k[3] is not None]
        unbounded = jnp.any(jnp.stack(unbounded)) if unbounded else jnp.zeros((), bool)
        off = [k[4] for k in known.values() if k[4] is not None]
        known = {v: k[:2] for v, k in known.items() if k[0] is not None}
        if known or m_step is not None or evidence:
            missing = moments(qs, {v: lam for v, lam in natural.items() if v not in known})
            known = {v: known[v] if v in known else missing[v] for v in natural}
        else:
            known = None  # the ELBO computes them (no chain among the variables)
        values: dict = {}  # factor -> E_q[log f] at the new point estimates, from the M-step
        if m_step is not None:
            params, values = m_step(m_key, natural, params, arrays, {v: m for v, (m, _) in known.items()})
        running = polynomial_average(state.average, natural, t) if average else state.average
        new_state = state._replace(natural=natural, site_params=sites, params=params, step=t, average=running)
        if state.off_target is not None:  # a state made by ``finish`` carries it (a Newton start's does not)
            new_state = new_state._replace(off_target=jnp.any(jnp.stack(off)) if off else jnp.zeros((), bool))
        if evidence:  # λ = Σ_f λ̃_f with E_q[log f] affine in μ: the ELBO is the log evidence
            value, size = exact_evidence(qs, estimators, natural, params, arrays, known)
        elif by_merit:
            value, size = merit_of(elbo_key, natural, params, arrays), None
        else:
            value, size = elbo_and_scale(elbo_key, new_state, arrays, batch, known, values)
        size = None if state.elbo_scale is None else size  # a state made by ``finish`` carries it
        taken = ~jnp.any(jnp.stack(rejected)) if rejected else jnp.ones((), bool)
        return new_state._replace(elbo=value if guard else None, elbo_scale=size), value, taken, unbounded

    def step(state: BLRState, arrays: Any) -> tuple[BLRState, BLRInfo]:
        r = jnp.asarray(rho(state.step + 1), dtype=jnp.result_type(float))
        if state.damping is not None:
            r = state.damping.next
        if guard and state.elbo is not None:
            # A step whose (exact) ELBO collapses is retried with ρ/2, ρ/4, ...
            # The first attempt runs inside the loop too: the step is traced
            # (and compiled) once, not twice.
            # The guard's objective: the ELBO, or log p̄(m) with ``by_mode`` (Newton steps, or the
            # safeguard's step in their place, whose mean moves along Λ_new⁻¹ ∇log p̄ too).
            judge = by_mode and not by_merit  # (``by_merit``: state.elbo and v are log p̄(m) already)
            before = merit_of(state.rng_key, state.natural, state.params, arrays) if judge else state.elbo

            def collapsed(value, merit):
                drop = before - merit
                return ~jnp.isfinite(value) | ~jnp.isfinite(merit) | (drop > slack * (1.0 + jnp.abs(before)))

            # An unbounded ELBO (an exact target outside its family) is the model's, not the
            # step size's: it is not retried.
            def retry(carry):
                k, _, _, _, _, _, _, first = carry
                r_k = r * 0.5**k
                candidate, v, taken, unbounded = attempt(state, arrays, r_k)
                merit = merit_of(candidate.rng_key, candidate.natural, candidate.params, arrays) if judge else v
                return k + 1, candidate, v, merit, r_k, taken, unbounded, jnp.where(k == 0, merit, first)

            yes = jnp.ones((), bool)
            start = jnp.asarray(state.elbo)
            _, new_state, value, merit, r, taken, unbounded, first = jax.lax.while_loop(
                lambda c: (c[0] == 0) | ((c[0] <= MAX_GUARD_HALVINGS) & collapsed(c[2], c[3]) & ~c[6]),
                retry,
                (jnp.zeros((), jnp.int32), state, start, start, r, yes, ~yes, start),
            )
            # A step that collapsed at every halving, or whose every λ the safeguard rejected (a
            # target not finite), left q where it was: q is not a fixed point of the rule. A collapse
            # is no stall where the full step itself lowered the objective by less than ``NEGLIGIBLE_DROP`` nats:
            # q is then at the rule's fixed point to within what any comparison of fits can see
            # (a strict guard's slack is 1e-12 relative; a cubature fit's last full step, off by
            # 5e-6 nats, halved to nothing, was flagged while matching NUTS).
            negligible = jnp.isfinite(first) & (before - first <= NEGLIGIBLE_DROP)
            stalled = ((collapsed(value, merit) & ~negligible) | ~taken) & ~unbounded
        else:
            new_state, value, taken, unbounded = attempt(state, arrays, r)
            stalled = None
        if newton:
            # Keep the better of the BLR step and a damped Newton step on the ELBO (blrppl.blr.newton).
            key = jax.random.fold_in(state.rng_key, state.step)
            natural, candidate = newton_candidate(lambda nat: elbo(key, state._replace(natural=nat), arrays), state.natural)
            better = candidate > value
            new_state = new_state._replace(
                natural=jax.tree.map(lambda a, b: jnp.where(better, a, b), natural, new_state.natural),
                elbo=jnp.where(better, candidate, value),
            )
            value = jnp.where(better, candidate, value)
            stalled = None if stalled is None else stalled & ~better
        if state.damping is not None:
            rose = value >= state.elbo
            new_state = new_state._replace(damping=damping.observe(state.damping, state.natural, new_state.natural, r, rose))
        if stalled is not None and new_state.off_target is not None:
            new_state = new_state._replace(off_target=new_state.off_target | stalled)
        change = jnp.asarray(jnp.nan, value.dtype)
        if average:
            new_state, change = window_change(qs, new_state)
        elif exact:  # the step taken (no λ rejected by the safeguard) is the fixed point
            change = jnp.where(taken, 0.0, jnp.inf).astype(value.dtype)
            # A rejected step means the exact posterior is not a valid q: its λ is the fallback
            # of the safeguard, not the posterior, and its ELBO no evidence (the fit reports it).
            value = jnp.where(taken, value, jnp.nan)
            new_state = new_state._replace(elbo=None if new_state.elbo is None else value)
        if exact_targets and not exact:
            # The ELBO has no maximum: +inf, its supremum, is what the step reports (the fit
            # raises :func:`blrppl.blr.checks.unbounded_elbo_error`); the state keeps q's value.
            value = jnp.where(unbounded, jnp.inf, value)
        return new_state, BLRInfo(elbo=value, rho=r, change=change)

    def elbo(
        rng_key: jax.Array, state: BLRState, arrays: Any, batch: Optional[jax.Array] = None, known: Optional[dict] = None
    ) -> jax.Array:
        """The ELBO of q (with a minibatch, its unbiased minibatch estimate); ``known``: q's moments, if computed."""
        return cached_elbo(rng_key, state.natural, state.params, arrays, batch, known, None)[0]

    def elbo_and_scale(rng_key, state: BLRState, arrays, batch=None, known=None, values=None) -> tuple:
        """The ELBO and the size of its terms (``BLRState.elbo_scale``), from one trace."""
        return cached_elbo(rng_key, state.natural, state.params, arrays, batch, known, values or None)

    @jax.jit
    def cached_elbo(rng_key, natural, params, arrays, batch, known, values):
        """The ELBO's Python code, traced once per shapes (the start, the guard, each attempt), and
        the size of its terms (left out by the compiler where unused)."""
        local_axes = sub.local_axes if sub is not None else {}
        return elbo_terms(
            rng_key, qs, estimators, natural, params, arrays, batch, plate_factors, local_axes, scale,
            skip=plan.imputed, rows=plan.orphans, known=known, estimates=estimates, with_scale=True, values=values,
        )

    @jax.jit
    def merit_of(rng_key, natural, params, arrays):
        """log p̄(m) of q (:func:`~blrppl.blr.elbo.log_joint_at_mean`), the guard's objective with ``by_mode``."""
        key = jax.random.fold_in(rng_key, 3)
        return log_joint_at_mean(key, qs, estimators, natural, params, arrays, estimates=estimates)

    def unbounded_sites(state: BLRState, arrays: Any) -> jax.Array:
        """Whether each exact target (sorted) at ``state`` is outside its family (an error's names)."""
        names = sorted(exact_targets)
        msgs = messages(jax.random.fold_in(state.rng_key, state.step), state.natural, state.params, arrays, names, None)
        return jnp.stack([~is_valid_natural(qs[v].family, tree_sum(list(msgs[v].values()))) for v in names])

    sequential = any(est.sequential for est in estimators)
    # Restarts share ``finish`` with the plain start unless the plain start alone takes Newton steps.
    shared = newton_start is None and not random_starts
    return InferenceAlgorithm(
        init=init, step=step, noisy=average, sequential=sequential,
        elbo=(lambda k, s, a: merit_of(k, s.natural, s.params, a)) if by_merit else (lambda k, s, a: elbo(k, s, a)),
        chained=any(q.family.chain for q in qs.values()), newton=newton,
        start=start if shared else None, finish=finish if shared else None, exact=exact,
        blank=(lambda arrays: placeholder_natural(qs, arrays)) if exact else None, exact_targets=exact_targets,
        unbounded_sites=unbounded_sites if exact_targets else None, newton_started=newton_start is not None,
    )


def exact_after_one_step(plan: Plan, config: Config, *, fixed_params: bool = False) -> bool:
    """Whether one step from any q is the fixed point (conjugate Bayes, Khan & Rue Sec. 5.1).

    True when ``config`` asks for the posterior in q's family (every factor
    on one q block, no term reading a block twice: each E_q[log f] is affine
    in its block's μ, so its site parameter λ̃_f does not depend on q), every
    site parameter is exact, ρ = 1 is constant, and nothing else moves q (no
    point estimates, minibatches, Newton start or integrated orphan rows):
    then λ = Σ_f λ̃_f after the first step (Eq. 58, and Eq. 60 with every
    site refreshed), whatever the start, unless the safeguard rejected it.
    With ``fixed_params`` (EM's E-step alone, any engine's options) the point
    estimates do not move and every factor on one q block is enough.
    """
    methods = [e.method for e in plan.estimators]
    return bool(
        (config.posterior_in_family or (fixed_params and on_one_block_each(plan)))
        and not callable(config.learning_rate)
        and float(config.learning_rate) == 1.0
        and all(not m.estimated and not m.enumerated for m in methods)
        and (fixed_params or not plan.init_params)
        and plan.subsample is None
        and not plan.orphans
        and not plan.start_estimators
    )


START_STEPS = 50
START_TOL = 1e-8


def _newton_start(plan: Plan, config: Config):
    """``(rng_key, natural, params, arrays) -> natural``: q moved near the posterior's mode.

    Estimated site parameters evaluated under a broad starting q can be
    useless or overflow (E_q[exp(η)] under a wide prior). So q first takes
    guarded Newton steps: the same BLR step with every estimated factor's
    site parameter by the delta method (Khan & Rue, Sec. 4.4: Laplace's
    method) and ρ = 1, a step that lowers the objective retried with ρ/2,
    ρ/4, ... (the ELBO guard), until the objective settles or ``START_STEPS``.
    Gaussian q then sit at the mode with the curvature there as precision.
    """
    start_plan = dataclasses.replace(plan, estimators=plan.start_estimators, start_estimators=(), subsample=None)
    # The delta-method steps are Newton steps on log p̄(m) already: no damped Newton candidates on the
    # ELBO besides (their Hessian over UCBadmit's 306 natural parameters cost most of the start's).
    start_config = config._replace(learning_rate=1.0, average=False, mode="global", minibatch=False, init={}, newton=False)
    algorithm = build_blr(start_plan, start_config, by_merit=True)

    def start(rng_key, natural, params, arrays):
        state = BLRState(natural=natural, site_params={}, params=params, step=jnp.zeros((), jnp.int32), rng_key=rng_key)
        state = state._replace(elbo=algorithm.elbo(rng_key, state, arrays))

        def cond(carry):
            state, change = carry
            return (state.step < START_STEPS) & (change > START_TOL)

        def body(carry):
            state, _ = carry
            new, info = algorithm.step(state, arrays)
            change = jnp.abs(info.elbo - state.elbo) / (1.0 + jnp.abs(info.elbo))
            # A start that went nowhere finite keeps the previous q (never a worse start).
            keep = ~jnp.isfinite(info.elbo)
            new = jax.tree.map(lambda a, b: jnp.where(keep, a, b), state, new)
            return new, jnp.where(keep, 0.0, change)

        state, _ = jax.lax.while_loop(cond, body, (state, jnp.asarray(jnp.inf, jnp.result_type(float))))
        return state.natural

    return start


def default_order(plan: Plan) -> tuple[str, ...]:
    """The variables in the model's order, those summed over by a factor exact given them
    (``"exact+enumeration"``) last.

    Their first update reads the other neighbours' q: from the prior's spread, a switch
    ``y ~ Normal(where(s, mu, 0), sigma)`` under ``mu ~ Normal(0, 5)`` makes ``s = 1`` look
    hopeless, and every restart settled with ``s = 0`` (ELBO -46.2 against -36.7). Updated
    after the continuous ones, which then read q(s) = prior, they start from data that
    half-inform them.
    """
    summed = {
        v for e in plan.estimators if e.method.exact_given_enumerated for v in e.method.enumerated
    }
    return tuple(v for v in plan.qs if v not in summed) + tuple(v for v in plan.qs if v in summed)


def judged_by_mode(plan: Plan) -> bool:
    """Whether every factor's site parameters are by the delta method on Normal or MVN q (``Laplace``),
    or exact beside them (quadratic: the same), with no prior that reads another latent.

    A BLR step with ρ = 1 is then a Newton step on log p̄ (Khan & Rue, Sec. 4.4), and a
    smaller ρ moves the mean by ρ Λ_ρ⁻¹ ∇log p̄(m), an ascent direction (so does the
    safeguard's step, :func:`~blrppl.families.gaussian_step.positive_definite_step`, where
    the Hessian is indefinite): the ELBO guard judges steps by log p̄(m)
    (:func:`~blrppl.blr.elbo.log_joint_at_mean`). The delta ELBO peaks away from the
    mode where log p̄ is skewed (Gamma(1, 1) with exp(τ/2) on log τ: N(0.33, 1.15²)
    instead of Laplace's N(log 2, 1)), and it need not rise on the way there: its trace
    is reported, not judged (no "fell from its best" flag).
    """
    methods = [e.method for e in plan.estimators]
    delta = [m.estimator == "delta" and not m.exact and not m.enumerated for m in methods]
    exact = [not m.estimated and not m.enumerated for m in methods]
    if not (any(delta) and plan.subsample is None and all(has_point_mass(q.family) for q in plan.qs.values())):
        return False
    if all(delta):
        return True
    # A factor exact on Gaussian q is quadratic in them, its exact site parameter the delta
    # method's: a step is still Newton's (log-normal priors on the log scale beside a Gaussian
    # process likelihood). Unless a prior reads another latent (a scale: a funnel, where log p̄
    # grows without bound as the scale collapses); there the ELBO keeps a Newton start wide.
    return all(d or x for d, x in zip(delta, exact)) and not any(
        d and _hierarchical_prior(plan.graph, e.factor) for d, e in zip(delta, plan.estimators)
    )


def _hierarchical_prior(graph: Any, factor: str) -> bool:
    """Whether ``factor`` is a latent's prior whose parameters read other latents (mu, tau of
    ``theta ~ Normal(mu, tau)``), in the variables' terms (a joint block's members)."""
    node = graph.factors[factor]
    return node.kind == "prior" and len(node.block_members or node.neighbours) > 1


def _guard(plan: Plan) -> bool:
    """ELBO-guarded steps where estimated site parameters are deterministic."""
    methods = [e.method for e in plan.estimators]
    return any(m.deterministic_estimate for m in methods) and not any(m.noisy for m in methods)


def learning_rate(plan: Plan, config: Config):
    """ρ of the fit: ``config.learning_rate``, with ``"auto"`` resolved (see :class:`Config`)."""
    if config.learning_rate != "auto":
        return config.learning_rate
    if not _guard(plan):
        return AUTO_NOISY_RATE
    # ρ = 1 where the damping runs (global mode), with the cubature and with one full Gaussian
    # (its strict guard); local mode's undamped ρ = 1 circles mean-field optima (eight schools).
    cubature = any(e.method.estimator == "cubature" for e in plan.estimators)
    damped = config.mode == "global" and config.average is not True
    return 1.0 if cubature or config.blocks == "all" or damped else AUTO_NOISY_RATE


def _average(plan: Plan, config: Config) -> bool:
    """Iterate averaging where site parameters are noisy (Monte Carlo) and ρ < 1."""
    if config.average is not None:
        return bool(config.average)
    noisy = any(e.method.noisy for e in plan.estimators)
    rate = config.learning_rate
    return noisy and (callable(rate) or float(rate) < 1.0)


def _initial_sites(qs, estimators, natural) -> dict:
    """Local mode starts with all of λ on the variable's own prior factor."""
    home = {}
    for est in estimators:
        for v in est.neighbours:
            if est.factor == v or v not in home:
                home[v] = est.factor
    sites: dict = {est.factor: {} for est in estimators}
    for est in estimators:
        for v in est.neighbours:
            if home[v] == est.factor:
                sites[est.factor][v] = natural[v]
            else:
                sites[est.factor][v] = jax.tree.map(jnp.zeros_like, natural[v])
    return sites
