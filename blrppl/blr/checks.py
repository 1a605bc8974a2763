"""Checks of a finished fit that turn a doubtful answer into a flag on the result.

:func:`boundary_estimates`: a point estimate (EM's M-step) whose likelihood
is maximised on the boundary of its support (a variance component at 0, as
eight schools' tau on its original data) is approached ever more slowly and
never reached; returning the last iterate as if it were an interior optimum
would be a confident wrong answer. The bound is evaluated with the parameter
moved far towards each boundary (the E-step alone, at fixed parameters): if
it is no lower there, the estimate is flagged.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from blrppl.blr import driver
from blrppl.compile_mode import SizeDependentJit, recently_used, to_host
from blrppl.errors import ModelError

#: How far towards a boundary the parameter moves on its unconstrained space.
BOUNDARY_SHIFT = 10.0
E_STEPS = 30


def _directions(constraint: Any) -> list[tuple[float, str]]:
    """(+1 or -1 on the unconstrained space, boundary in words) for each boundary of a support."""
    while isinstance(constraint, constraints._IndependentConstraint):
        constraint = constraint.base_constraint
    if isinstance(constraint, (constraints._Positive, constraints._GreaterThan)):
        return [(-1.0, "its lower bound")]
    if isinstance(constraint, constraints._LessThan):
        return [(1.0, "its upper bound")]
    if isinstance(constraint, constraints._Interval):
        return [(-1.0, "its lower bound"), (1.0, "its upper bound")]
    return []


def boundary_estimates(plan: Any, e_step: Any, state: Any, elbo: float) -> tuple[str, ...]:
    """Messages for the point estimates whose bound is no lower at a boundary of their support.

    Every trial (one estimate moved towards one boundary) runs its E-steps in one
    compiled, vmapped call (:func:`_bounds_program`).

    Args:
      plan: the fit's plan; ``e_step`` its algorithm without an M-step.
      state: the fit's final state; ``elbo``: its final bound.
    """
    trials = _boundary_trials(plan, state.params)
    if not trials:
        return ()
    program = _bounds_program(e_step, tuple((name, direction) for name, direction, _ in trials), plan.param_transforms)
    bounds, moved = to_host(program(state, plan.arrays))  # one transfer
    flags = []
    for (name, _, words), bound, value in zip(trials, bounds, moved):
        bound = float(bound)
        if bound >= elbo - 1e-9 * (1.0 + abs(elbo)):
            flags.append(
                f"site {name!r}: the likelihood is no lower with the estimate moved towards {words} "
                f"({bound:.6g} at {float(value):.3g} vs {elbo:.6g} at the estimate): its maximum "
                "lies on the boundary, where EM converges ever more slowly and the fitted q is degenerate; "
                "treat the estimate as that boundary value, or put a prior on the site (a latent sample site)"
            )
    return tuple(flags)


def lower_boundary_check(plan: Any, e_step: Any, state: Any, arrays: Any) -> Any:
    """:func:`boundary_estimates`'s program lowered for a fit's final state (its types), to
    compile beside the fit's own programs (the driver's ``after``), or None where no estimate
    has a boundary: an EM fit's first call then compiles nothing after its run (an AR(1)'s
    0.36 s of trace, lowering and compilation)."""
    trials = _boundary_trials(plan, state.params)
    if not trials:
        return None
    program = _bounds_program(e_step, tuple((name, direction) for name, direction, _ in trials), plan.param_transforms)
    return program.lower(state, arrays)


def _boundary_trials(plan: Any, names: Any) -> tuple:
    """``(name, direction, words)`` for each point estimate in ``names`` and each boundary of its support."""
    return tuple(
        (name, direction, words)
        for name in names
        if plan.graph.params.get(name) is not None and plan.param_transforms.get(name) is not None
        for direction, words in _directions(plan.graph.params[name].constraint)
    )


_PROGRAMS: dict = {}


def _bounds_program(e_step: Any, trials: tuple, transforms: Mapping[str, Any]) -> Any:
    """``(state, arrays) -> (bounds, moved)``, compiled once per E-step algorithm and trials.

    Trial i moves estimate ``trials[i][0]`` by ``trials[i][1] * BOUNDARY_SHIFT`` on its
    unconstrained space, keeps the others, and runs up to ``E_STEPS`` E-steps from the
    fit's q (``tol=0``: until the bound moves by rounding only; one step where the E-step
    is exact); ``bounds[i]`` is its last bound and ``moved[i]`` the moved value's first
    element (for the message). The transforms are the plan's (fixed by the algorithm's
    signature).
    """

    def bounds(state, arrays):
        params = []
        for name, direction in trials:
            transform = transforms[name]
            params.append({**state.params, name: transform(transform.inv(state.params[name]) + direction * BOUNDARY_SHIFT)})
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *params)
        states = jax.vmap(lambda p: state._replace(params=p, step=jnp.zeros((), jnp.int32)))(stacked)
        moved = jnp.stack([jnp.ravel(p[name])[0] for p, (name, _) in zip(params, trials)])
        return driver.last_elbos(e_step, arrays, states, E_STEPS, 0.0), moved

    return recently_used(
        _PROGRAMS, (e_step, trials), lambda: SizeDependentJit(bounds, data_argnum=1, one_shot=True), _MAX_PROGRAMS
    )


_MAX_PROGRAMS = 32


#: Fewest steps before a steady climb of the ELBO can be told from a slow convergence.
CLIMB_MIN_STEPS = 40


def off_target(state: Any) -> tuple[str, ...]:
    """A flag when the last step was not the rule's (``state.off_target``): its target Σ_f λ̃_f
    was outside some q's family (delta method), or the ELBO guard rejected every halving of
    it, or the safeguard every λ (a target not finite: the step left q where it was, and an
    ELBO that stays put is no convergence).

    At a fixed point of the rule λ = Σ_f λ̃_f(μ), a valid q; a target outside
    the family was replaced by the safeguard's step (the improved Gaussian step,
    a halved ρ), so q is not a fixed point. With the delta method (``Laplace``)
    the Hessian of the log density at the mean is then not negative definite:
    the mean is no mode (the density may have none: an improper posterior). A
    step the guard rejects at every ρ leaves q creeping: ``Laplace`` judges its
    Newton steps by log p̄(m), which rises along them, but a delta-method fit with
    exact factors beside judges by the ELBO, whose delta-method part
    (log f(m) + ½ tr(H Σ)) peaks away from the mode where log p is skewed.
    """
    flag = getattr(state, "off_target", None)
    if flag is None or not bool(np.any(np.asarray(flag))):
        return ()
    return (
        "the last step was not the rule's: its target (the sum of the site parameters) was not a valid q, "
        "or the ELBO guard rejected every halving of it; q is not a fixed point of the rule, and with the "
        "delta method (Laplace) the mean is not a mode (its Hessian is not negative definite, the posterior "
        "may have none, e.g. a factor that grows like exp(c x^2); or the steps stall where the log "
        "density is skewed); run longer with tol=..., and if this stays, check the model's factors and "
        "priors, or fit with NonConjugateVI",
    )


AVERAGE_DRIFT_NATS = 10.0
"""A Monte Carlo fit whose averaged q is this many nats (KL, either way) from its last iterate is flagged."""


def drifted_average(qs: Mapping[str, Any], state: Any) -> tuple[str, ...]:
    """A flag when an averaged fit's reported q (the average of its iterates) is far from its last
    iterate: a KL over ``AVERAGE_DRIFT_NATS`` either way for some Gaussian block.

    Iterate averaging (Monte Carlo site parameters) averages natural parameters, so one early
    iterate of enormous precision (a first step whose estimates overflowed under a broad start)
    outweighs every later one for thousands of steps: the iterates settle while the reported q
    stays pinned where that iterate was. Converged averages sit within Monte Carlo noise of their
    iterate (a fraction of a nat).
    """
    average = getattr(state, "average", None)
    if average is None:
        return ()
    far = []
    for v, q in qs.items():
        if not q.family.gaussian or q.family.chain:
            continue
        kl = _gaussian_kl(average[v], state.natural[v])
        if kl is not None and kl > AVERAGE_DRIFT_NATS:
            far.append((v, kl))
    if not far:
        return ()
    v, kl = max(far, key=lambda item: item[1])
    return (
        f"the reported q of {v!r} (the average of the Monte Carlo iterates) is {kl:.3g} nats (KL) from the last "
        "iterate: early iterates dominate the average (a first step whose estimates were extreme under a broad "
        "start, or a run that has not settled), so the average is not the fit's answer; run longer, start "
        "elsewhere (init=...), or use a deterministic estimator (estimator='cubature' or 'delta')",
    )


def _gaussian_kl(first: Any, second: Any) -> Optional[float]:
    """max over blocks of KL(q1 || q2) and KL(q2 || q1) of two Gaussian λ on the host (None if not proper)."""
    def moments(lam):
        if hasattr(lam, "x_sq"):
            precision = -2.0 * np.asarray(lam.x_sq, float)[..., None, None]
            x = np.asarray(lam.x, float)[..., None]
        else:
            xxt = np.asarray(lam.xxT, float)
            precision, x = -(xxt + np.swapaxes(xxt, -1, -2)), np.asarray(lam.x, float)
        return precision, np.linalg.solve(precision, x[..., None])[..., 0]

    def kl(p0, m0, p1, m1):
        d = m0.shape[-1]
        cov0 = np.linalg.inv(p0)
        diff = (m1 - m0)[..., None]
        _, logdet0 = np.linalg.slogdet(p0)
        _, logdet1 = np.linalg.slogdet(p1)
        quad = (np.swapaxes(diff, -1, -2) @ p1 @ diff)[..., 0, 0]
        return 0.5 * (np.trace(p1 @ cov0, axis1=-2, axis2=-1) + quad - d + logdet0 - logdet1)

    with np.errstate(all="ignore"):
        try:
            p0, m0 = moments(first)
            p1, m1 = moments(second)
            both = np.maximum(kl(p0, m0, p1, m1), kl(p1, m1, p0, m0))
        except np.linalg.LinAlgError:
            return None
    return float(np.max(both)) if np.size(both) and np.all(np.isfinite(both)) else None


def steady_climb(elbo: Any, stopped: bool) -> tuple[str, ...]:
    """A flag when an unfinished run's ELBO was still rising at an undiminished rate.

    A fit converging towards an interior optimum gains less with every step
    (increments decay geometrically); a q drifting towards a boundary of its
    support, where the likelihood is unbounded (a scale collapsing onto
    identical observations under a prior that stays positive at zero), gains
    about the same amount per step for ever. When the run did not stop, its
    last quarter gained at least 70% as much per step as the quarter before,
    every step of it gained, and the last half gained over one nat, the
    answer is flagged instead of being returned as a slow convergence.
    """
    elbo = np.asarray(elbo, dtype=float)
    n = int(elbo.size)
    if stopped or n < CLIMB_MIN_STEPS or not bool(np.all(np.isfinite(elbo))):
        return ()
    quarter = n // 4
    gains = np.diff(elbo[-2 * quarter - 1 :])
    before, last = gains[:quarter], gains[quarter:]
    rate_before, rate_last = float(np.mean(before)), float(np.mean(last))
    climbing = bool(np.all(last > 0)) and rate_before > 0 and rate_last >= 0.7 * rate_before
    if not climbing or float(elbo[-1] - elbo[-2 * quarter - 1]) <= 1.0:
        return ()
    return (
        f"the ELBO was still rising steadily when the run ended ({rate_last:.3g} per step over the last "
        f"{len(last)} steps, not slowing down): the fit had not converged, and a climb that does not slow "
        "is the signature of a q drifting towards a boundary of its support (an improper posterior, e.g. a "
        "scale collapsing onto identical observations); run longer with tol=... to see whether it settles, "
        "and if it does not, check the data or give the scale a prior that vanishes at zero",
    )


#: A deterministic run whose final ELBO is this far below its best (in nats, plus ``FALL_RELATIVE``
#: of the best's magnitude) ended away from any optimum.
FALL_NATS = 1.0
FALL_RELATIVE = 1e-2


def fell_from_best(qs: Mapping[str, Any], natural: Mapping[str, Any], elbo: Any) -> tuple[str, ...]:
    """A flag when a deterministic run's ELBO ended far below the best it reached.

    With exact or quadrature site parameters every step of the rule is a (damped)
    coordinate or natural-gradient ascent step, so a converging fit's ELBO settles near
    its best. One that fell from it by more than ``FALL_NATS + FALL_RELATIVE * |best|``
    did not converge: it oscillates or drifts (seen under jax 0.11 for a scale q sliding
    onto identical observations under a HalfNormal prior, ELBO 169 -> 103, with no q
    collapsed enough for :func:`improper_posterior_error`). The flag names the sites
    whose q ran off towards a boundary of their support, if any.
    """
    elbo = np.asarray(elbo, dtype=float)
    finite = elbo[np.isfinite(elbo)]
    if finite.size < 2:
        return ()
    best, last = float(np.max(finite)), float(finite[-1])
    if best - last <= FALL_NATS + FALL_RELATIVE * abs(best):
        return ()
    natural = jax.tree.map(np.asarray, natural)
    runaway = runaway_sites(qs, natural)
    where = (
        f"; q of {', '.join(repr(v) for v in runaway)} ran off towards a boundary of its support (centred "
        f"beyond e^-{RUNAWAY_LOC:g} of its unit on the unconstrained space), the signature of an improper "
        "posterior (e.g. a scale collapsing onto identical observations under a prior that stays positive "
        "at zero): check the data, or give the site a prior that vanishes at the boundary"
        if runaway
        else ": the steps oscillate or diverge; try a smaller learning_rate, another estimator, or more restarts"
    )
    return (
        f"the ELBO ended at {last:.6g}, {best - last:.3g} below the best it reached ({best:.6g}, step "
        f"{int(np.argmax(elbo == best)) + 1}): the fit is not at an optimum{where}.",
    )


#: A Gaussian q whose precision passes this has collapsed to a point (on q's space).
COLLAPSED_PRECISION = 1e16

#: An ELBO that was once this many times (1 + |final ELBO|) above its final value is numerical noise.
ERRATIC_RATIO = 1e3

#: A Gaussian q on a support's unconstrained space centred this far out (a scale of e^-15 of
#: its unit) has run off towards the boundary.
RUNAWAY_LOC = 15.0


def erratic(elbo: np.ndarray) -> bool:
    """Whether the ELBO trace jumped far above where it ended (its terms cancel catastrophically).

    A fit whose q collapsed evaluates the ELBO as differences of numbers near
    1 / variance: their rounding, not the model, then sets its value, which
    jumps by orders of magnitude from one step to the next. How far and
    where depends on the rounding of the compiled arithmetic, so a
    collapsed q with such a trace is a divergence whatever the final value.
    """
    finite = elbo[np.isfinite(elbo)]
    if finite.size < 2:
        return False
    last = float(finite[-1])
    return float(np.max(finite)) > last + ERRATIC_RATIO * (1.0 + abs(last))


def vanishing_sites(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> tuple[str, ...]:
    """A flag naming the variables on a transformed support whose q is centred below
    ``-RUNAWAY_LOC`` on the unconstrained space (e^-15 of the site's unit: a scale or rate that
    collapsed onto its lower boundary), whatever the ELBO did: in float32 such a fit can end with
    a flat, finite ELBO (every step rejected), which no other check questions."""
    low = runaway_sites(qs, natural, side=-1)
    if not low:
        return ()
    return (
        f"q of {', '.join(repr(v) for v in low)} is centred below e^-{RUNAWAY_LOC:g} of its unit on the "
        "unconstrained space, at the lower boundary of its support: the signature of an improper posterior "
        "(e.g. a scale collapsing onto identical observations under a prior that stays positive at zero); "
        "check the data, or give the site a prior that vanishes at the boundary (or rescale data in extreme units)",
    )


def runaway_sites(qs: Mapping[str, Any], natural: Mapping[str, Any], side: int = 0) -> list[str]:
    """Gaussian variables on a transformed support whose q is centred past ``RUNAWAY_LOC``
    (``side``: -1 below ``-RUNAWAY_LOC`` only, +1 above ``RUNAWAY_LOC`` only, 0 either)."""
    found = []
    for v, q in qs.items():
        if not q.family.gaussian or q.family.chain or q.transform is None:
            continue
        loc = _gaussian_moments(natural[v])[0]
        if loc is None:
            continue
        with np.errstate(all="ignore"):
            past = np.abs(loc) if side == 0 else side * np.asarray(loc)
            if bool(np.any(past > RUNAWAY_LOC)):
                found.append(v)
    return found


def sound_members(
    qs: Mapping[str, Any], natural: Mapping[str, Any], last_elbo: np.ndarray, elbo_scale: Any = None,
    peak_elbo: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Per member of a batch of fits (λ and final ELBOs with a leading axis B, on the host):
    whether its q is finite with no Gaussian q collapsed and its final ELBO finite, at most
    1e30 and resolved (``elbo_scale``: ``BLRState.elbo_scale`` per member, or None), and the
    highest it reached (``peak_elbo``) at most 1e30, so that :func:`improper_posterior_error` and
    :func:`unresolved_elbo_error` cannot fail it (the others are checked one by one)."""
    size = len(last_elbo)
    sound = np.isfinite(last_elbo) & (last_elbo <= 1e30)
    if peak_elbo is not None:
        sound &= ~(np.asarray(peak_elbo) > 1e30)
    if elbo_scale is not None:
        with np.errstate(all="ignore"):
            noise = np.asarray(elbo_scale) * float(np.finfo(last_elbo.dtype).eps)
            sound &= ~(np.isfinite(noise) & (noise > np.maximum(1.0, np.abs(last_elbo))))
    for v, q in qs.items():
        for leaf in jax.tree.leaves(natural[v]):
            sound &= np.isfinite(np.reshape(leaf, (size, -1))).all(1)
        if q.family.gaussian and not q.family.chain:
            lam = natural[v]
            precision = -2.0 * (lam.x_sq if hasattr(lam, "x_sq") else np.diagonal(lam.xxT, axis1=-2, axis2=-1))
            sound &= (np.reshape(precision, (size, -1)) <= COLLAPSED_PRECISION).all(1)
    return sound


