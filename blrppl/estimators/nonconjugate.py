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
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.transforms import IdentityTransform

from blrppl.compile_mode import probe, structure_of
from blrppl.errors import ModelError
from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, owner
from blrppl.estimators.cubature import MAX_CUBATURE_DIM, cubature, mvn_value_grad_hessian
from blrppl.estimators.delta import delta
from blrppl.estimators.enumeration import (
    ENUMERATION_BUDGET,
    enumerated_expectation,
    is_enumerable,
    plan_enumeration,
)
from blrppl.estimators.glm import minibatch_glm_or_none
from blrppl.estimators.linear_predictor import find_linear_predictor
from blrppl.estimators.minibatch import refuse_minibatch, rows_or_all
from blrppl.estimators.monte_carlo import monte_carlo
from blrppl.estimators.predictor import predictor_estimator
from blrppl.estimators.quadrature import gauss_hermite, gauss_hermite_product
from blrppl.graph.data import DATA_ERRORS
from blrppl.graph.jaxpr import lapack_primitives
from blrppl.graph.nodes import FactorGraph
from blrppl.graph.capture import arguments_only
from blrppl.graph.concrete import with_held_data
from blrppl.graph.replay import replay

QUADRATURE_POINTS = 10


def nonconjugate_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    method: str,
    num_samples: int,
    reason: str,
    plate: Any = None,
) -> FactorEstimator:
    """A delta / Monte Carlo / quadrature estimator for one non-conjugate factor.

    ``method`` applies to the Gaussian neighbours; the others always use
    reparameterised Monte Carlo with ``num_samples`` draws (module docstring).
    ``"quadrature"`` on a likelihood that touches one full Gaussian block only
    through per-observation linear predictors (a GLM, found in the factor's
    code by :mod:`~blrppl.estimators.linear_predictor`) is Gauss-Hermite on
    each predictor; ``"auto"`` picks that, or plain quadrature for small or
    separable factors of one Gaussian, or Monte Carlo.

    Finite discrete neighbours (Bernoulli, Categorical) are enumerated
    (:mod:`~blrppl.estimators.enumeration`): the estimator of the continuous
    ones runs once per configuration of the discrete ones, and the discrete
    site parameters are gradients of the enumerated expectation.

    With a subsampled ``plate`` (stochastic VI), ``estimate(..., batch=idx)``
    re-runs the model on the minibatch's rows and returns their unscaled sum
    (:mod:`~blrppl.estimators.minibatch`; a GLM by Gauss-Hermite on the
    batch's predictors, :mod:`~blrppl.estimators.glm`); the factor must touch
    global latents only, none of them discrete.

    Raises:
      ModelError: when a neighbour's q is a discrete chain, or quadrature is
        asked of a factor with several Gaussian neighbours, or a discrete
        neighbour is too large to enumerate and not separable by observation.
    """
    node = graph.factors[factor]
    neighbours = tuple(node.neighbours)
    gaussians = tuple(v for v in neighbours if qs[v].family.gaussian)
    discrete = tuple(v for v in neighbours if is_enumerable(qs[v]))
    others = tuple(v for v in neighbours if v not in gaussians and v not in discrete)
    for v in others:
        if not qs[v].family.reparameterised:
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate in its neighbours ({reason}), and "
                f"{v!r} has a {qs[v].family.name} q, which has neither a reparameterised sampler nor "
                "a finite support to enumerate; non-conjugate site parameters are implemented for "
                "Gaussian, Gamma, InverseGamma, Beta, Dirichlet, Wishart, Bernoulli and Categorical q. "
                f"Rewrite the factor so that it is conjugate in {v!r}."
            )
    if plate is not None:
        _check_minibatch(graph, factor, neighbours, discrete, plate)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    fixed = {k: v for k, v in examples.items() if k not in neighbours}
    if plate is not None and method in ("auto", "quadrature") and gaussians and not others:
        found = minibatch_glm_or_none(graph, factor, qs, examples, transforms, fixed, plate)
        if found is not None:
            return found
    elif method in ("auto", "quadrature") and gaussians and not others and not discrete:
        found = glm_linear_predictor(graph, factor, qs, examples, transforms, fixed)
        if found is not None:
            return predictor_estimator(factor, qs, *found)
    if discrete:
        return _enumerated_estimator(graph, factor, qs, examples, method, num_samples, discrete, reason)
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
    sequential = calls_lapack(log_density, {v: examples[v] for v in neighbours})
    for v in neighbours:
        if qs[v].family.chain and not separable_blocks(log_density, examples, neighbours, v, qs[v].num_batch + 1):
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate in the chain {v!r} ({reason}) and couples "
                "its time steps; non-conjugate site parameters of a chain are available for factors "
                "that touch each time step separately (observation factors). Keep the transitions "
                "linear-Gaussian."
            )
    second_order = reason != "start"  # a Newton start keeps the first-order value (expectation_over)
    expectation = expectation_over(
        factor, qs, neighbours, method, num_samples, sequential=sequential, second_order=second_order
    )
    if plate is not None:
        log_rows = factor_log_density(
            graph, factor, transforms, fixed, use_canonical=False, observation_plate=plate, subsample=plate
        )

        def estimate_rows(rng_key, mean, params, arrays, idx, weights):
            return expectation(rng_key, mean, lambda values: jnp.sum(weights * log_rows(values, params, arrays.data, idx)))

        return FactorEstimator(
            factor, neighbours, Method((), neighbours, method), rows_or_all(estimate_rows, plate),
            sequential=sequential, subsample=plate,
        )
    gaussian_likelihood = None
    if method in ("cubature", "delta") and not others:
        gaussian_likelihood = mvn_likelihood_parts(graph, factor, qs, transforms, fixed, gaussians)

    def estimate(rng_key, mean, params, arrays, batch=None):
        refuse_minibatch(factor, batch)
        vgh = None
        if gaussian_likelihood is not None:
            vgh = gaussian_likelihood(params, arrays.data)
        return expectation(rng_key, mean, lambda values: log_density(values, params, arrays.data), vgh)

    return FactorEstimator(factor, neighbours, Method((), neighbours, method), estimate, sequential=sequential)


