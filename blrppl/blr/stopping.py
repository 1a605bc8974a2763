"""When a run stops: the convergence test of the driver's loop (:func:`blrppl.blr.driver.run`).

A deterministic fit stops once one step changed the ELBO by at most ``tol`` relative to it and
no more than that is left to gain by Aitken's extrapolation of its shrinking steps, twice in a
row; a Monte Carlo fit once its averaged q moved by at most KL ``tol``; an exact one after its
first step taken. ``tol`` is raised to the ELBO's resolution in its dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


CONFIRMATIONS = 2
"""Consecutive checks under ``tol`` that stop a run (one more step confirms the first)."""


def count_hits(
    algorithm: Any, info: Any, elbo: jax.Array, previous: jax.Array, hits: jax.Array, threshold: jax.Array,
    before: jax.Array,
) -> jax.Array:
    """The count of consecutive convergence checks passed (``hits`` before this step; see
    :func:`blrppl.blr.driver.run`); ``before``: the ELBO one step before ``previous`` (NaN where
    the run has none)."""
    if algorithm.exact:  # a step taken is its own fixed point: nothing to confirm
        passed = (threshold >= 0) & (info.change == 0) & jnp.isfinite(elbo)
        return jnp.where(passed, CONFIRMATIONS, 0).astype(hits.dtype)
    if algorithm.noisy:
        checked = jnp.isfinite(info.change)
        passed = info.change <= threshold
    else:
        checked = jnp.isfinite(elbo) & jnp.isfinite(previous)
        relative = jnp.where(threshold >= 0, jnp.maximum(threshold, elbo_resolution(elbo.dtype)), threshold)
        # (no tol: never; an ELBO of exactly 0 would pass 0 <= -1 * 0 otherwise)
        bound = relative * jnp.abs(elbo)
        change = elbo - previous
        left = remaining_gain(change, previous - before, elbo_resolution(elbo.dtype) * jnp.abs(elbo))
        passed = (threshold >= 0) & (jnp.abs(change) <= bound) & (left <= bound)
    return jnp.where(checked, jnp.where(passed, hits + 1, 0), hits)


def remaining_gain(change: jax.Array, last_change: jax.Array, noise: jax.Array) -> jax.Array:
    """Aitken's estimate of the ELBO's gain still to come, Δ_t r / (1 - r) with r = Δ_t / Δ_{t-1}.

    A fit that converges linearly gains a fixed fraction r of its last step at every step, so
    the ELBO's limit is Δ_t r / (1 - r) above it (Aitken's Δ² extrapolation, the usual stopping
    rule of EM: Böhning et al. 1994; McNicholas et al. 2010). Where steps shrink slowly (EM on
    the Nile, r = 0.95) a change of ``tol`` in one step leaves 19 times that to gain: the
    variances stopped 13% from the maximum-likelihood values at tol 1e-6. Zero where the
    extrapolation does not apply: the first steps, a fall, a rise after a fall, steps that do
    not shrink (a steady climb, or rounding noise; the plain test then decides), and changes
    within ``noise``.
    """
    ratio = change / last_change
    geometric = (last_change > 0) & (change > noise) & (ratio < 1)
    return jnp.where(geometric, change * ratio / (1.0 - jnp.where(geometric, ratio, 0.0)), 0.0)


RESOLUTION_EPS = 8
"""A relative change of the ELBO within this many machine epsilons of its dtype is rounding noise."""


def elbo_resolution(dtype: Any) -> float:
    """The smallest relative ELBO change that ``tol`` can ask for in ``dtype``.

    Float32: 9.5e-7, below the command line's default tol of 1e-6; float64: 1.8e-15.

    A converged float32 fit can cycle between q's one rounding apart, its ELBO moving by an ulp
    or two forever (seen on a GPU: 200 steps where the CPU stopped after 13); a smaller ``tol``
    is raised to this, and the run's convergence record says so.
    """
    return RESOLUTION_EPS * float(jnp.finfo(dtype).eps)