def all_finite(array: np.ndarray) -> bool:
    """Whether every entry of ``array`` is finite: a sum (no copy; a NaN or inf makes it NaN or
    inf), looked at entry by entry only where the sum is not finite (an overflow or a bad entry).
    A long chain's fit is checked in a pass over its λ that allocates nothing."""
    array = np.asarray(array)  # the method, not np.sum: a small model's check is a few of these
    return bool(np.isfinite(array.sum())) or bool(np.isfinite(array).all())


def collapsed_sites(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> list[str]:
    """Gaussian variables whose q collapsed (precision overflowing or not finite), scales first."""
    found = []
    for v, q in qs.items():
        if not q.family.gaussian or q.family.chain:
            continue
        lam = natural[v]
        precision = -2.0 * (lam.x_sq if hasattr(lam, "x_sq") else np.diagonal(lam.xxT, axis1=-2, axis2=-1))
        # Few numpy calls: on a small model's second fit this check costs more than its step.
        if not (np.isfinite(lam.x).all() and (np.isfinite(precision) & (precision <= COLLAPSED_PRECISION)).all()):
            found.append(v)
    return sorted(found, key=lambda v: qs[v].transform is None)


def invalid_exact_posterior_error(qs: Mapping[str, Any], elbo: Any) -> Any:
    """A :class:`~blrppl.ModelError` when an exact run's step was rejected, else None.

    With conjugate factors one step with ρ = 1 is the exact posterior (Khan & Rue,
    Sec. 5.1); the step marks a λ that fails its family's check with a NaN ELBO
    (:func:`blrppl.blr.build.build_blr`). Its λ is then the safeguard's fallback, not the
    posterior, and is never returned as one.
    """
    elbo = np.asarray(elbo)
    if not elbo.size or bool(np.isfinite(elbo[-1])):
        return None
    names = list(qs)
    return ModelError(
        f"site {names[0]!r}: the exact posterior of {names} is not a valid q (its natural parameters fail "
        "the family's check: the data do not identify it, or rounding broke it, e.g. float32 on a long "
        "chain); check the data and priors, or fit in float64 (jax_enable_x64)."
    )


def fit_error(
    qs: Mapping[str, Any], natural: Mapping[str, Any], elbo: Any, exact: bool, exact_targets: Any,
    culprits: Optional[Callable[[], list]] = None, elbo_scale: Any = None,
) -> Any:
    """Why a finished fit is not an answer, as a :class:`~blrppl.ModelError`, or None: an exact
    run's rejected posterior (``exact``), an ELBO without a maximum (``exact_targets``:
    ``InferenceAlgorithm.exact_targets``; ``culprits``: see :func:`unbounded_elbo_error`), a
    divergence (:func:`improper_posterior_error`), or an ELBO that is rounding noise
    (``elbo_scale``: :func:`unresolved_elbo_error`)."""
    return (
        (invalid_exact_posterior_error(qs, elbo) if exact else None)
        or unbounded_elbo_error(exact_targets, elbo, culprits)
        or improper_posterior_error(qs, natural, elbo)
        or unresolved_elbo_error(qs, natural, elbo, elbo_scale)
    )


def unresolved_elbo_error(qs: Mapping[str, Any], natural: Mapping[str, Any], elbo: Any, elbo_scale: Any) -> Any:
    """A :class:`~blrppl.ModelError` when a fit's last ELBO is rounding noise, else None.

    ``elbo_scale`` (``BLRState.elbo_scale``, guarded fits) is the size of the terms the
    ELBO sums, Σ_f |E_q[log f]| + Σ_v |H[q_v]|; their sum is known only to that times the
    dtype's epsilon. Where that noise is over a nat and over |ELBO|, the ELBO has no
    significant digit: every comparison the fit made (the guard's, convergence's) read
    noise. It happens where q ran off along a direction on which the factors cancel, huge
    and opposite (an improper posterior: a prior cancelled by a factor, or flat, on a
    direction the data do not identify, such as a logistic regression on separable data,
    where q's mean goes to 1e19 and its ELBO, 1e39 - 1e39, reads 0).
    """
    elbo = np.asarray(elbo)
    if elbo_scale is None or not elbo.size or not np.issubdtype(elbo.dtype, np.floating):
        return None
    last, size = float(elbo[-1]), float(np.asarray(elbo_scale))
    noise = size * float(np.finfo(elbo.dtype).eps)
    if not (np.isfinite(last) and np.isfinite(size)) or noise <= max(1.0, abs(last)):
        return None
    site = (_farthest_sites(qs, natural) + list(qs))[0]
    loc, sd = _location_and_spread(qs[site], natural[site])
    where = f" (q of {site!r}: mean up to {loc:.3g} in size, sd up to {sd:.3g})" if np.isfinite(loc + sd) else ""
    return ModelError(
        f"site {site!r}: the fit's ELBO ({last:.4g}) is rounding noise: it is the sum of terms of total size "
        f"{size:.3g}, which cancel to within {noise:.3g} in {elbo.dtype}, so the fit compared noise and its q"
        f"{where} is no answer. q ran off (its mean, its spread or both) along a "
        "direction on which the model's factors cancel: the posterior is improper (a flat prior, or a factor "
        "that cancels the prior, on a direction the data do not identify, e.g. a logistic regression on "
        "separable data); give the site a proper prior that the other factors do not cancel."
    )


def _location_and_spread(q: Any, lam: Any) -> tuple[float, float]:
    """The largest |location| and the largest sd of a Gaussian q on the host (nan for others)."""
    if not q.family.gaussian or q.family.chain:
        return float("nan"), float("nan")
    loc, var = _gaussian_moments(lam)
    if loc is None or not np.size(loc):
        return float("nan"), float("nan")
    with np.errstate(all="ignore"):
        return float(np.max(np.abs(loc))), float(np.sqrt(np.max(var)))


def _gaussian_moments(lam: Any) -> tuple[Any, Any]:
    """Means and variances of a Gaussian λ (Normal: ``x``, ``x_sq``; MVN: ``x``, ``xxT``) on the
    host, or ``(None, None)`` where its precision is singular."""
    with np.errstate(all="ignore"):
        if hasattr(lam, "x_sq"):
            precision = -2.0 * np.asarray(lam.x_sq)
            return np.asarray(lam.x) / precision, 1.0 / precision
        xxt = np.asarray(lam.xxT)
        try:
            cov = np.linalg.inv(-(xxt + np.swapaxes(xxt, -1, -2)))
        except np.linalg.LinAlgError:
            return None, None
        return (cov @ np.asarray(lam.x)[..., None])[..., 0], np.diagonal(cov, axis1=-2, axis2=-1)


def _farthest_sites(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> list[str]:
    """Gaussian variables by how far their q reaches from 0 (|location| + sd), farthest first."""
    reach = {v: sum(_location_and_spread(q, natural[v])) for v, q in qs.items()}
    return sorted((v for v, r in reach.items() if np.isfinite(r)), key=lambda v: -reach[v])


def unbounded_elbo_error(targets: Any, elbo: Any, culprits: Optional[Callable[[], list]] = None) -> Any:
    """A :class:`~blrppl.ModelError` when a fit's last step found the ELBO without a maximum, else None.

    With exact site parameters and ρ = 1, a variable's step is its coordinate
    maximum of the ELBO (Khan & Rue, Sec. 5.3: VMP), λ = Σ_f λ̃_f. Each
    E_q[log f] is affine in that q's μ, so where λ is outside the family the
    ELBO grows without bound in that q (its log normaliser is infinite): the
    conditional posterior of the variable is improper and VI has no solution.
    The step reports +inf, the supremum (``InferenceAlgorithm.exact_targets``:
    ``targets``); the safeguard's valid replacement would be a confident wrong
    answer. ``culprits``: called only when the error is raised, the variables whose
    target is outside the family at the fit's last state, to name them (else every
    candidate is named).
    """
    elbo = np.asarray(elbo)
    if not targets or not elbo.size or float(elbo[-1]) != np.inf:
        return None
    names = (culprits() if culprits is not None else None) or sorted(targets)
    which = repr(names[0]) if len(names) == 1 else f"one of {names}"
    return ModelError(
        f"site {names[0]!r}: the ELBO has no maximum: the coordinate update of {which} (the sum of its "
        "factors' exact site parameters) is not a valid q, so its conditional posterior is improper "
        "(e.g. a factor such as numpyro.factor(..., c * x**2) with c > 0 that outgrows the prior, or a "
        "flat prior the data do not identify); check the model's factors and priors."
    )


FELL_FAR = 1e3
"""A fit whose last ELBO is below its best by more than this times (1 + |best|) diverged, whatever
else it shows: a Monte Carlo fit of UCBadmit's joint block (16 draws, one key in four) fell from
-7.9e3 to -1.4e29 in one step and stayed there, and was returned with flags. A noisy fit's ELBO
wanders by a few per cent, a deterministic one's by rounding."""


def improper_posterior_error(qs: Mapping[str, Any], natural: Mapping[str, Any], elbo: Any) -> Any:
    """A :class:`~blrppl.ModelError` when the fit diverged, naming the collapsing site, else None.

    An ELBO that grows without bound (to +inf) while a q collapses to a point
    means the likelihood is unbounded there: the posterior is improper (a
    scale collapsing onto identical observations, an improper prior the
    data do not identify). A collapsing q whose ELBO fell before it stopped
    being finite, or an ELBO that ended more than ``FELL_FAR`` times its size
    below its best, is a divergence of the steps, said so (not an improper
    posterior). A run that ended with a q or an ELBO that is not
    finite for another reason is reported too, never returned.
    """
    # On the host, in numpy: a few small arrays, read once (eager jax ops here cost more than the fit).
    natural = jax.tree.map(np.asarray, natural)
    elbo = np.asarray(elbo)
    finite_q = all(all_finite(x) for x in jax.tree.leaves(natural))
    collapsed = collapsed_sites(qs, natural)
    # No real model has an ELBO beyond 1e30: with a collapsed q it is the same divergence,
    # stopped short of +inf by the ELBO guard (which rejects steps that overflow).
    bound = 1e30 if collapsed else 1e100
    last = float(elbo[-1]) if elbo.size else 0.0  # a Python float: 1e100 overflows a float32 comparison
    # The peak, not only the end: where a diverging run stops climbing is rounding (a guard that
    # rejected every later step left one fit at 2e28 after it had reached 2.5e30).
    reached = elbo[np.isfinite(elbo)]
    peak = float(np.max(reached)) if reached.size else last
    grows = bool(elbo.size) and (max(last, peak) > bound)
    shaky = collapsed and (erratic(elbo) or not bool(np.all(np.isfinite(elbo))))
    fell = reached.size and reached[-1] < peak - 1e-3 * (1.0 + abs(peak))
    fell_far = reached.size and reached[-1] < peak - FELL_FAR * (1.0 + abs(peak))
    if not grows and not erratic(elbo) and ((shaky and fell) or fell_far):
        # The ELBO fell before it stopped being finite, or ended orders of magnitude below its best:
        # the steps ran away from q's best, which says nothing of the posterior (an improper one's
        # ELBO climbs until it overflows).
        site = (runaway_sites(qs, natural) + collapsed + list(qs))[0]
        ended = "then was not finite" if shaky else "ended there"
        return ModelError(
            f"site {site!r}: the fit diverged: its ELBO fell from {peak:.6g} to {float(reached[-1]):.3g} and "
            f"{ended}; the steps ran away, which does not show that the posterior is improper. Try a "
            "smaller learning_rate, more Monte Carlo samples (num_samples=...), a deterministic estimator "
            "(estimator='cubature' or 'quadrature'), or start the site elsewhere (init=...)."
        )
    if grows or shaky:
        site = (runaway_sites(qs, natural) + collapsed + list(qs))[0]
        return ModelError(
            f"site {site!r}: the ELBO grows without bound as q of {site!r} collapses to a point, so the "
            "posterior is improper (the likelihood is unbounded there: e.g. a scale with identical "
            "observations under a prior that stays positive at zero, such as HalfNormal or HalfCauchy, or "
            "an improper prior the data do not identify); check the data, or give the site a prior that "
            "vanishes at the boundary (e.g. a Gamma prior on a precision)."
        )
    if not finite_q or (bool(elbo.size) and not bool(np.isfinite(elbo[-1]))):
        bad = [v for v in qs if not all(all_finite(x) for x in jax.tree.leaves(natural[v]))]
        site = (bad or collapsed or list(qs))[0]
        return ModelError(
            f"site {site!r}: the fit ended with {'q' if bad else 'an ELBO'} that is not finite: a factor's "
            "expected log density diverges under q (a Monte Carlo draw outside the support, an improper or "
            "unbounded factor); check the model and data, start the site elsewhere (init=...), or use a "
            "deterministic estimator (estimator='quadrature' or 'delta')."
        )
    return None