def _enumerated_estimator(graph, factor, qs, examples, method, num_samples, discrete, reason) -> FactorEstimator:
    """Enumeration over the discrete neighbours, ``method`` over the continuous ones."""
    node = graph.factors[factor]
    neighbours = tuple(node.neighbours)
    continuous = tuple(v for v in neighbours if v not in discrete)
    gaussians = tuple(v for v in continuous if qs[v].family.gaussian)
    others = tuple(v for v in continuous if v not in gaussians)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    fixed = {k: v for k, v in examples.items() if k not in neighbours}
    if method == "auto" and continuous:
        held = {**fixed, **{d: examples[d] for d in discrete}}
        method = _auto_method(graph, factor, qs, examples, transforms, held, gaussians, others)
    if method == "quadrature" and (len(gaussians) != 1 or others):
        raise ModelError(
            f"site {factor!r}: Gauss-Hermite quadrature needs a factor with one Gaussian neighbour "
            f"besides the enumerated ones, this one has {list(continuous)}; use estimator='mc' or 'delta'."
        )
    split = factor_log_density(graph, factor, transforms, fixed, use_canonical=False, split_jacobian=True)
    sequential = calls_lapack(lambda values, params: split(values, params)[0], {v: examples[v] for v in neighbours})
    enumeration = plan_enumeration(qs, discrete, lambda values: split(values, {})[0], {v: examples[v] for v in neighbours})
    if enumeration is None:
        raise ModelError(
            f"site {factor!r}: the factor is not conjugate in its neighbours ({reason}); its discrete "
            f"neighbours {list(discrete)} have more than {ENUMERATION_BUDGET} joint values and the "
            "factor does not read one position of each per observation; write the factor so that each "
            "observation reads one position (as in a plate), or marginalise the discrete variable in the model."
        )
    expectation = None
    if continuous:
        expectation = expectation_over(
            factor, qs, continuous, method, num_samples, sequential=sequential, second_order=reason != "start"
        )
    enumerated = enumerated_expectation(qs, enumeration, expectation, sequential=sequential)
    positions = None if enumeration.positions is None else {v: jnp.asarray(p) for v, p in enumeration.positions.items()}

    def estimate(rng_key, mean, params, arrays, batch=None):
        refuse_minibatch(factor, batch)
        return enumerated(
            rng_key, mean, lambda values: split(values, params, arrays.data), arrays.factors[factor]
        )

    name = method if continuous else "enumeration"
    method = Method((), neighbours, name, discrete)
    return FactorEstimator(factor, neighbours, method, estimate, positions, sequential=sequential)


