"""Hyperparameters integrated, not approximated: q(c) = Σ_k w_k q(c | h_k).

Khan & Rue's Table 1 row "Non-conjugate VI (New): mixture of exponential-family
q", built the way INLA builds its posteriors (Rue, Martino & Chopin 2009):

1. choose the hyperparameters h and the conditional fit q(c | h)
   (:mod:`.hyper`): exact (ConjugateBayes, whose ELBO is log p(y | h)) where
   the model allows, else Laplace's method;
2. find the mode of f(u) = log p(y | h(u)) + log p(h(u)) + log |det ∂h/∂u|
   on h's unconstrained space by damped Newton steps, derivatives through
   the conditional fit (:mod:`.mode`);
3. integrate over a grid in Hessian-standardised coordinates that extends
   until f has dropped ``drop`` in every direction, all nodes one ``vmap``
   of the compiled conditional fit (:mod:`.grid`);
4. q(c) is the mixture of the nodes' q(c | h_k) with weights
   w_k ∝ exp f(u_k), and log p(y) the quadrature of exp f (:mod:`.mixture`).

:func:`integrate` runs the four steps and returns an :class:`IntegratedFit`;
the user-facing result is :class:`blrppl.integrated_result.IntegratedResult`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr.integrate.conditional import Conditional, build_conditional
from blrppl.blr.integrate.grid import Grid, build_grid, default_step, evaluate, standardise
from blrppl.blr.integrate.hyper import HyperChoice, choose_hyper
from blrppl.blr.integrate.mode import ModeSearch, find_mode
from blrppl.blr.integrate.options import IntegratedConfig, make_integrated_config
from blrppl.blr.plan import make_plan
from blrppl.graph.data import content_digest
from blrppl.blr.integrate.grid import EDGE_TOL

#: Posterior weight that unsettled inner fits may carry before the grid is flagged (as EDGE_TOL).
UNSETTLED_TOL = 1e-4

__all__ = [
    "Diagnostics",
    "IntegratedConfig",
    "IntegratedFit",
    "integrate",
    "make_integrated_config",
]


class Diagnostics(NamedTuple):
    """What says whether the grid can be trusted.

    Attributes:
      converged: the mode search converged (Newton decrement below tolerance).
      hessian_definite: -∇²f at the mode is positive definite.
      edge_weight: posterior weight on grid nodes at the grid's edge.
      num_modes: local maxima of p(h | y) on the grid (more than one: the
        grid, placed by one mode, may miss or distort the others).
      best_above_mode: how far the best grid node lies above the mode found.
      capped: the grid stopped at ``max_nodes`` or its largest reach before
        the density had dropped in every direction.
      inner_converged: the iterative inner fits that did not settle within ``inner_steps``
        carry at most ``UNSETTLED_TOL`` of the posterior weight (a far-tail node whose fit
        ran out of steps changes no moment the grid reports).
      experimental: the inner fits are Laplace's (INLA-like), a route not yet
        validated against a reference.
      num_non_finite: grid nodes where log p(y, h) was not finite (the
        conditional fit overflowed, e.g. in float32 at extreme h).
    """

    converged: bool
    hessian_definite: bool
    edge_weight: float
    num_modes: int
    best_above_mode: float
    capped: bool
    inner_converged: bool
    experimental: bool = False
    num_non_finite: int = 0
    unsettled_weight: float = 0.0
    num_unsettled: int = 0

    @property
    def problems(self) -> list:
        """Plain-language reasons not to trust the grid (empty when it is fine)."""
        out = []
        if not self.converged:
            out.append("the search for the mode of p(h | y) did not converge (raise num_steps)")
        if not self.hessian_definite:
            out.append("the Hessian of log p(h, y) at the mode is not negative definite (a saddle or a flat direction)")
        if self.edge_weight > EDGE_TOL:
            out.append(f"{self.edge_weight:.2g} of the posterior weight sits on the grid's edge nodes")
        if self.capped:
            out.append("the grid was cut off before the density had dropped in every direction (an improper or very heavy-tailed posterior, or max_nodes)")
        if self.num_modes > 1:
            out.append(f"p(h | y) has {self.num_modes} local maxima on the grid")
        if self.best_above_mode > 1e-3:
            out.append(f"a grid node lies {self.best_above_mode:.3g} above the mode found (another mode?)")
        if not self.inner_converged:
            out.append(
                f"inner fits at {self.num_unsettled} grid nodes, carrying {self.unsettled_weight:.2g} of the "
                "posterior weight, did not settle within inner_steps (raise inner_steps)"
            )
        if self.num_non_finite:
            out.append(
                f"log p(y, h) was not finite at {self.num_non_finite} grid nodes, left out of the integral "
                "(the conditional fit overflowed; in float32, try float64)"
            )
        if self.experimental:
            out.append("q(c | h) and log p(y | h) are Laplace approximations (inner='laplace'), a route not yet validated")
        return out

    @property
    def ok(self) -> bool:
        """True when nothing in :attr:`problems` applies."""
        return not self.problems


class IntegratedFit(NamedTuple):
    """Everything an integrated fit computed (the core's answer).

    Attributes:
      choice: the hyperparameters and the conditional fit's configuration.
      plan: the conditional plan of this data (h held as point estimates).
      conditional: the compiled conditional fit (possibly built for an
        earlier plan with the same signature).
      arrays: the conditional plan's arrays (data; h is set per node).
      mode: the :class:`~.mode.ModeSearch`.
      grid: the :class:`~.grid.Grid` (kept nodes, weights, their fits).
      diagnostics: :class:`Diagnostics`.
      options: the :class:`IntegratedConfig` of the fit.
    """

    choice: HyperChoice
    plan: Any
    conditional: Conditional
    arrays: Any
    mode: ModeSearch
    grid: Grid
    diagnostics: Diagnostics
    options: IntegratedConfig

    @property
    def drop(self) -> float:
        """The log-density drop at which the grid stops."""
        return float(self.options.drop)
    @property
    def log_evidence(self) -> float:
        """log p(y) by the quadrature."""
        return self.grid.log_evidence


def integrate(
    model: Callable,
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    options: IntegratedConfig,
    num_steps: int,
    memo: Optional[dict] = None,
) -> IntegratedFit:
    """Fit ``model`` by exact (or Laplace) conditionals integrated over h (module docstring).

    Args:
      model, model_args, model_kwargs: the NumPyro model and its data.
      options: an :class:`IntegratedConfig`.
      num_steps: the most Newton steps of the mode search.
      memo: a dict in which compiled conditional fits are kept by plan
        signature (an engine's), so that new data of the same shapes reuse
        them, and the choice of h by the data's shapes (checked against the
        plan's signature), so that a second fit plans once, not once per
        candidate h.

    Raises:
      ModelError: from :func:`~.hyper.choose_hyper`.
    """
    choice, plan = _choose(model, model_args, model_kwargs, options, memo)
    key = (plan.signature, choice.sites, choice.inner, options.inner_steps, options.inner_tol)
    conditional = None if memo is None else memo.get(key)
    if conditional is None:
        conditional = build_conditional(plan, choice.config, choice.sites, choice.inner, options.inner_steps, options.inner_tol)
        if memo is not None:
            memo[key] = conditional
    arrays = plan.arrays
    space = conditional.space
    u0 = space.pack({s: arrays.params[s] for s in space.sites})
    if space.dim == 0:
        value = evaluate(conditional, np.zeros((1, 0)), arrays, states=False)
        mode = ModeSearch(np.zeros(0), float(value[0]), np.zeros(0), np.zeros((0, 0)), value, 1, True)
    else:
        mode = find_mode(lambda u: evaluate(conditional, u, arrays, states=False), u0, num_steps, _scouts(space, choice), float(jnp.finfo(jnp.result_type(float)).eps))
    coords = standardise(mode.u, mode.hessian)
    step = options.step if options.step is not None else default_step(space.dim)
    grid = build_grid(conditional, arrays, coords, float(mode.value), step, options.drop, options.max_nodes)
    diagnostics = Diagnostics(
        converged=bool(mode.converged),
        hessian_definite=coords.definite,
        edge_weight=grid.edge_weight,
        num_modes=grid.num_modes,
        best_above_mode=grid.best_above_mode,
        capped=grid.capped,
        inner_converged=grid.unsettled_weight <= UNSETTLED_TOL,
        experimental=choice.inner == "laplace",
        num_non_finite=grid.num_non_finite,
        unsettled_weight=grid.unsettled_weight,
        num_unsettled=grid.num_unsettled,
    )
    return IntegratedFit(choice, plan, conditional, arrays, mode, grid, diagnostics, options)


def _scouts(space: Any, choice: HyperChoice) -> np.ndarray:
    """Candidate starts on u: every combination of the sites' prior quantiles (their diagonal
    when there are more than ``MAX_SCOUTS``), each site's values taken together."""
    per_site = []
    for site, transform in zip(space.sites, space.transforms):
        values = np.asarray(choice.starts[site], np.float64)
        per_site.append(np.asarray(transform.inv(values)).reshape(values.shape[0], -1))
    count = per_site[0].shape[0]
    combos = itertools.product(range(count), repeat=len(per_site))
    if count ** len(per_site) > MAX_SCOUTS:
        combos = ((i,) * len(per_site) for i in range(count))
    scouts = np.asarray([np.concatenate([part[i] for part, i in zip(per_site, combo)]) for combo in combos])
    return scouts[np.all(np.isfinite(scouts), axis=1)]


#: The most candidate starts evaluated before the mode search (one call of the compiled fit).
MAX_SCOUTS = 25


def _choose(model, model_args, model_kwargs, options, memo) -> tuple:
    """:func:`~.hyper.choose_hyper`, or the memo's choice for data of the same shapes.

    The same data and options (equal digests of every argument's structure
    and contents) reuse the memo's plan as it is: planning traces the model and analyses
    every factor on the host (tens of milliseconds), more than the compiled
    fit itself takes. New data of the same shapes re-plan with the memo's
    choice of h.
    """
    data_key = ("plan", content_digest((model_args, dict(model_kwargs), options)))
    if memo is not None and data_key in memo:
        return memo[data_key]
    key = ("choice", _shapes((model_args, dict(model_kwargs))))
    found = None
    if memo is not None and key in memo:
        choice, signature = memo[key]
        plan = make_plan(model, model_args, model_kwargs, choice.config)
        if plan.signature == signature:
            found = choice, plan
    if found is None:
        found = choose_hyper(model, model_args, model_kwargs, options)
    if memo is not None:
        memo[key] = (found[0], found[1].signature)
        for old in [k for k in memo if isinstance(k, tuple) and k[:1] == ("plan",)][: -MAX_PLANS + 1 or None]:
            del memo[old]  # keep the most recent data sets' plans only
        memo[data_key] = found
    return found


#: Plans kept per engine for repeated fits of the same data.
MAX_PLANS = 8


def _shapes(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((np.shape(x), str(np.asarray(x).dtype)) if hasattr(x, "shape") else repr(x) for x in leaves))
