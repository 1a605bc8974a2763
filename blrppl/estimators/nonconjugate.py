"""Estimators for factors without exact site parameters (Khan & Rue, Sec. 5.4).

A non-conjugate factor gets its site parameters λ̃_f = ∇_μ E_q[log f] from an
estimator, per neighbour:

- Gaussian q (on the site's own space, or on the unconstrained space of its
  support): Bonnet and Price (Eqs. 10-11) by the delta method
  (Newton/Laplace), reparameterised Monte Carlo, or Gauss-Hermite quadrature
  (:mod:`blrppl.estimators.gaussian`).
- Other exponential-family q with a reparameterisable sampler (Gamma,
  InverseGamma, Beta, Dirichlet, Wishart): reparameterised Monte Carlo
  *through the mean parameters*: draws x(μ) = sample(λ(μ), ε), so
  ∇_μ mean_s log f(x_s(μ)) is an unbiased estimate of the natural gradient
  in that family's own coordinates (Sec. 2: the gradient w.r.t. μ is the
  natural gradient w.r.t. λ). No Fisher matrix is formed.

When both kinds meet in one factor, the Gaussian estimator runs on
log f averaged over the other neighbours' draws, and the gradient of its
value with respect to the other neighbours' μ gives their site parameters.
The log factor is the model's own numpyro log density (Jacobians of
transforms included in each variable's own prior factor), so any
differentiable model code is fine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.errors import ModelError
from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, owner
from blrppl.estimators.delta import delta
from blrppl.estimators.linear_predictor import LinearPredictor, find_linear_predictor
from blrppl.estimators.monte_carlo import monte_carlo
from blrppl.estimators.quadrature import (
    gauss_hermite,
    hermite_rule,
    predictor_expectations,
)
from blrppl.families import MVNStats, NormalStats
from blrppl.graph.data import DATA_ERRORS
from blrppl.graph.nodes import FactorGraph

QUADRATURE_POINTS = 10
#: Nodes per linear predictor: one-dimensional, so many are cheap (softplus-type
#: likelihoods reach ~1e-5 relative accuracy with 20, 1e-9 with 50).
PREDICTOR_POINTS = 20


def nonconjugate_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    method: str,
    num_samples: int,
    reason: str,
) -> FactorEstimator:
    """A delta / Monte Carlo / quadrature estimator for one non-conjugate factor.

    ``method`` applies to the Gaussian neighbours; the others always use
    reparameterised Monte Carlo with ``num_samples`` draws (module docstring).
    ``"quadrature"`` on a likelihood that touches one full Gaussian block only
    through per-observation linear predictors (a GLM, found in the factor's
    code by :mod:`~blrppl.estimators.linear_predictor`) is Gauss-Hermite on
    each predictor; ``"auto"`` picks that, or plain quadrature for small or
    separable factors of one Gaussian, or Monte Carlo.

    Raises:
      ModelError: when a neighbour's q has no reparameterised sampler
        (Categorical, Bernoulli, chains), or quadrature is asked of a factor
        with several Gaussian neighbours.
    """
    node = graph.factors[factor]
    neighbours = tuple(node.neighbours)
    gaussians = tuple(v for v in neighbours if qs[v].family.gaussian)
    others = tuple(v for v in neighbours if v not in gaussians)
    for v in others:
        if not qs[v].family.reparameterised:
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate in its neighbours ({reason}), and "
                f"{v!r} has a {qs[v].family.name} q, which has no reparameterised sampler; "
                "non-conjugate site parameters are implemented for Gaussian, Gamma, InverseGamma, "
                "Beta, Dirichlet and Wishart q. Rewrite the factor so that it is conjugate in "
                f"{v!r} (e.g. enumerate a discrete variable explicitly), or give {v!r} a "
                "continuous prior."
            )
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    fixed = {k: v for k, v in examples.items() if k not in neighbours}
    if method in ("auto", "quadrature") and gaussians and not others:
        found = _linear_predictor(graph, factor, qs, examples, transforms, fixed)
        if found is not None:
            return _predictor_estimator(factor, qs, *found)
    if method == "auto":
        method = _auto_method(graph, factor, qs, examples, transforms, fixed, gaussians, others)
    if method == "quadrature" and (len(gaussians) != 1 or others):
        raise ModelError(
            f"site {factor!r}: Gauss-Hermite quadrature needs a factor with one Gaussian neighbour, "
            f"this one has {list(neighbours)}; use estimator='mc' or 'delta' for it."
        )
    log_density = factor_log_density(graph, factor, transforms, fixed, use_canonical=False)
    if not neighbours:  # a factor of point estimates only (the prior of a held hyperparameter)

        def point_estimate(rng_key, mean, params, arrays, batch=None):
            del rng_key, mean
            refuse_minibatch(factor, batch)
            return log_density({}, params, arrays.data), {}

        return FactorEstimator(factor, (), Method((), (), method), point_estimate)
    for v in neighbours:
        if qs[v].family.chain and not _separable_in_time(log_density, examples, neighbours, v, qs[v].num_batch + 1):
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate in the chain {v!r} ({reason}) and couples "
                "its time steps; non-conjugate site parameters of a chain are available for factors "
                "that touch each time step separately (observation factors). Keep the transitions "
                "linear-Gaussian."
            )
    expectation = expectation_over(factor, qs, neighbours, method, num_samples)

    def estimate(rng_key, mean, params, arrays, batch=None):
        refuse_minibatch(factor, batch)
        return expectation(rng_key, mean, lambda values: log_density(values, params, arrays.data))

    return FactorEstimator(factor, neighbours, Method((), neighbours, method), estimate)


def refuse_minibatch(factor: str, batch: Any) -> None:
    """Estimated site parameters read all observations: no ``batch`` (SVI) yet."""
    if batch is not None:
        raise ModelError(
            f"site {factor!r}: minibatches of non-conjugate factors are not supported yet; "
            "use SVI on conjugate models."
        )


def expectation_over(
    factor: str, qs: Mapping[str, Any], variables: Sequence[str], method: str, num_samples: int
) -> Callable:
    """``(rng_key, mean, log_f) -> (E_q[log_f], {v: ∇_μv E_q[log_f]})`` over ``variables``.

    ``log_f`` maps a dict of values (q's space) of ``variables`` to a scalar.
    Gaussian variables use ``method`` (Bonnet/Price, Eqs. 10-11); the others
    reparameterised Monte Carlo through their mean parameters, the Gaussian
    estimator running on ``log_f`` averaged over their draws.
    """
    gaussians = tuple(v for v in variables if qs[v].family.gaussian)
    others = tuple(v for v in variables if v not in gaussians)
    if method == "delta":
        gaussian = delta()
    elif method == "mc":
        gaussian = monte_carlo(num_samples, hessian="reparam" if _small(qs, gaussians) else "first_order")
    elif method == "quadrature":
        gaussian = gauss_hermite(QUADRATURE_POINTS)
    else:
        raise ModelError(f"site {factor!r}: unknown estimator {method!r}; use 'delta', 'mc' or 'quadrature'.")

    def gaussian_estimate(rng_key, mean, log_f):
        """Bonnet/Price site parameters of the Gaussian variables of ``log_f``."""
        marginal = {v: qs[v].marginals(mean[v]) for v in gaussians}
        if method == "quadrature":
            (v,) = gaussians
            value, grad = gaussian.estimate(rng_key, marginal[v], lambda x: log_f({v: x}))
            grads = {v: grad}
        else:
            value, grads = gaussian.estimate(rng_key, marginal, log_f)
        return value, {v: qs[v].from_marginals(mean[v], g) for v, g in dict(grads).items()}

    def others_estimate(rng_key, mean, log_f):
        """Reparameterised MC through the mean parameters of the other variables."""
        gaussian_key, draw_key = jax.random.split(rng_key)

        def expected(other_mean):
            draws = {}
            for v, key in zip(others, jax.random.split(draw_key, len(others))):
                family = qs[v].family
                draws[v] = family.sample(key, family.natural_params(other_mean[v]), (num_samples,))

            def averaged(values):
                return jnp.mean(jax.vmap(lambda drawn: log_f({**values, **drawn}))(draws))

            if not gaussians:
                return averaged({}), {}
            return gaussian_estimate(gaussian_key, mean, averaged)

        (value, grads), other_grads = jax.value_and_grad(expected, has_aux=True)(
            {v: mean[v] for v in others}
        )
        return value, {**grads, **other_grads}

    def estimate(rng_key, mean, log_f):
        if others:
            return others_estimate(rng_key, mean, log_f)
        return gaussian_estimate(rng_key, mean, log_f)

    return estimate


def _separable_in_time(log_density, examples, neighbours, v, num_axes: int = 1, num_masks: int = 3) -> bool:
    """Whether log f's Hessian in the chain ``v`` is block diagonal over (sequence, time) (random masks).

    ``num_axes``: the leading axes of the chain's value that index sequences and time.
    """
    x0 = jnp.asarray(examples[v], dtype=float)
    rest = {k: examples[k] for k in neighbours if k != v}
    grad = jax.grad(lambda x: log_density({**rest, v: x}, {}))
    rng = np.random.default_rng(0)
    for _ in range(num_masks):
        keep = rng.random(x0.shape[:num_axes]) < 0.5
        mask = jnp.asarray(keep.reshape(keep.shape + (1,) * (x0.ndim - num_axes)), x0.dtype)
        probe = jnp.asarray(rng.normal(size=x0.shape), x0.dtype) * mask
        response = jax.jvp(grad, (x0,), (probe,))[1]
        leak = jnp.max(jnp.abs(response * (1.0 - mask)))
        if not bool(leak <= 1e-8 * (1.0 + jnp.max(jnp.abs(response)))):
            return False
    return True


def _linear_predictor(graph, factor, qs, examples, transforms, fixed):
    """A GLM structure η = A z + o of the factor in its Gaussian neighbours, if any.

    z concatenates the neighbours' values (each a full block, or independent
    Normal elements); returns ``(predictor, names, slices)`` or None.
    """
    node = graph.factors[factor]
    names = tuple(node.neighbours)
    for v in names:
        q = qs[v]
        if not q.family.gaussian or q.family.chain or q.transform is not None or owner(graph, factor) == v:
            return None
        if q.family.event_ndim == 1 and q.num_batch:
            return None
    if node.param_neighbours:
        return None
    sizes = [math.prod(qs[v].shape) for v in names]
    bounds = np.cumsum([0] + sizes)
    slices = tuple(slice(int(a), int(b)) for a, b in itertools.pairwise(bounds))
    per_element = factor_log_density(graph, factor, transforms, fixed, use_canonical=False, elementwise=True)

    def fn(z, data):
        return per_element({v: jnp.reshape(z[sl], qs[v].shape) for v, sl in zip(names, slices)}, {}, data)

    z0 = jnp.concatenate([jnp.ravel(jnp.asarray(examples[v], dtype=float)) for v in names])
    try:  # the data as an input of the analysed code, so that compiled fits take them as arguments
        predictor, closed = find_linear_predictor(fn, z0, graph.data.arrays), False
    except DATA_ERRORS:  # the model needs concrete data values: analyse it with the data as constants
        predictor, closed = find_linear_predictor(lambda z, data: fn(z, None), z0), True
    return None if predictor is None else (predictor, names, slices, closed)


def _predictor_estimator(factor: str, qs, predictor: LinearPredictor, names, slices, closed: bool) -> FactorEstimator:
    """Gauss-Hermite on each linear predictor η_n (Khan & Lin 2017; Eqs. 10-11).

    Under mean-field q over the neighbours, η_n is Gaussian with mean
    Σ_v A_v m_v + o and variance Σ_v a_nvᵀ Σ_v a_nv; with E[ℓ'], E[ℓ''] per
    observation, each neighbour's natural gradient is Bonnet/Price with its
    own Hessian block A_vᵀ diag(E[ℓ'']) A_v (its diagonal for independent
    Normal elements).
    """
    nodes, weights = hermite_rule(PREDICTOR_POINTS)

    def estimate(rng_key, mean, params, arrays, batch=None):
        del rng_key, params
        refuse_minibatch(factor, batch)
        design, offset = arrays.factors[factor]
        data = None if closed else arrays.data
        eta_mean, eta_var = offset, 0.0
        blocks = []
        for v, sl in zip(names, slices):
            a, stats = design[:, sl], mean[v]
            if isinstance(stats, MVNStats):
                m = stats.x
                cov = stats.xxT - jnp.outer(m, m)
                eta_var = eta_var + jnp.sum((a @ cov) * a, axis=1)
            else:
                m = jnp.ravel(stats.x)
                eta_var = eta_var + (a * a) @ (jnp.ravel(stats.x_sq) - m * m)
            eta_mean = eta_mean + a @ m
            blocks.append((v, a, m, stats))
        expected, d1, d2 = predictor_expectations(
            lambda eta: predictor.log_likelihood(eta, data), eta_mean, eta_var, nodes, weights
        )
        grads = {}
        for v, a, m, stats in blocks:
            g = a.T @ d1
            if isinstance(stats, MVNStats):
                hessian = (a * d2[:, None]).T @ a
                grads[v] = MVNStats(x=g - hessian @ m, xxT=0.5 * hessian)  # Eqs. 10-11
            else:
                diagonal = (a * a).T @ d2
                shape = qs[v].shape
                grads[v] = NormalStats(x=jnp.reshape(g - diagonal * m, shape), x_sq=jnp.reshape(0.5 * diagonal, shape))
        return jnp.sum(expected), grads

    method = Method((), tuple(names), "quadrature")
    return FactorEstimator(factor, tuple(names), method, estimate, (predictor.design, predictor.offset), closed_data=closed)


def _auto_method(graph, factor, qs, examples, transforms, fixed, gaussians, others) -> str:
    """Quadrature where it is exact to high order and cheap, else Monte Carlo.

    One Gaussian neighbour that is a small full block (d <= 2), or a plated
    Normal whose log factor is separable across its elements (checked with
    two Hessian-vector products at the example point), gets Gauss-Hermite;
    everything else reparameterised Monte Carlo.
    """
    if len(gaussians) != 1 or others:
        return "mc"
    (v,) = gaussians
    q = qs[v]
    if q.family.chain:  # separable over time (checked): one small Gaussian per step
        return "quadrature" if math.prod(q.shape[q.num_batch + 1 :]) <= 2 else "mc"
    if q.family.event_ndim == 1:
        return "quadrature" if not q.num_batch and math.prod(q.block_shape) <= 2 else "mc"
    log_density = factor_log_density(graph, factor, transforms, fixed, use_canonical=False)
    x0 = jnp.asarray(examples[v], dtype=float)
    if x0.size <= 1:
        return "quadrature"
    grad = jax.grad(lambda x: log_density({v: x}, {}))
    probe = jnp.asarray(np.random.default_rng(0).normal(size=x0.shape), x0.dtype)
    diagonal = jax.jvp(grad, (x0,), (jnp.ones_like(x0),))[1]
    directional = jax.jvp(grad, (x0,), (probe,))[1]
    separable = jnp.max(jnp.abs(directional - diagonal * probe)) <= 1e-8 * (1.0 + jnp.max(jnp.abs(diagonal)))
    return "quadrature" if bool(separable) else "mc"


def _small(qs, neighbours) -> bool:
    """Exact Hessians for small factors; gradient-only estimates for large ones."""
    return sum(math.prod(qs[v].shape) for v in neighbours) <= 64