def _check_minibatch(graph: FactorGraph, factor: str, neighbours: Sequence[str], discrete, plate: Any) -> None:
    """Minibatch site parameters of an estimated factor reach continuous global latents only."""
    for v in neighbours:
        if plate.name in graph.variables[v].plates:
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate and touches {v!r}, a latent local to the "
                f"subsampled plate {plate.name!r}; estimated minibatch site parameters are not implemented "
                "for plate-local latents; make the factor conjugate in the local latent, or fit the model "
                "without subsample_size (NonConjugateVI)."
            )
    if discrete:
        raise ModelError(
            f"site {factor!r}: the factor is not conjugate and touches the discrete {list(discrete)}; "
            "enumerated site parameters on minibatches are not implemented; fit the model without "
            "subsample_size (NonConjugateVI), or marginalise the discrete variable in the model."
        )


def expectation_over(
    factor: str,
    qs: Mapping[str, Any],
    variables: Sequence[str],
    method: str,
    num_samples: int,
    *,
    sequential: bool = False,
    second_order: bool = True,
) -> Callable:
    """``(rng_key, mean, log_f, value_grad_hessian=None) -> (E_q[log_f], {v: ∇_μv E_q[log_f]})``.

    ``log_f`` maps a dict of values (q's space) of ``variables`` to a scalar.
    Gaussian variables use ``method`` (Bonnet/Price, Eqs. 10-11); the others
    reparameterised Monte Carlo through their mean parameters, the Gaussian
    estimator running on ``log_f`` averaged over their draws. With
    ``sequential``, samples and nodes are evaluated one at a time
    (``lax.map``): ``log_f`` calls LAPACK. ``value_grad_hessian`` (cubature
    and delta) replaces autodiff of ``log_f`` on the flat vector of the Gaussian
    variables, in sorted order (:func:`~blrppl.estimators.cubature.cubature`).
    ``second_order``: the delta method's value is log f(m) + ½ tr(H Σ) (consistent with its
    site parameters: Laplace's evidence at the fixed point); without, log f(m), the value of a
    Newton start, whose ELBO guard then keeps q wide (a funnel's mode, where the scale
    collapses, is not approached; see :func:`blrppl.estimators.delta.delta`).
    """
    gaussians = tuple(v for v in variables if qs[v].family.gaussian)
    others = tuple(v for v in variables if v not in gaussians)
    if method == "delta":
        gaussian = delta(second_order=second_order)
    elif method == "mc":
        hessian = "reparam" if _small(qs, gaussians) else "first_order"
        gaussian = monte_carlo(num_samples, hessian=hessian, sequential=sequential)
    elif method == "quadrature":
        gaussian = gauss_hermite(QUADRATURE_POINTS, sequential=sequential)
    elif method == "cubature":
        gaussian = cubature(sequential=sequential)
    else:
        raise ModelError(
            f"site {factor!r}: unknown estimator {method!r}; use 'delta', 'mc', 'quadrature' or 'cubature'."
        )

    def gaussian_estimate(rng_key, mean, log_f, value_grad_hessian=None):
        """Bonnet/Price site parameters of the Gaussian variables of ``log_f``."""
        marginal = {v: qs[v].marginals(mean[v]) for v in gaussians}
        shaped = log_f

        def log_f(values):  # a block over several axes is sampled flat: give it its shape
            return shaped({**values, **{v: qs[v].value_from_family(x) for v, x in values.items() if v in gaussians}})

        if method == "quadrature" and len(gaussians) == 2:  # a scalar and a plated variable
            value, grads = gauss_hermite_product(QUADRATURE_POINTS, sequential=sequential).estimate(
                rng_key, marginal, log_f
            )
        elif method == "quadrature":
            (v,) = gaussians
            value, grad = gaussian.estimate(rng_key, marginal[v], lambda x: log_f({v: x}))
            grads = {v: grad}
        elif value_grad_hessian is not None:
            rule = cubature(
                sequential=sequential, value_grad_hessian=value_grad_hessian, at_mean=method == "delta",
                second_order=second_order,
            )
            value, grads = rule.estimate(rng_key, marginal, log_f)
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

    def estimate(rng_key, mean, log_f, value_grad_hessian=None):
        if others:
            return others_estimate(rng_key, mean, log_f)
        return gaussian_estimate(rng_key, mean, log_f, value_grad_hessian)

    return estimate


