"""How much spread a joint Gaussian q leaves out: importance weights of q against the model.

``NonConjugateVI(blocks="all")`` (and ``choose`` where a few latents join) fits one full
Gaussian over several latents on their unconstrained space. It keeps the correlations that
mean-field drops (linear response, :mod:`blrppl.linear_response`, checks those), but where
the posterior is not Gaussian on that space, a funnel (a hierarchy's scale with little data
per group) or a heavy tail, the ELBO's optimum (the KL divergence from q, which pays for
mass q puts where the posterior has none, not for mass it misses) is too narrow: centred
eight schools' tau comes out with a third of NUTS's standard deviation, converged and
confident.

Importance sampling measures it. With S draws x_s ~ q and weights w_s ∝ p(x_s, y) / q(x_s),
truncated at mean(w) √S (Ionides 2008: no single draw dominates), the weighted standard
deviation of each latent element estimates the posterior's. In a tail that q misses the
draws are few, so the estimate stays low: the ratio of the weighted standard deviation to
that of the same draws unweighted is a lower bound on how many times q understates the
spread, and a ratio of :data:`UNDERSTATED_SD` or more is a flag on the result (so are weights
that a few draws carry: :data:`MIN_ESS`). Measured against NUTS on 19 models written by others
(``NonConjugateVI(blocks="all")`` and ``choose``'s joint fits): the nine fits whose standard
deviations were 1.28 to 110 times too small read 1.16 to 1.62, the ten within 11% of NUTS 1.01
to 1.08 (Pareto k did not separate them: 0.7 to 1.3 on a zero-inflated Poisson whose weights
keep 99% of their draws).

One compiled program per plan signature (``CHUNK`` draws and the model's log density at each),
traced at the fit's start and compiled in a thread beside the fit's own programs
(:func:`prepare`), dispatched with linear response (:func:`dispatch`); its reading on the host
(:meth:`Pending.read`) runs it three times more where the first draws are not clear
(:data:`CLEAR`), and :func:`understated_spread_flag` turns it into a flag. The draws use a fixed
sequence of keys: a fit's flags are reproducible.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from blrppl.blr.ahead import CompiledInBackground
from blrppl.compile_mode import jit_for, to_host
from blrppl.diagnostics import importance_ratios
from blrppl.draws import compiled_for, family_draws, model_data
from blrppl.flops import jaxpr_flops
from blrppl.linear_response import listed_ratios, natural_shapes

CHUNK = 1000
"""Draws per run of the check's program."""

NUM_SAMPLES = 4000
"""Draws of a check whose first ``CHUNK`` read a ratio of ``CLEAR`` or more. Over eight keys, 1,000
draws read up to 1.15 on fits within 8% of NUTS and down to 1.15 on fits 2x too narrow; 4,000
read up to 1.08 and down to 1.26."""

CLEAR = 1.05
"""A first ``CHUNK``'s largest ratio below this ends the check: no fit more than 1.3x too narrow
read under 1.15 from 1,000 draws."""

MIN_ESS = 20.0
"""Weights whose effective sample size is below this (of 4,000 draws) are a flag whatever the
ratios read: a few draws carry them, and the weighted spread of a few draws is near 0. Fits
within 11% of NUTS kept over 900 of 1,000 (two that drew 4,000, 1,476 and 1,792); the nine too
narrow, 317 to 2,304 of 4,000."""

MAX_FLOPS = 3e8
"""A check whose run of ``CHUNK`` draws would cost more floating-point operations than this
(:func:`blrppl.flops.jaxpr_flops`) is not made: about 0.2 s a run on a CPU core (a random-intercept
model on 5,000 rows: 7e7, 51 ms)."""

UNDERSTATED_SD = 1.15
"""A weighted standard deviation this many times q's (a lower bound on the factor) is flagged."""

FLAG = "joint Gaussian q understates the posterior spread of "
"""How the flag of :func:`understated_spread_flag` begins."""

_KEY_SEED = 20260412
"""The draws' key: a fit's flags do not depend on the caller's key."""


class Weighted(NamedTuple):
    """The check's reading on the host.

    Attributes:
      ratio: site -> the largest ratio over its elements of the importance-weighted standard
        deviation to the unweighted one (module docstring).
      ess: the effective sample size of the truncated weights (of ``num_samples``).
      num_samples: the number of draws.
    """

    ratio: dict
    ess: float
    num_samples: int


