"""Damping of an oscillating fixed-point iteration, without moving its fixed point.

With ρ = 1 and deterministic site parameters (quadrature, cubature), the step
λ ← F(λ) = Σ_f λ̃_f(μ(λ)) is a fixed-point iteration. Near its fixed point
λ*, the residual r(λ) = F(λ) - λ of the damped step λ ← λ + ρ r(λ) shrinks
by ``1 + ρ (e - 1)`` per step along an eigenvector of F's Jacobian with
eigenvalue e. Where e < 0 (a Gaussian process's hyperparameters: the ELBO
rises and falls around its optimum), ρ = 1 converges at the rate |e|,
and ρ = 1 / (1 - e) would remove that direction's error in one step. Mean-field
steps over coupled latents (a hierarchy's scale and its group effects) oscillate
so too.

:func:`observe` estimates e from the last two residuals (each step's change
of λ over its ρ) and sets the next ρ to 1 / (1 - e) where e < 0, else to 1,
and to at most half the last ρ after a step that did not raise the ELBO (at
most twice it after one that did): in float32 a q at its fixed point jitters
by rounding at ρ = 1, and its ELBO with it, until smaller steps let it settle.
Every ρ lies in (0, 1], so the fixed points are the rule's own (Eq. 58 with
any ρ > 0 has the fixed points of ρ = 1); only the path to them changes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

MIN_RATE = 0.25
"""The smallest ρ the damping takes (e = -3: a strongly diverging oscillation is the guard's)."""


class Damping(NamedTuple):
    """What :func:`observe` carries from step to step (a pytree in ``BLRState.damping``).

    Attributes:
      residual: the last step's change of λ over its ρ, each element scaled
        by 1 / (1 + |λ|) (relative changes, so that no variable's scale
        dominates the estimate); zeros before a first step.
      rate: the ρ the last step took.
      next: the ρ of the next step.
    """

    residual: Any
    rate: jax.Array
    next: jax.Array


def init(natural: Any) -> Damping:
    """No estimate yet: the first two steps take ρ = 1."""
    one = jnp.ones((), jnp.result_type(float))
    return Damping(residual=jax.tree.map(jnp.zeros_like, natural), rate=one, next=one)


def _scaled_residual(old: Any, new: Any, rate: jax.Array) -> Any:
    def leaf(a, b):
        change = (b - a) / (rate * (1.0 + jnp.abs(a)))
        return jnp.where(jnp.isfinite(change), change, 0.0)

    return jax.tree.map(leaf, old, new)


def _dot(a: Any, b: Any) -> jax.Array:
    return sum((jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))), jnp.zeros(()))


def observe(damping: Damping, old: Any, new: Any, rate: jax.Array, rose: Any = True) -> Damping:
    """Record the step ``old -> new`` taken with ``rate`` and choose the next ρ.

    ``c = <r_t, r_{t-1}> / <r_{t-1}, r_{t-1}>`` estimates ``1 + ρ_{t-1} (e - 1)``,
    hence ``e = 1 + (c - 1) / ρ_{t-1}``; the next ρ is ``1 / (1 - e)`` where
    ``e < 0`` (clipped to ``[MIN_RATE, 1]``), else 1. ``rose``: whether the step
    raised the ELBO; where it did not, the next ρ is also at most half this one's
    (in float32 a q at its fixed point jitters by rounding at ρ = 1, and the ELBO
    with it: smaller steps let it settle), and after a rise at most twice it.
    """
    residual = _scaled_residual(old, new, rate)
    norm = _dot(damping.residual, damping.residual)
    ratio = _dot(residual, damping.residual) / jnp.where(norm > 0, norm, 1.0)
    eigenvalue = 1.0 + (ratio - 1.0) / damping.rate
    damped = (norm > 0) & (eigenvalue < 0) & jnp.isfinite(eigenvalue)
    next_rate = jnp.where(damped, jnp.clip(1.0 / (1.0 - eigenvalue), MIN_RATE, 1.0), 1.0)
    cap = jnp.where(rose, 2.0 * rate, 0.5 * rate)
    next_rate = jnp.maximum(jnp.minimum(next_rate, cap), MIN_RATE)
    return Damping(residual=residual, rate=jnp.asarray(rate, next_rate.dtype), next=next_rate.astype(damping.next.dtype))
