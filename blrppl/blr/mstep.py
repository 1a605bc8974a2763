"""EM's M-step: point estimates maximise E_q[log p] (Khan & Rue, Sec. 5.2).

The objective is the sum of the exact expected log factors that touch the
point estimates, as a function of their values; it is maximised by Newton's
method on the unconstrained space of each ``numpyro.param``'s constraint,
with step halving so that the objective never decreases (beyond rounding). When the objective
is quadratic in the unconstrained parameter (means), one Newton step is the
closed-form M-step; otherwise a few steps reach it to machine precision. An exact
factor's expectation is first contracted over q and the data (the expected
sufficient statistics), so that the Newton iterations never pass over the data.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from blrppl.blr.elbo import mean_params

MAX_NEWTON_STEPS = 50
MAX_HALVINGS = 30


def build_m_step(plan: Any) -> Callable:
    """``(rng_key, natural, params, arrays, mean=None) -> (params, values)`` for a plan with point
    estimates (``mean``: q's mean parameters, when the caller has computed them already).

    ``values`` maps each exact factor touching the point estimates to its E_q[log f] at the new
    ``params``, read off the contracted expectation (O(size of the points)): the step's ELBO
    reuses them instead of passing over the data again.
    """
    names = tuple(plan.init_params)
    transforms = plan.param_transforms
    estimators = [e for e in plan.estimators if _touches(plan, e.factor, names)]

    def to_params(u: dict) -> dict:
        return {n: transforms[n](u[n]) for n in names}

    def m_step(rng_key, natural, params, arrays, mean=None):
        mean = mean_params(plan.qs, natural) if mean is None else mean
        u0 = {n: transforms[n].inv(params[n]) for n in names}
        flat0, unravel = ravel_pytree(u0)

        # An exact factor's expectation is contracted over q and the data once, here: each
        # Newton iteration then costs O(size of the point estimates), not a pass over the data.
        at_points = [e.at_points(mean, arrays) if e.at_points is not None else None for e in estimators]

        def expected(e, at, p):
            return at(p) if at is not None else e.estimate(rng_key, mean, p, arrays)[0]

        # Traced once: its value, gradient, Hessian and step halvings reuse the jaxpr.
        @jax.jit
        def objective(flat):
            p = {**params, **to_params(unravel(flat))}
            return sum(expected(e, at, p) for e, at in zip(estimators, at_points))

        def newton(carry):
            flat, value, i, _, stalled = carry
            # The gradient and the Hessian's columns (as jax.hessian) from one program: the gradient
            # is the primal output of the Hessian-vector products.
            basis = jnp.eye(flat.shape[0], dtype=flat.dtype)
            grad, hess = jax.vmap(lambda v: jax.jvp(jax.grad(objective), (flat,), (v,)), out_axes=(None, 1))(basis)
            # Ascent direction: Newton where the Hessian is negative definite,
            # else the gradient (never a step downhill).
            direction = -jnp.linalg.solve(hess, grad)
            ok = jnp.all(jnp.isfinite(direction)) & (jnp.dot(direction, grad) > 0)
            direction = jnp.where(ok, direction, grad)

            def halve(c):
                step, _ = c
                return step * 0.5, objective(flat + step * 0.5 * direction)

            # Changes of the objective within rounding are no evidence against a
            # Newton step (its gradient and Hessian are accurate beyond that).
            tol = 64.0 * jnp.finfo(flat.dtype).eps * (1.0 + jnp.abs(value))

            def worse(c):
                step, new_value = c
                return ((new_value < value - tol) | ~jnp.isfinite(new_value)) & (step > 2.0**-MAX_HALVINGS)

            # The full step is the loop's first try (from step 2 and no value): the objective is
            # written once in the loop, not before it and again in it.
            no_value = jnp.asarray(-jnp.inf, value.dtype)
            step, new_value = jax.lax.while_loop(worse, halve, (jnp.full((), 2.0, flat.dtype), no_value))
            accept = jnp.isfinite(new_value) & (new_value >= value - tol)
            new_flat = jnp.where(accept, flat + step * direction, flat)
            new_value = jnp.where(accept, new_value, value)
            # Stop once Newton's step no longer moves the parameters; or once a full
            # Newton step changes the objective only within rounding (it was taken
            # from within rounding of the optimum, and converges quadratically);
            # or after two such steps in a row (a maximum on the boundary, such as
            # a one-hot initial distribution of an HMM, is approached along a flat
            # direction that would otherwise be followed until MAX_NEWTON_STEPS).
            moved = jnp.max(jnp.abs(new_flat - flat)) / (1.0 + jnp.max(jnp.abs(flat)))
            unchanged = jnp.abs(new_value - value) <= tol
            flat_newton = ok & (step == 1.0) & unchanged
            converged = (moved <= 4.0 * jnp.finfo(flat.dtype).eps) | flat_newton | (stalled & unchanged)
            return new_flat, new_value, i + 1, converged, unchanged

        def cond(carry):
            _, _, i, converged, _ = carry
            return (i < MAX_NEWTON_STEPS) & ~converged

        start = (flat0, objective(flat0), jnp.zeros((), jnp.int32), jnp.zeros((), bool), jnp.zeros((), bool))
        flat = jax.lax.while_loop(cond, newton, start)[0]
        params = {**params, **to_params(unravel(flat))}
        values = {e.factor: at(params) for e, at in zip(estimators, at_points) if at is not None}
        return params, values

    return m_step


def _touches(plan: Any, factor: str, names: tuple) -> bool:
    return any(p in names for p in plan.graph.factors[factor].param_neighbours)
