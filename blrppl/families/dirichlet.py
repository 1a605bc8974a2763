"""The Dirichlet family over the probability simplex.

    q(x) = Dir(x | α) = Γ(α₀) Πₖ x_k^{α_k - 1} / Πₖ Γ(α_k),   α₀ = Σₖ α_k,
    T(x) = log x,   λ = α - 1,   μ = ψ(α) - ψ(α₀),
    A(λ) = Σₖ log Γ(α_k) - log Γ(α₀),   h(x) = 1.

The inverse map μ → λ solves ψ(α_k) - ψ(α₀) = μ_k (the Dirichlet maximum-likelihood
equations of Minka 2000, "Estimating a Dirichlet distribution"). Given α₀ each
α_k = ψ⁻¹(μ_k + ψ(α₀)) (Minka's fixed point), which leaves one equation in α₀,
Σₖ ψ⁻¹(μ_k + ψ(α₀)) = α₀; we solve it by Newton's method in log α₀ with a
fixed number of steps, so everything is jit-safe.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.nn import logsumexp
from jax.scipy.special import digamma, gammaln, polygamma
from numpyro.distributions import constraints

from blrppl._types import Array, ArrayLike, PRNGKey
from blrppl.families import common
from blrppl.families.gamma_draws import dirichlet_draws, restart_log_gamma
from blrppl.families.base import ExpFamily
from blrppl.families.layout import elementwise_layout

NEWTON_STEPS = 10
"""Newton steps in log α₀. Eight reach float64 conditioning for α_k in [3e-3, 3e3]."""

INVERSE_DIGAMMA_STEPS = 5
"""Newton steps of ψ⁻¹ from Minka's start (enough for float64)."""

_EULER = 0.5772156649015329
_MAX_LOG_STEP = 3.0  # Newton steps in log α₀ are clipped to a factor e³ either way.


class DirichletStats(NamedTuple):
    """T(x) = log x, shape (..., K); λ = α - 1; μ = ψ(α) - ψ(α₀)."""

    log_x: Array


def inverse_digamma(y: Array, num_steps: int = INVERSE_DIGAMMA_STEPS) -> Array:
    """Solve ψ(x) = y for x > 0, elementwise (Minka 2000, Appendix C).

    Start from x = exp(y) + 1/2 for y ≥ -2.22 and x = -1/(y + γ) below, then take
    ``num_steps`` Newton steps.
    """
    x = jnp.where(y >= -2.22, jnp.exp(y) + 0.5, -1.0 / (y + _EULER))
    x, _ = jax.lax.fori_loop(0, num_steps, _inverse_digamma_step, (x, y))
    return x


def _inverse_digamma_step(_, carry):
    x, y = carry
    return x - (digamma(x) - y) / polygamma(1, x), y


def solve_dirichlet(mean_log: Array, num_steps: int = NEWTON_STEPS) -> Array:
    """Return α > 0 with ψ(α_k) - ψ(Σα) = μ_k, over the last axis.

    With α_k(α₀) = ψ⁻¹(μ_k + ψ(α₀)) and S(α₀) = Σₖ α_k(α₀), Newton's method
    solves F(u) = log S(eᵘ) - u = 0 in u = log α₀. The start is the large-α
    approximation α₀ ≈ (K - 1) / (2c), c = -log Σₖ exp μ_k > 0 (from
    ψ(x) ≈ log x - 1/(2x)).

    Args:
        mean_log: μ = E[log x], shape (..., K), with Σₖ exp μ_k < 1.
        num_steps: fixed number of Newton steps in log α₀ (a ``fori_loop``).

    Returns:
        α, the shape of ``mean_log``.
    """
    k = mean_log.shape[-1]
    gap = -logsumexp(mean_log, axis=-1)
    u0 = jnp.log((k - 1) / (2.0 * gap))
    u, _ = jax.lax.fori_loop(0, num_steps, _dirichlet_step, (u0, mean_log))
    return inverse_digamma(mean_log + digamma(jnp.exp(u))[..., None])


def _dirichlet_step(_, carry):
    u, mean_log = carry
    total = jnp.exp(u)
    alpha = inverse_digamma(mean_log + digamma(total)[..., None])
    s = jnp.sum(alpha, axis=-1)
    residual = jnp.log(s) - u
    # dα_k/dα₀ = ψ'(α₀) / ψ'(α_k), so dF/du = α₀ ψ'(α₀) Σₖ 1/ψ'(α_k) / S - 1.
    slope = total * polygamma(1, total) * jnp.sum(1.0 / polygamma(1, alpha), -1)
    step = residual / (slope / s - 1.0)
    return u - jnp.clip(step, -_MAX_LOG_STEP, _MAX_LOG_STEP), mean_log


def sufficient_stats(x: ArrayLike) -> DirichletStats:
    """Return T(x) = log x."""
    (x,) = common.as_floats(x)
    return DirichletStats(log_x=jnp.log(x))


