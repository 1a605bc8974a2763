"""Iterate averaging of Monte Carlo fits, and how their convergence is judged.

With Monte Carlo site parameters and ρ < 1, q at the end of a run is the
polynomial-decay average of the iterates (Shamir & Zhang 2013), and the run
stops once that average moves by less than ``tol`` (a KL divergence) over
windows of steps.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from blrppl.blr.state import BLRState
from blrppl.families import kl_divergence

AVERAGE_POWER = 3.0


def polynomial_average(running: Any, current: Any, t: jax.Array) -> Any:
    """Polynomial-decay averaging (Shamir & Zhang 2013): weight (η + 1)/(t + η), η = 3."""
    w = (AVERAGE_POWER + 1.0) / (t + AVERAGE_POWER)
    return jax.tree.map(lambda a, x: (1.0 - w) * a + w * x, running, current)


CONVERGENCE_WINDOW = 25


def window_change(qs, state: BLRState) -> tuple[BLRState, jax.Array]:
    """Every ``CONVERGENCE_WINDOW`` steps: how far the averaged q moved, and a new anchor.

    The change is the largest KL(q̄_then ‖ q̄_now) over every block of every
    variable (a mean shift of δ standard deviations is KL = δ²/2); +inf
    between window ends.
    """
    at_end = state.step % CONVERGENCE_WINDOW == 0
    kls = [jnp.max(kl_divergence(qs[v].family, state.anchor[v], state.average[v])) for v in qs]
    change = jnp.max(jnp.stack(kls)) if kls else jnp.zeros(())
    change = jnp.where(at_end, change, jnp.inf)
    anchor = jax.tree.map(lambda a, b: jnp.where(at_end, b, a), state.anchor, state.average)
    return state._replace(anchor=anchor), change
