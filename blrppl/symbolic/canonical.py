"""Canonical log densities in plain ``jax.numpy``, from captured constructor calls.

NumPyro's own ``log_prob`` code holds ``clip`` on probabilities, ``xlogy`` as a
``custom_jvp`` with ``select_n``, and ``where(support, lp, -inf)`` branches;
none of that is polynomial in sufficient statistics. The symbolic analysis
therefore reads each distribution through the arguments the user passed
(:mod:`blrppl.graph.capture`) and the textbook density written here, where
every parameter enters the way its exponential-family form says
(``-log(scale) - (x - loc)**2 / (2 scale**2)``, ``a log b - b x``, ...).

Each function returns the log density with the distribution's batch shape.
A distribution without an entry raises :class:`Unsupported`; the analysis then
reports the factor as non-conjugate.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, multigammaln

from blrppl.graph.capture import ConstructorCall, constructor_call
from blrppl.symbolic.interpret import logdet, support_bound

_LOG_2PI = math.log(2.0 * math.pi)


class Unsupported(Exception):
    """No canonical log density for this distribution."""


def _normal(x, loc=0.0, scale=1.0):
    return -0.5 * _LOG_2PI - jnp.log(scale) - 0.5 * (x - loc) ** 2 / scale**2


def _log_normal(x, loc=0.0, scale=1.0):
    log_x = jnp.log(x)
    return _normal(log_x, loc, scale) - log_x


def _half_normal(x, scale=1.0):
    return 0.5 * math.log(2.0 / math.pi) - jnp.log(scale) - 0.5 * x**2 / scale**2


def _mvn(x, loc=0.0, covariance_matrix=None, precision_matrix=None, scale_tril=None):
    if precision_matrix is None:
        if covariance_matrix is not None:
            precision_matrix = jnp.linalg.inv(covariance_matrix)
        elif scale_tril is not None:
            eye = jnp.eye(scale_tril.shape[-1], dtype=scale_tril.dtype)
            inv_tril = jnp.linalg.solve(scale_tril, jnp.broadcast_to(eye, scale_tril.shape))
            precision_matrix = jnp.swapaxes(inv_tril, -1, -2) @ inv_tril
        else:
            raise Unsupported("MultivariateNormal without a covariance")
    d = jnp.shape(precision_matrix)[-1]
    diff = x - loc
    quad = jnp.einsum("...i,...ij,...j->...", diff, precision_matrix, diff)
    return -0.5 * d * _LOG_2PI + 0.5 * logdet(precision_matrix) - 0.5 * quad


def blrppl_normalizer_gamma(concentration: Any) -> Any:
    """log Γ(a), a Gamma family's normaliser in its shape (a named call: a held a leaves it out,
    :class:`~blrppl.symbolic.interpret.Held`)."""
    return gammaln(concentration)


def blrppl_normalizer_beta(concentration1: Any, concentration0: Any) -> Any:
    """log B(a, b), the Beta normaliser (a named call, as :func:`blrppl_normalizer_gamma`)."""
    return gammaln(concentration1) + gammaln(concentration0) - gammaln(concentration1 + concentration0)


def blrppl_normalizer_dirichlet(concentration: Any) -> Any:
    """log B(α), the Dirichlet normaliser (a named call, as :func:`blrppl_normalizer_gamma`)."""
    return jnp.sum(gammaln(concentration), -1) - gammaln(jnp.sum(concentration, -1))


_log_gamma_of_shape = jax.jit(blrppl_normalizer_gamma)
_log_beta = jax.jit(blrppl_normalizer_beta)
_log_multivariate_beta = jax.jit(blrppl_normalizer_dirichlet)


def _gamma(x, concentration, rate=1.0):
    return (
        concentration * jnp.log(rate)
        - _log_gamma_of_shape(concentration)
        + (concentration - 1.0) * jnp.log(x)
        - rate * x
    )


def _exponential(x, rate=1.0):
    return jnp.log(rate) - rate * x


def _chi2(x, df):
    return _gamma(x, 0.5 * df, 0.5)  # Chi2(k) = Gamma(k / 2, 1 / 2)


def _uniform(x, low=0.0, high=1.0):
    # A constant on the support; Uniform(0, 1) is Beta(1, 1). Bounds that depend
    # on a latent are the support, not a parameter of an exponential family.
    low, high = support_bound(low), support_bound(high)
    return -jnp.log(high - low) + 0.0 * x


def _delta(x, v=0.0, log_density=0.0):
    # An observation recorded with Delta(value, obs=value) (the deterministic-site
    # idiom): its log density is the constant log_density (tracing checks obs == v).
    del x, v
    return jnp.asarray(log_density)


def _geometric_probs(x, probs):
    return jnp.log(probs) + x * jnp.log1p(-probs)


def _inverse_gamma(x, concentration, rate=1.0):
    return (
        concentration * jnp.log(rate)
        - _log_gamma_of_shape(concentration)
        - (concentration + 1.0) * jnp.log(x)
        - rate / x
    )


def _beta(x, concentration1, concentration0):
    log_beta = _log_beta(concentration1, concentration0)
    return (concentration1 - 1.0) * jnp.log(x) + (concentration0 - 1.0) * jnp.log1p(-x) - log_beta


def _dirichlet(x, concentration):
    return jnp.sum((concentration - 1.0) * jnp.log(x), -1) - _log_multivariate_beta(concentration)


def _poisson(x, rate, is_sparse=False):
    del is_sparse
    return x * jnp.log(rate) - rate - gammaln(x + 1.0)


def _bernoulli_probs(x, probs):
    return x * jnp.log(probs) + (1.0 - x) * jnp.log1p(-probs)


def _bernoulli_logits(x, logits):
    return x * logits - jnp.logaddexp(0.0, logits)


def _binomial_probs(x, probs, total_count=1):
    log_comb = gammaln(total_count + 1.0) - gammaln(x + 1.0) - gammaln(total_count - x + 1.0)
    return log_comb + x * jnp.log(probs) + (total_count - x) * jnp.log1p(-probs)


def _categorical_probs(x, probs):
    log_p = jnp.log(probs)
    index = jnp.expand_dims(x, -1).astype(jnp.int32)
    log_p = jnp.broadcast_to(log_p, jnp.shape(index)[:-1] + jnp.shape(log_p)[-1:])
    return jnp.take_along_axis(log_p, index, axis=-1)[..., 0]


def _categorical_logits(x, logits):
    log_p = logits - jnp.log(jnp.sum(jnp.exp(logits), -1, keepdims=True))
    return _categorical_probs(x, jnp.exp(log_p))


def _multinomial_probs(x, probs, total_count=1, total_count_max=None):
    del total_count_max
    norm = gammaln(total_count + 1.0) - jnp.sum(gammaln(x + 1.0), -1)
    return norm + jnp.sum(x * jnp.log(probs), -1)


def _wishart(x, concentration, scale_matrix=None, rate_matrix=None, scale_tril=None):
    if rate_matrix is None:
        if scale_matrix is None and scale_tril is not None:
            scale_matrix = scale_tril @ jnp.swapaxes(scale_tril, -1, -2)
        if scale_matrix is None:
            raise Unsupported("Wishart without a scale")
        rate_matrix = jnp.linalg.inv(scale_matrix)
    d = jnp.shape(x)[-1]
    n = concentration
    trace = jnp.einsum("...ij,...ji->...", rate_matrix, x)
    return (
        0.5 * (n - d - 1.0) * logdet(x)
        - 0.5 * trace
        - 0.5 * n * d * math.log(2.0)
        + 0.5 * n * logdet(rate_matrix)
        - multigammaln(0.5 * n, d)
    )


def _gaussian_random_walk(x, scale=1.0, num_steps=1):
    del num_steps
    steps = jnp.concatenate([x[..., :1], x[..., 1:] - x[..., :-1]], axis=-1)
    return jnp.sum(_normal(steps, 0.0, jnp.expand_dims(scale, -1)), -1)


def _gaussian_state_space(
    x,
    transition_matrix,
    covariance_matrix=None,
    precision_matrix=None,
    scale_tril=None,
    initial_value=None,
    num_steps=1,
):
    # x_t = A x_{t-1} + eps_t, eps_t ~ N(0, Q), x_0 = initial_value (zero by default):
    # a sum of T multivariate normal densities over the (T, d) event.
    del num_steps
    d = jnp.shape(transition_matrix)[-1]
    if initial_value is None:
        initial_value = jnp.zeros((d,), dtype=jnp.result_type(float))
    start = jnp.broadcast_to(initial_value, jnp.shape(x)[:-2] + (d,))[..., None, :]
    previous = jnp.concatenate([start, x[..., :-1, :]], axis=-2)
    loc = jnp.einsum("ij,...tj->...ti", transition_matrix, previous)
    return jnp.sum(_mvn(x, loc, covariance_matrix, precision_matrix, scale_tril), -1)


_DENSITIES: dict[str, Callable] = {
    "Normal": _normal,
    "LogNormal": _log_normal,
    "HalfNormal": _half_normal,
    "MultivariateNormal": _mvn,
    "Gamma": _gamma,
    "Exponential": _exponential,
    "Chi2": _chi2,
    "Uniform": _uniform,
    "Delta": _delta,
    "GeometricProbs": _geometric_probs,
    "InverseGamma": _inverse_gamma,
    "Beta": _beta,
    "Dirichlet": _dirichlet,
    "Poisson": _poisson,
    "BernoulliProbs": _bernoulli_probs,
    "BernoulliLogits": _bernoulli_logits,
    "BinomialProbs": _binomial_probs,
    "CategoricalProbs": _categorical_probs,
    "CategoricalLogits": _categorical_logits,
    "CategoricalQ": _categorical_logits,  # a fitted Categorical q (blrppl.families.categorical) as a prior
    "MultinomialProbs": _multinomial_probs,
    "Wishart": _wishart,
    "GaussianRandomWalk": _gaussian_random_walk,
    "GaussianStateSpace": _gaussian_state_space,
}


def has_canonical(fn: Any) -> bool:
    """Whether :func:`log_density` knows ``fn`` (wrappers looked through)."""
    call = constructor_call(fn)
    name = call.cls.__name__
    if name in ("ExpandedDistribution", "Independent", "MaskedDistribution"):
        return has_canonical(call.arguments["base_dist"])
    return name in _DENSITIES or name == "Unit"


def log_density(fn: Any, value: Any) -> Any:
    """The canonical log density of ``value`` under numpyro distribution ``fn``.

    Returns an array with ``fn.batch_shape``. Wrappers (``expand``,
    ``to_event``, ``mask``) are applied as numpyro defines them.

    Raises:
      Unsupported: ``fn`` (or its base) has no canonical density here.
    """
    call: ConstructorCall = constructor_call(fn)
    name = call.cls.__name__
    args = {k: v for k, v in call.arguments.items() if k != "validate_args"}
    if name == "ExpandedDistribution":
        base = args["base_dist"]
        return _broadcast(log_density(base, value), fn.batch_shape)
    if name == "Independent":
        base = args["base_dist"]
        lp = log_density(base, value)
        n = fn.reinterpreted_batch_ndims if hasattr(fn, "reinterpreted_batch_ndims") else args["reinterpreted_batch_ndims"]
        return jnp.sum(lp, axis=tuple(range(-n, 0))) if n else lp
    if name == "MaskedDistribution":
        base = args["base_dist"]
        lp = log_density(base, value)
        mask = args.get("mask", True)
        if isinstance(mask, bool):
            return lp if mask else jnp.zeros_like(lp)
        return jnp.where(mask, lp, 0.0)
    if name == "Unit":
        return _broadcast(args["log_factor"], fn.batch_shape)
    density = _DENSITIES.get(name)
    if density is None:
        raise Unsupported(f"no canonical log density for {name}")
    accepted = inspect.signature(density).parameters
    args = {k: v for k, v in args.items() if k in accepted}
    return _broadcast(density(value, **args), fn.batch_shape)


def _broadcast(log_prob: Any, batch_shape: tuple) -> Any:
    """Broadcast to the batch shape; a value with more batch dims keeps them."""
    shape = jnp.broadcast_shapes(jnp.shape(log_prob), tuple(batch_shape))
    return jnp.broadcast_to(log_prob, shape)