def log_base_measure(x: ArrayLike) -> Array:
    """Return log h(x) = 0, batch shaped."""
    (x,) = common.as_floats(x)
    return jnp.zeros(jnp.shape(x)[:-1], x.dtype)


def expected_log_base_measure(natural: DirichletStats) -> Array:
    """Return E_q[log h(x)] = 0."""
    return jnp.zeros(jnp.shape(natural.log_x)[:-1], natural.log_x.dtype)


def log_normalizer(natural: DirichletStats) -> Array:
    """Return A(λ) = Σₖ log Γ(α_k) - log Γ(α₀), α = λ + 1."""
    alpha = natural.log_x + 1.0
    return jnp.sum(gammaln(alpha), axis=-1) - gammaln(jnp.sum(alpha, axis=-1))


def mean_params(natural: DirichletStats) -> DirichletStats:
    """Return μ = ψ(α) - ψ(α₀)."""
    alpha = natural.log_x + 1.0
    total = jnp.sum(alpha, axis=-1, keepdims=True)
    return DirichletStats(log_x=digamma(alpha) - digamma(total))


def natural_params(mean: DirichletStats) -> DirichletStats:
    """Return λ = α - 1 with ψ(α) - ψ(α₀) = μ (Newton, see ``solve_dirichlet``)."""
    return DirichletStats(log_x=solve_dirichlet(mean.log_x) - 1.0)


def from_usual(concentration: ArrayLike) -> DirichletStats:
    """Return λ = α - 1 of Dirichlet(concentration=α).

    Example:
        >>> from_usual(jnp.array([1.0, 2.0])).log_x.tolist()
        [0.0, 1.0]
    """
    (alpha,) = common.as_floats(concentration)
    return DirichletStats(log_x=alpha - 1.0)


def to_usual(natural: DirichletStats) -> dict[str, Array]:
    """Return ``{"concentration": α}``."""
    return {"concentration": natural.log_x + 1.0}


def from_numpyro(d: dist.Distribution) -> DirichletStats:
    """Return λ of a numpyro ``Dirichlet``."""
    base = common.unwrap(d)
    if not isinstance(base, dist.Dirichlet):
        raise common.not_in_family(d, "Dirichlet")
    shape = tuple(d.batch_shape) + tuple(d.event_shape)
    return DirichletStats(
        log_x=jnp.broadcast_to(from_usual(base.concentration).log_x, shape)
    )


def to_numpyro(natural: DirichletStats) -> dist.Dirichlet:
    """Return ``dist.Dirichlet(α)``."""
    return dist.Dirichlet(natural.log_x + 1.0)


def sample(
    rng_key: PRNGKey, natural: DirichletStats, sample_shape: tuple = ()
) -> Array:
    """Draw x ~ Dir(α), shape ``sample_shape + batch_shape + (K,)``."""
    alpha = natural.log_x + 1.0
    shape = tuple(sample_shape) + alpha.shape[:-1]
    return dirichlet_draws(rng_key, alpha, shape, alpha.dtype)


def restart_draw(rng_key: PRNGKey, natural: DirichletStats, sample_shape: tuple = ()) -> Array:
    """A random point for a restart: normalised log-normal components with the mean and variance
    of the Dirichlet's Gamma components (cheap to compile)."""
    alpha = natural.log_x + 1.0
    log_g = restart_log_gamma(rng_key, alpha, tuple(sample_shape) + alpha.shape, alpha.dtype)
    return jnp.exp(log_g - jax.scipy.special.logsumexp(log_g, -1, keepdims=True))


def is_valid(natural: DirichletStats) -> Array:
    """Return every α_k > 0 (λ_k > -1) and finite, batch shaped."""
    alpha = natural.log_x + 1.0
    return jnp.all(jnp.isfinite(alpha) & (alpha > 0), axis=-1)


def start_at(natural: DirichletStats, value: ArrayLike) -> DirichletStats:
    """λ with mean ``value`` and λ's total concentration."""
    total = jnp.sum(to_usual(natural)["concentration"], -1, keepdims=True)
    return from_usual(value * total)


DIRICHLET = ExpFamily(
    name="Dirichlet",
    stats_type=DirichletStats,
    event_ndim=1,
    support=constraints.simplex,
    sufficient_stats=sufficient_stats,
    log_base_measure=log_base_measure,
    expected_log_base_measure=expected_log_base_measure,
    log_normalizer=log_normalizer,
    mean_params=mean_params,
    natural_params=natural_params,
    from_usual=from_usual,
    to_usual=to_usual,
    from_numpyro=from_numpyro,
    to_numpyro=to_numpyro,
    sample=sample,
    restart_draw=restart_draw,
    is_valid=is_valid,
    batch_shape=lambda natural: tuple(jnp.shape(natural.log_x)[:-1]),
    kind="dirichlet",
    statistics=((("log", 1), "log_x"),),
    layout=elementwise_layout(),
    reparameterised=True,
    prior_types=(dist.Dirichlet,),
    fixed_support=constraints.simplex,
    start_at=start_at,
)
"""Dirichlet(concentration α) over the simplex, shape (..., K)."""
