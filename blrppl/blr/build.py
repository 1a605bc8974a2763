"""Specialise the Bayesian learning rule to one traced model.

``build_blr`` closes over the static pieces (each variable's q, each factor's
estimator, the mode and the schedule) and returns an
:class:`~blrppl.blr.state.InferenceAlgorithm` of pure functions. Python loops
over the (static) graph unroll when the step is traced; plates are handled
inside each estimator's array arithmetic.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp

from blrppl.blr.elbo import elbo as elbo_fn
from blrppl.blr.state import BLRInfo, BLRState, InferenceAlgorithm
from blrppl.blr.update import local_update, safe_global_update
from blrppl.blr.variational import VariableQ
from blrppl.estimators.base import FactorEstimator


def mean_params(qs: Mapping[str, VariableQ], natural: Mapping[str, Any]) -> dict:
    """μ = ∇A(λ) for every variable."""
    return {v: qs[v].family.mean_params(natural[v]) for v in natural}


def site_parameters(
    rng_key: jax.Array,
    estimators: Sequence[FactorEstimator],
    mean: Mapping[str, Any],
    params: Mapping[str, Any],
    variables: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """λ̃_f(μ) for every factor touching ``variables``: variable -> {factor -> λ̃}."""
    out: dict[str, dict[str, Any]] = {v: {} for v in variables}
    for i, est in enumerate(estimators):
        touched = [v for v in est.neighbours if v in out]
        if not touched:
            continue
        _, grads = est.estimate(jax.random.fold_in(rng_key, i), mean, params)
        for v in touched:
            out[v][est.factor] = grads[v]
    return out


def build_blr(
    qs: Mapping[str, VariableQ],
    estimators: Sequence[FactorEstimator],
    *,
    rho: Callable[[jax.Array], jax.Array],
    init_natural: Callable[[jax.Array], dict],
    init_params: Optional[Mapping[str, Any]] = None,
    mode: str = "global",
    schedule: str = "sequential",
    order: Optional[Sequence[str]] = None,
    m_step: Optional[Callable] = None,
    average: bool = False,
    guard: bool = False,
) -> InferenceAlgorithm:
    """Build ``init`` and ``step`` for one model.

    Args:
      qs: variable name -> its q.
      estimators: one per factor (priors included).
      rho: the learning-rate schedule, called with the step number (from 1).
      init_natural: ``rng_key -> natural`` parameters to start from.
      init_params: initial point estimates (EM), name -> value.
      mode: ``"global"`` (Eq. 58) or ``"local"`` (Eq. 60).
      schedule: ``"sequential"`` (coordinate-wise over variables, in
        ``order``) or ``"parallel"`` (all variables from the same q).
      order: the sequential order (default: trace order).
      m_step: ``(rng_key, natural, params) -> params``, EM's maximisation of
        E_q[log p] over the point estimates, run after the q updates.
      average: keep the polynomial-decay average of λ in ``state.average``
        (weights ~ t^3, so the first half of a run carries 1/16 of the
        weight): the noise of Monte Carlo site parameters averages out at
        the rate of the steps rather than of ρ.
      guard: with deterministic estimated site parameters (quadrature,
        delta), retry a step with ρ/2, ρ/4, ... when the ELBO would drop by more
        than ``GUARD_SLACK`` (relative, plus 1 nat): a Newton-type step where
        log f is not concave can overshoot by orders of magnitude. The ELBO
        of the last step is kept in ``state.elbo``.

    Returns:
      The :class:`InferenceAlgorithm`.
    """
    if mode not in ("global", "local"):
        raise ValueError(f"mode must be 'global' (Eq. 58) or 'local' (Eq. 60), got {mode!r}.")
    if schedule not in ("sequential", "parallel"):
        raise ValueError(f"schedule must be 'sequential' or 'parallel', got {schedule!r}.")
    estimators = tuple(estimators)
    order = tuple(order) if order is not None else tuple(qs)
    init_params = dict(init_params or {})

    def init(rng_key: jax.Array) -> BLRState:
        natural = init_natural(rng_key)
        sites: dict = {}
        if mode == "local":
            sites = _initial_sites(qs, estimators, natural)
        state = BLRState(
            natural=natural,
            site_params=sites,
            params=dict(init_params),
            step=jnp.zeros((), jnp.int32),
            average=natural if average else None,
        )
        if guard:
            state = state._replace(elbo=elbo(rng_key, state))
        return state

    def update(rng_key, natural, sites, params, variables, r):
        mean = mean_params(qs, natural)
        messages = site_parameters(rng_key, estimators, mean, params, variables)
        natural, sites = dict(natural), {f: dict(s) for f, s in sites.items()}
        for v in variables:
            if mode == "global":
                natural[v], _ = safe_global_update(qs[v].family, natural[v], list(messages[v].values()), r)  # Eq. 58
            else:
                current = {f: sites[f][v] for f in messages[v]}
                natural[v], new = local_update(current, messages[v], r)  # Eq. 60
                for f, site in new.items():
                    sites[f][v] = site
        return natural, sites

    def attempt(rng_key: jax.Array, state: BLRState, r: jax.Array) -> tuple[BLRState, jax.Array]:
        t = state.step + 1
        update_key, m_key, elbo_key = jax.random.split(rng_key, 3)
        natural, sites, params = state.natural, state.site_params, state.params
        if schedule == "parallel":
            natural, sites = update(update_key, natural, sites, params, order, r)
        else:
            for i, v in enumerate(order):
                natural, sites = update(jax.random.fold_in(update_key, i), natural, sites, params, (v,), r)
        if m_step is not None:
            params = m_step(m_key, natural, params)
        running = state.average
        if average:
            running = polynomial_average(running, natural, t)
        new_state = BLRState(natural=natural, site_params=sites, params=params, step=t, average=running, elbo=state.elbo)
        value = elbo(elbo_key, new_state)
        return new_state._replace(elbo=value if guard else None), value

    def step(rng_key: jax.Array, state: BLRState) -> tuple[BLRState, BLRInfo]:
        r = jnp.asarray(rho(state.step + 1), dtype=jnp.result_type(float))
        new_state, value = attempt(rng_key, state, r)
        if guard and state.elbo is not None:
            # A step whose (exact) ELBO collapses is retried with ρ/2, ρ/4, ...
            def collapsed(value):
                drop = state.elbo - value
                return ~jnp.isfinite(value) | (drop > GUARD_SLACK * (1.0 + jnp.abs(state.elbo)))

            def retry(carry):
                k, _, _, _ = carry
                r_k = r * 0.5**k
                candidate, v = attempt(rng_key, state, r_k)
                return k + 1, candidate, v, r_k

            _, new_state, value, r = jax.lax.while_loop(
                lambda c: (c[0] <= MAX_GUARD_HALVINGS) & collapsed(c[2]), retry, (jnp.ones((), jnp.int32), new_state, value, r)
            )
        return new_state, BLRInfo(elbo=value, rho=r)

    def elbo(rng_key: jax.Array, state: BLRState) -> jax.Array:
        return elbo_fn(rng_key, qs, estimators, state.natural, state.params)

    return InferenceAlgorithm(init=init, step=step, elbo=elbo)


AVERAGE_POWER = 3.0
GUARD_SLACK = 1e-3
MAX_GUARD_HALVINGS = 12


def polynomial_average(running: Any, current: Any, t: jax.Array) -> Any:
    """Polynomial-decay averaging (Shamir & Zhang 2013): weight (η + 1)/(t + η), η = 3."""
    w = (AVERAGE_POWER + 1.0) / (t + AVERAGE_POWER)
    return jax.tree.map(lambda a, x: (1.0 - w) * a + w * x, running, current)


def averaged(state: BLRState) -> BLRState:
    """The state with its averaged λ as q (unchanged without averaging)."""
    if state.average is None:
        return state
    return state._replace(natural=state.average)


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
