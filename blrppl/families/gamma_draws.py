"""Gamma variates by rejection with one proposal per variate per round: cheap to compile, exact.

``jax.random.gamma`` runs a rejection ``while_loop`` per variate (vmapped),
splitting each variate's key at every round: the loop body holds several
random hashes and each call site compiles for 0.3-0.45 s on XLA:CPU even at
the cheap settings, and a restart's start draws from several Gamma,
Dirichlet, Beta and Wishart q's. Here Marsaglia & Tsang's (2000) method
draws one proposal for every variate per round from one key per round
(``fold_in(key, round)``), keeps each variate's first accepted proposal and
loops until all are accepted: the same exact rejection sampler, a small loop
body (0.25 s of compile per call site) and memory of a few arrays of the
draws' shape (half of ``jax.random.gamma``'s peak for 10^7 variates).

A proposal is accepted with probability at least 0.95 (shape >= 1; a shape
below 1 draws with shape + 1 and is scaled by U^(1/shape)), so n variates
take about log(n) / 3 rounds. Draws are made in log space (Dirichlet and
Beta normalise there), so tiny shapes do not underflow to exact zeros.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

def log_gamma_draws(rng_key: jax.Array, concentration: Any, shape: tuple, dtype: Any) -> jax.Array:
    """log X for X ~ Gamma(concentration, rate 1), of ``shape`` (``concentration`` broadcast to it);
    differentiable in ``concentration`` (implicit reparameterisation, as ``jax.random.gamma``)."""
    return _log_gamma(rng_key, jnp.broadcast_to(jnp.asarray(concentration, dtype), shape))


@jax.custom_jvp
def _log_gamma(rng_key: jax.Array, alpha: jax.Array) -> jax.Array:
    shape, dtype = alpha.shape, alpha.dtype
    boost = alpha < 1.0
    a = jnp.where(boost, alpha + 1.0, alpha)
    d = a - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    tiny = jnp.finfo(dtype).tiny
    proposal_key, boost_key = jax.random.split(rng_key)

    def propose(carry):
        k, found, log_v = carry
        normal_key, uniform_key = jax.random.split(jax.random.fold_in(proposal_key, k))
        x = jax.random.normal(normal_key, shape, dtype)
        u = jax.random.uniform(uniform_key, shape, dtype, minval=tiny)
        v = (1.0 + c * x) ** 3
        positive = v > 0
        log_v_k = jnp.log(jnp.where(positive, v, 1.0))
        accepted = positive & (jnp.log(u) < 0.5 * x**2 + d - d * v + d * log_v_k)
        return k + 1, found | accepted, jnp.where(accepted & ~found, log_v_k, log_v)

    start = (jnp.zeros((), jnp.int32), jnp.zeros(shape, bool), jnp.zeros(shape, dtype))
    _, _, log_v = jax.lax.while_loop(lambda carry: ~jnp.all(carry[1]), propose, start)
    log_x = jnp.log(d) + log_v
    log_boost = jnp.log(jax.random.uniform(boost_key, shape, dtype, minval=tiny)) / jnp.where(boost, alpha, 1.0)
    return jnp.where(boost, log_x + log_boost, log_x)


@_log_gamma.defjvp
def _log_gamma_jvp(primals: tuple, tangents: tuple) -> tuple:
    """d log x / dα = (dx / dα) / x, dx / dα from the Gamma CDF (Figurnov et al. 2018)."""
    rng_key, alpha = primals
    _, alpha_dot = tangents
    log_x = _log_gamma(rng_key, alpha)
    x = jnp.exp(log_x)
    x = jnp.where(x == 0, jnp.finfo(x.dtype).tiny, x)  # an underflow: the smallest positive value
    return log_x, jax.lax.random_gamma_grad(alpha, x) / x * alpha_dot


def gamma_draws(rng_key: jax.Array, concentration: Any, shape: tuple, dtype: Any) -> jax.Array:
    """X ~ Gamma(concentration, rate 1), of ``shape``."""
    return jnp.exp(log_gamma_draws(rng_key, concentration, shape, dtype))


def dirichlet_draws(rng_key: jax.Array, concentration: Any, shape: tuple, dtype: Any) -> jax.Array:
    """X ~ Dirichlet(concentration) (categories last), of ``shape + (K,)``, normalised in log space."""
    concentration = jnp.asarray(concentration, dtype)
    log_g = log_gamma_draws(rng_key, concentration, tuple(shape) + concentration.shape[-1:], dtype)
    return jnp.exp(log_g - jax.scipy.special.logsumexp(log_g, -1, keepdims=True))


def restart_log_gamma(rng_key: jax.Array, concentration: Any, shape: tuple, dtype: Any) -> jax.Array:
    """log X for X log-normal with the mean and variance of Gamma(concentration, rate 1):
    log X ~ N(log α - s² / 2, s²), s² = log(1 + 1 / α).

    A random point for a restart's start (:data:`ExpFamily.restart_draw`), not a Gamma draw:
    normal draws and a few logs, where an exact sampler's rejection loop and its
    reparameterisation gradient are a large part of the restarts' start program (its
    tracing and compilation, for every Gamma, Dirichlet, Beta and inverse Gamma q).
    """
    alpha = jnp.broadcast_to(jnp.asarray(concentration, dtype), shape)
    spread = jnp.log1p(1.0 / alpha)
    return jnp.log(alpha) - 0.5 * spread + jnp.sqrt(spread) * jax.random.normal(rng_key, shape, dtype)