def separable_blocks(log_density, examples, neighbours, v, num_axes: int = 1, num_masks: int = 3) -> bool:
    """Whether log f's Hessian in ``v`` is block diagonal over the leading ``num_axes`` axes of its
    value (random masks): a chain's (sequence, time), a plated variable's elements.

    ``num_axes``: the leading axes of the value that index the blocks. The
    Hessian-vector products of every mask are one compiled program (:func:`probe`), not
    eager operations (60 one-operation compilations, 0.7 s, on a stochastic volatility model).
    """
    x0 = np.asarray(examples[v], dtype=jnp.result_type(float))
    rest = {k: examples[k] for k in neighbours if k != v}
    grad = jax.grad(lambda x: log_density({**rest, v: x}, {}))
    rng = np.random.default_rng(0)
    masks = []
    for _ in range(num_masks):
        keep = rng.random(x0.shape[:num_axes]) < 0.5
        masks.append(keep.reshape(keep.shape + (1,) * (x0.ndim - num_axes)).astype(x0.dtype))
    directions = [rng.normal(size=x0.shape).astype(x0.dtype) * mask for mask in masks]
    responses = probe(lambda x, ds: [jax.jvp(grad, (x,), (d,))[1] for d in ds])(x0, directions)
    for mask, response in zip(masks, responses):
        response = np.asarray(response)
        leak = np.max(np.abs(response * (1.0 - mask)))
        if not leak <= 1e-8 * (1.0 + np.max(np.abs(response))):
            return False
    return True


def glm_linear_predictor(graph, factor, qs, examples, transforms, fixed):
    """A GLM structure η = A z + o of the factor in its Gaussian neighbours, if any.

    z concatenates the neighbours' values (each a full block, or independent
    Normal elements); returns ``(predictor, names, slices, closed)`` or None,
    ``closed`` when the data had to be analysed as constants. Shared with
    :mod:`blrppl.influence_glm`.
    """
    node = graph.factors[factor]
    names = tuple(node.neighbours)
    for v in names:
        q = qs[v]
        linear = q.transform is None or (q.joint and all(_identity(m.transform) for m in graph.variables[v].members))
        if not q.family.gaussian or q.family.chain or not linear or owner(graph, factor) == v:
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
    # The data as inputs of the analysed code, so that compiled fits take them as arguments; the
    # arrays the model needs as values (graph.held_data) are constants of it, held by the plan too.
    try:
        predictor, closed = find_linear_predictor(fn, z0, graph.data.arrays), False
    except DATA_ERRORS:
        try:
            predictor, closed = find_linear_predictor(fn, z0, with_held_data(graph, graph.held_data)), False
        except DATA_ERRORS:  # (every array needed as values: analysed with the data as constants)
            predictor, closed = find_linear_predictor(lambda z, data: fn(z, None), z0), True
    return None if predictor is None else (predictor, names, slices, closed)


def _identity(transform) -> bool:
    return transform is None or isinstance(transform, IdentityTransform)


def _auto_method(graph, factor, qs, examples, transforms, fixed, gaussians, others) -> str:
    """Quadrature or cubature where they are accurate and cheap, else Monte Carlo.

    One Gaussian neighbour that is a small full block (d <= 2), or a plated
    Normal whose log factor is separable across its elements (checked with
    two Hessian-vector products at the example point), gets Gauss-Hermite;
    Gaussian neighbours of total dimension at most ``MAX_CUBATURE_DIM``
    (a few scalar hyperparameters) the degree-5 cubature; everything else
    reparameterised Monte Carlo.
    """
    if others or not gaussians:
        return "mc"
    if len(gaussians) == 1 and _single_quadrature(graph, factor, qs, examples, transforms, fixed, gaussians[0]):
        return "quadrature"
    return "cubature" if _cubature_fits(qs, gaussians) else "mc"


def _cubature_fits(qs, gaussians) -> bool:
    """Gaussian (not chain) neighbours of total dimension at most ``MAX_CUBATURE_DIM``."""
    if any(qs[v].family.chain or not qs[v].family.gaussian for v in gaussians):
        return False
    return sum(math.prod(qs[v].shape) for v in gaussians) <= MAX_CUBATURE_DIM


