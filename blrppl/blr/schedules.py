"""Learning-rate schedules ρ_t, called with the step number t = 1, 2, ...

Plain callables, compatible with optax schedules.
"""

from __future__ import annotations

from typing import Callable, Union

import jax
import jax.numpy as jnp

Schedule = Callable[[jax.Array], jax.Array]


def constant(rho: float) -> Schedule:
    """ρ_t = rho for every t."""
    if not 0.0 < float(rho) <= 1.0:
        raise ValueError(f"a constant learning rate must lie in (0, 1], got {rho}.")
    return lambda step: jnp.asarray(rho, dtype=jnp.result_type(float))


def robbins_monro(t0: float = 1.0, kappa: float = 0.7) -> Schedule:
    """ρ_t = (t + t0 - 1)^(-κ), κ in (0.5, 1] (Hoffman et al. 2013's (t + τ)^-κ).

    With t0 = 1, ρ_1 = 1 and, for κ = 1, ρ_t = 1 / t: the global iterate is the
    running average of the per-step targets.
    """
    if not 0.5 < kappa <= 1.0:
        raise ValueError(f"kappa must lie in (0.5, 1] for convergence, got {kappa}.")
    if t0 < 1.0:
        raise ValueError(f"t0 must be at least 1 so that rho_1 <= 1, got {t0}.")
    return lambda step: (jnp.asarray(step, jnp.result_type(float)) + t0 - 1.0) ** (-kappa)


def as_schedule(learning_rate: Union[float, Schedule]) -> Schedule:
    """Turn a float or a callable into a schedule (callables are used as given)."""
    if callable(learning_rate):
        return learning_rate
    return constant(learning_rate)
