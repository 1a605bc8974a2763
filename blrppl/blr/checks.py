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

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from numpyro.distributions import constraints

from blrppl.blr import driver

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

    Args:
      plan: the fit's plan; ``e_step`` its algorithm without an M-step.
      state: the fit's final state; ``elbo``: its final bound.
    """
    flags = []
    for name, value in state.params.items():
        node = plan.graph.params.get(name)
        transform = plan.param_transforms.get(name)
        if node is None or transform is None:
            continue
        for direction, words in _directions(node.constraint):
            moved = transform(transform.inv(value) + direction * BOUNDARY_SHIFT)
            trial = state._replace(params={**state.params, name: moved}, step=jnp.zeros((), jnp.int32))
            _, trace, _ = driver.run(e_step, jax.random.key(0), E_STEPS, plan.arrays, init_state=trial, progress_bar=False)
            bound = float(trace[-1])
            if bound >= elbo - 1e-9 * (1.0 + abs(elbo)):
                flags.append(
                    f"site {name!r}: the likelihood is no lower with the estimate moved towards {words} "
                    f"({bound:.6g} at {float(jnp.ravel(moved)[0]):.3g} vs {elbo:.6g} at the estimate): its maximum "
                    "lies on the boundary, where EM converges ever more slowly and the fitted q is degenerate; "
                    "treat the estimate as that boundary value, or put a prior on the site (a latent sample site)"
                )
    return tuple(flags)