def _single_quadrature(graph, factor, qs, examples, transforms, fixed, v) -> bool:
    """Whether Gauss-Hermite suits the one Gaussian neighbour ``v`` (see :func:`_auto_method`)."""
    q = qs[v]
    if q.family.chain:  # separable over time (checked): one small Gaussian per step
        return math.prod(q.shape[q.num_batch + 1 :]) <= 2
    if q.family.event_ndim == 1:
        return not q.num_batch and math.prod(q.block_shape) <= 2
    log_density = factor_log_density(graph, factor, transforms, fixed, use_canonical=False)
    x0 = np.asarray(examples[v], dtype=jnp.result_type(float))
    if x0.size <= 1:
        return True
    grad = jax.grad(lambda x: log_density({v: x}, {}))
    direction = np.random.default_rng(0).normal(size=x0.shape).astype(x0.dtype)

    def products(x, d):  # one compiled program (:func:`probe`), not eager operations
        return jax.jvp(grad, (x,), (jnp.ones_like(x),))[1], jax.jvp(grad, (x,), (d,))[1]

    diagonal, directional = (np.asarray(a) for a in probe(products)(x0, direction))
    return bool(np.max(np.abs(directional - diagonal * direction)) <= 1e-8 * (1.0 + np.max(np.abs(diagonal))))


def calls_lapack(log_density: Callable, values: Mapping[str, Any]) -> bool:
    """Whether the factor's code calls LAPACK (then its samples are evaluated with ``lax.map``)."""
    jaxpr = jax.make_jaxpr(lambda v: log_density(v, {}))(dict(values))
    return bool(lapack_primitives(jaxpr))


def mvn_likelihood_parts(graph, factor, qs, transforms, fixed, gaussians) -> Optional[Callable]:
    """For ``y ~ MultivariateNormal(loc(u), covariance_matrix=K(u))`` of a few scalars u, the
    one-Cholesky value/gradient/Hessian (:func:`~blrppl.estimators.cubature.mvn_value_grad_hessian`).

    Returns ``(params, data) -> (u -> (log f, g, H))`` over the flat vector of
    the Gaussian neighbours (sorted, as the cubature flattens them), or None
    when the factor is not one observed MultivariateNormal event with a
    covariance (or scale_tril) argument, unmasked and unscaled.
    """
    if owner(graph, factor) is not None or graph.factors[factor].sites:
        return None
    names = tuple(sorted(gaussians))
    shapes = [tuple(qs[v].shape) for v in names]
    sizes = [math.prod(s) for s in shapes]

    def constrain_into(values, v, x):
        transform = transforms.get(v)
        if transform is None:
            values[v] = x
        elif hasattr(transform, "log_abs_det_jacobian_site"):  # a joint block of sites
            values.update(transform(x))
        else:
            values[v] = transform(x)

    def site_at(u, params, data):
        values, start = {}, 0
        for v, shape, size in zip(names, shapes, sizes):
            constrain_into(values, v, jnp.reshape(u[start : start + size], shape))
            start += size
        for k, x in fixed.items():
            constrain_into(values, k, x)
        with arguments_only():  # the kernel matrix is read, never factorised here
            return replay(graph, values, params, data=data)[factor]

    examples = jnp.zeros(sum(sizes))
    site = structure_of(site_at, examples, {}, None)  # read for its distribution and arguments only
    call = site.call
    if not site.is_observed or site.mask is not None or site.scale is not None:
        return None
    if call is None or not call.captured or not issubclass(call.cls, dist.MultivariateNormal):
        return None
    if "covariance_matrix" not in call.arguments and "scale_tril" not in call.arguments:
        return None
    if site.fn.batch_shape != ():
        return None
    event_shape = site.fn.event_shape

    def parts(params, data):
        def moments(u):
            arguments = site_at(u, params, data).call.arguments
            if "covariance_matrix" in arguments:
                cov = jnp.asarray(arguments["covariance_matrix"])
            else:
                tril = jnp.asarray(arguments["scale_tril"])
                cov = tril @ tril.T
            return cov, jnp.broadcast_to(jnp.asarray(arguments.get("loc", 0.0)), event_shape)

        return mvn_value_grad_hessian(moments, site_at(examples, params, data).value)

    return parts


def _small(qs, neighbours) -> bool:
    """Exact Hessians for small factors; gradient-only estimates for large ones."""
    return sum(math.prod(qs[v].shape) for v in neighbours) <= 64