class Pending(NamedTuple):
    """A dispatched check: :meth:`read` it on the host (which draws more where the first
    ``CHUNK`` are not clear)."""

    check: Any
    args: tuple
    chunks: tuple

    def read(self) -> Weighted:
        log_ratio, values = to_host(self.chunks[0])
        if len(self.chunks) > 1:
            rest = to_host(self.chunks[1:])
            log_ratio = np.concatenate([log_ratio] + [r for r, _ in rest])
            values = {s: np.concatenate([values[s]] + [v[s] for _, v in rest]) for s in values}
        ratios, ess = weighted_spread(log_ratio, values)
        if len(self.chunks) * CHUNK < NUM_SAMPLES and max(ratios, default=0.0) >= CLEAR:
            more = tuple(self.check.run(self.args, i) for i in range(len(self.chunks), NUM_SAMPLES // CHUNK))
            return Pending(self.check, self.args, self.chunks + more).read()
        return Weighted(dict(zip(self.check.sites, ratios)), ess, len(log_ratio))


def checked_sites(plan: Any) -> tuple[str, ...]:
    """The model's sites whose spread a check of ``plan`` reads: the members of its joint
    Gaussian blocks, where a factor on one of them is estimated (not exact), the data are
    arguments; else ``()``."""
    if plan.subsample is not None or plan.imputed or plan.orphans or plan.data_static:
        return ()
    joint = {v for v, q in plan.qs.items() if q.joint and q.family.gaussian}
    if not joint or not any(joint.intersection(est.method.estimated) for est in plan.estimators):
        return ()
    return tuple(site for v in plan.qs if v in joint for site in plan.qs[v].transform.sites)


def weighted_spread(log_ratio: np.ndarray, values: dict) -> tuple[list, float]:
    """``(ratios, ess)``: per site of ``values`` (``(S, ...)`` draws), the largest ratio over its
    elements of the truncated-importance-weighted standard deviation to the unweighted one (0
    where the draws do not vary or are not finite), and the weights' effective sample size."""
    log_ratio = np.asarray(log_ratio, np.float64)
    count = log_ratio.shape[0]
    log_ratio = np.where(np.isnan(log_ratio), -np.inf, log_ratio)
    if not np.isfinite(log_ratio).any():
        return [0.0] * len(values), 0.0
    # A draw where p is infinite outweighs every other (its weight is then truncated as theirs).
    log_ratio = np.where(log_ratio == np.inf, np.max(log_ratio[np.isfinite(log_ratio)]) + 100.0, log_ratio)
    weights = np.exp(log_ratio - np.max(log_ratio))
    weights = np.minimum(weights, np.mean(weights) * math.sqrt(count))
    weights = weights / np.sum(weights)
    ratios = []
    for x in values.values():
        eps = np.finfo(np.asarray(x).dtype).eps
        x = np.reshape(np.asarray(x, np.float64), (count, -1))
        finite = np.all(np.isfinite(x), axis=0)
        x = np.where(finite, x, 0.0)
        spread = np.std(x, axis=0)
        # (Draws that differ by rounding alone do not vary: a site q pins to a point.)
        varies = finite & (spread > 64 * eps * np.max(np.abs(x), axis=0))
        if not varies.any():
            ratios.append(0.0)
            continue
        x, spread = x[:, varies], spread[varies]
        weighted = np.sqrt(weights @ (x - weights @ x) ** 2)
        ratios.append(float(np.max(weighted / spread)))
    return ratios, float(1.0 / np.sum(weights**2))


def _program(plan: Any, sites: tuple, count: int):
    """``(natural, params, data, chunk) -> (log_ratio, values)``: ``count`` draws from q (key
    ``chunk`` of the check's fixed sequence), their log ratios p(x, y) / q(x) and ``sites``' values."""
    log_ratios = importance_ratios(plan, with_magnitude=False)

    def program(natural: dict, params: dict, data: Any, chunk: jax.Array) -> tuple:
        key = jax.random.fold_in(jax.random.key(_KEY_SEED), chunk)
        draws = family_draws(plan, natural, key, count)
        log_ratio, _, values = log_ratios(draws, natural, params, data)
        return log_ratio, {s: values[s] for s in sites}

    return program


def affordable(plan: Any, sites: tuple, args: tuple) -> bool:
    """Whether a run of ``CHUNK`` draws costs at most ``MAX_FLOPS`` (its program traced at
    ``args``: values or their shapes; q's factorisations, once per run, included)."""
    return jaxpr_flops(jax.make_jaxpr(_program(plan, sites, CHUNK))(*args, np.int32(0))) <= MAX_FLOPS


class _Check:
    """The check's program for one plan signature, traced and compiled in a thread when the host
    is idle (or at the first check, where q's shapes are known only from its values)."""

    def __init__(self, plan: Any, sites: tuple):
        self.sites = sites
        self._plan = plan
        self._program = None
        self._made = False
        self._ahead = None
        natural = natural_shapes(plan)
        if natural is not None:
            args = (natural, dict(plan.arrays.params), model_data(plan), np.int32(0))
            self._ahead = CompiledInBackground(lambda: self._made_for(args[:3]).lower(*args))

    def _made_for(self, args: tuple) -> Any:
        """The program (None where the check costs too much: :func:`affordable`), made once."""
        if not self._made:
            self._made = True
            if affordable(self._plan, self.sites, args):
                self._program = jit_for(self._plan.arrays, _program(self._plan, self.sites, CHUNK), one_shot=True)
            self._plan = None  # (it holds the reference data's arrays)
        return self._program

    def run(self, args: tuple, chunk: int) -> Any:
        """Dispatch the program on ``args`` for draws ``chunk`` (outputs on the device), or None."""
        chunk = np.int32(chunk)
        if self._ahead is not None:
            try:
                return self._ahead(*args, chunk)
            except (TypeError, ValueError):  # not lowered (NotLowered: no check) or other argument types
                pass
        program = self._made_for(args)
        return None if program is None else program(*args, chunk)

    def __call__(self, args: tuple) -> Optional[Pending]:
        outputs = self.run(args, 0)
        return None if outputs is None else Pending(self, args, (outputs,))


def _check(plan: Any) -> Optional[_Check]:
    def build() -> Optional[_Check]:
        sites = checked_sites(plan)
        if not sites:
            return None
        try:
            return _Check(plan, sites)
        except Exception:  # noqa: BLE001 - model code that cannot take draws as a point: no check
            return None

    return compiled_for(plan, ("importance_spread",), build, by_signature=True)


def prepare(plan: Any) -> None:
    """Trace the check's program for ``plan`` (where it applies) and compile it in a thread,
    beside the fit's own compilation. Once per plan signature."""
    _check(plan)


def dispatch(plan: Any, natural: dict, params: dict) -> Optional[Pending]:
    """Start the check of a fit's joint Gaussian q on the device, or None where it does not
    apply (:func:`checked_sites`)."""
    check = _check(plan)
    if check is None:
        return None
    try:
        return check((natural, dict(params), model_data(plan)))
    except Exception:  # noqa: BLE001 - model code that cannot take draws as a point: no check
        return None


def understated_spread_flag(found: Optional[Weighted]) -> tuple[str, ...]:
    """A flag where the importance-weighted standard deviation of a joint block's site is
    :data:`UNDERSTATED_SD` or more times q's (module docstring); else ``()``."""
    if found is None:
        return ()
    remedy = (
        "compare with blrppl.Integrated(model) where it applies, or MCMC, or reparameterise (a "
        "non-centred hierarchy)"
    )
    if found.num_samples and found.ess < MIN_ESS:
        names = ", ".join(repr(s) for s in list(found.ratio)[:4]) + (" ..." if len(found.ratio) > 4 else "")
        return (
            f"{FLAG}{names}: importance weights of {found.num_samples} draws from q against the model "
            f"concentrate on {found.ess:.0f} of them (effective sample size), so q misses most of the "
            "posterior's mass; their spread, and possibly their location, are not to be trusted: " + remedy,
        )
    shown = listed_ratios(found.ratio, UNDERSTATED_SD)
    if shown is None:
        return ()
    return (
        f"{FLAG}{shown}: importance weights of {found.num_samples} draws from q against the "
        f"model (effective sample size {found.ess:.0f}) put their standard deviation at least that "
        "many times higher (a lower bound: the draws rarely reach the mass q misses). The posterior "
        "is not Gaussian on q's unconstrained space there (a funnel of a hierarchy's scale and its "
        "effects, or a heavy tail), so these latents' spread, and possibly their means, are not to "
        "be trusted: " + remedy,
    )


def understated(result: Any) -> bool:
    """Whether ``result`` carries the flag of :func:`understated_spread_flag`."""
    return any(flag.startswith(FLAG) for flag in result.flags)
