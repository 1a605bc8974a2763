"""States and algorithms of the functional core (blackjax ``base.py`` style)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax


class BLRState(NamedTuple):
    """Everything that changes between steps; a pytree.

    Attributes:
      natural: variable name -> λ, the natural parameters of its q.
      site_params: local mode only: factor name -> {variable name -> λ̃},
        one site parameter per (factor, variable) edge (Khan & Rue, Eq. 60);
        ``{}`` in global mode.
      params: point estimates (EM's delta method): name -> value in the
        site's constrained space.
      step: int32 scalar, the number of steps taken; learning-rate schedules
        are called with ``step + 1`` (steps count from 1).
      average: with iterate averaging (Monte Carlo estimators), the
        polynomial-decay average of λ over the steps (Shamir & Zhang 2013),
        which engines report as q at the end of a run; else None.
      elbo: with the ELBO guard (deterministic estimators), the ELBO of q
        after the last step; else None.
      anchor: with iterate averaging, the averaged λ at the last window
        boundary (convergence of a Monte Carlo fit is judged on how far
        the averaged q moved over a window of steps); else None.
      rng_key: the run's random stream: step t draws from
        ``fold_in(rng_key, t)`` and minibatch epochs from their own fold, so
        a run resumed from its state continues exactly as one longer run
        (the state's stream wins over a new call's key).
      off_target: with the ELBO guard, whether the last step left q off the rule's
        fixed points: it collapsed at every halving, or the safeguard rejected
        every λ (a target not finite), and with delta-method site parameters
        (Newton steps: ``Laplace``) also whether some variable's target Σ_f λ̃_f
        was outside its family (the safeguard's step was taken instead; the mean
        is then not a mode). The fit flags it. Else None.
      elbo_scale: Σ_f |E_q[log f]| + Σ_v |H[q_v]| at the last step's q, the size of
        the terms whose sum is the step's ELBO (0 before a first step unless guarded):
        where they cancel to within rounding (a q run off along a direction the data do
        not identify) the ELBO is noise, and the fit says so
        (:func:`blrppl.blr.checks.unresolved_elbo_error`). Carried by every state that
        ``init`` makes (one structure whichever algorithm of the plan steps it: EM's
        exact E-step too); None in a Newton start's own steps.
      damping: with ``learning_rate="auto"`` where every estimated site parameter is
        deterministic (ρ = 1, guarded; not ``blocks="all"``), the
        oscillation damping's estimate and the next step's ρ
        (:class:`blrppl.blr.damping.Damping`); else None.
    """

    natural: dict
    site_params: dict
    params: dict
    step: jax.Array
    average: Any = None
    elbo: Any = None
    rng_key: Any = None
    anchor: Any = None
    off_target: Any = None
    elbo_scale: Any = None
    damping: Any = None


class BLRInfo(NamedTuple):
    """Per-step diagnostics that are not carried to the next step.

    Attributes:
      elbo: the ELBO of q after the step (higher is better).
      rho: the learning rate the step used.
      change: for a Monte Carlo fit, at the end of each window of steps, the
        largest KL divergence between a block's averaged q now and at the
        window's start (+inf between window ends); for an exact algorithm
        (``InferenceAlgorithm.exact``), 0 once a step was taken (+inf if the
        safeguard rejected it); NaN for fits whose convergence is judged on
        the ELBO (the driver's relative change).
    """

    elbo: jax.Array
    rho: jax.Array
    change: Any = None


class InferenceAlgorithm(NamedTuple):
    """A pair of pure functions, as blackjax's ``VIAlgorithm``.

    ``init(rng_key, arrays, index=0) -> BLRState`` (``index``: a restart's, which relabels
    k-means clusters); ``step(state, arrays) -> (state,
    info)`` (randomness from the state's stream); ``elbo(rng_key, state,
    arrays) -> scalar``; ``noisy``: site parameters are Monte Carlo estimates
    (convergence is then judged on averaged iterates, not on one ELBO);
    ``sequential``: some factor's code calls LAPACK, so restarts run one after
    another (``lax.map``), never as batched LAPACK calls (see
    :func:`blrppl.graph.jaxpr.lapack_primitives`); ``chained``: some q is a
    chain, whose step passes over its length one element after another;
    ``newton``: each step also tries damped Newton steps on the ELBO and keeps
    the best (:mod:`blrppl.blr.newton`); ``newton_started``: ``init`` takes guarded
    Newton steps to the mode (a Laplace start), after which a run usually converges
    within a few steps (:data:`blrppl.compile_mode.FIRST_STEPS`).
    ``start(rng_key, arrays, random, index) -> (natural, params)`` and
    ``finish(rng_key, natural, params, arrays) -> BLRState`` split ``init`` in
    two (``init`` is ``finish`` of ``start``; ``random=True`` gives a random
    restart's start), where a random restart's ``init`` is the same
    ``finish`` of its own start (else None): the restarts' starts are then
    one ``finish`` (see :mod:`blrppl.blr.serial_restarts`).
    ``exact``: one step from any state is the fixed point (conjugate Bayes,
    :func:`blrppl.blr.build.exact_after_one_step`), so a run with ``tol``
    stops after the first step it took instead of confirming it twice.
    ``blank(arrays) -> λ``: a valid λ made without a pass over the data, which
    an exact run's loop starts from (its step never reads the start).
    ``exact_targets``: the variables whose step is their exact coordinate maximum
    (ρ = 1, every site parameter exact): a step whose target for one of them is
    outside its family reports an ELBO of +inf, its supremum
    (:func:`blrppl.blr.checks.unbounded_elbo_error`); ``unbounded_sites(state,
    arrays)``: whether each of them (sorted by name) has its target outside the
    family at ``state``, to name it in that error.
    ``arrays`` is the plan's data
    (:class:`~blrppl.estimators.base.PlanArrays`), an argument so that one
    compiled program fits any data set of the same shapes.
    """

    init: Callable[..., BLRState]
    step: Callable[[BLRState, Any], tuple[BLRState, BLRInfo]]
    elbo: Callable[[jax.Array, BLRState, Any], Any]
    noisy: bool = False
    sequential: bool = False
    chained: bool = False
    newton: bool = False
    start: Optional[Callable[[jax.Array, Any, Any, Any], tuple[Any, Any]]] = None
    finish: Optional[Callable[[jax.Array, Any, Any, Any], BLRState]] = None
    exact: bool = False
    blank: Optional[Callable[[Any], Any]] = None
    exact_targets: frozenset = frozenset()
    unbounded_sites: Optional[Callable[[BLRState, Any], jax.Array]] = None
    newton_started: bool = False
