"""A damped Newton step on the deterministic ELBO in natural parameters (one full Gaussian).

With ρ = 1 the BLR step on one full Gaussian is the fixed-point iteration
λ ← Σ_f λ̃_f(μ(λ)) (Eq. 58). On funnel-shaped posteriors (centred eight
schools) it contracts slowly (about 0.96 per step: some 150 steps to the
optimum), because q's covariance feeds back into the expected Hessians. The
ELBO itself is deterministic there (exact given a few coordinates,
Gauss-Hermite in them), so Newton's method on it, with Levenberg-Marquardt
damping, converges quadratically near the optimum. Each step keeps the
better of the BLR step and the best damped Newton candidate (by the ELBO),
so the run never ascends more slowly than the BLR alone.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from blrppl.graph.jaxpr import map_batch

#: The largest number of natural parameters handled by Newton (its Hessian is dense).
MAX_NEWTON_SIZE = 400

#: A fit with Newton candidates first takes this many plain BLR steps (its own program) and
#: continues with the candidates only if they did not converge: the candidates' program, the
#: ELBO's Hessian in natural parameters, compiles for 1-2 s on a CPU (a zero-inflated Poisson's
#: first call 2.9 s, 1.1 s without), and most fits converge within these steps without it.
PLAIN_STEPS_FIRST = 30

#: Levenberg-Marquardt dampings tried, relative to the largest |diagonal| of the Hessian.
DAMPINGS = (1e-8, 1e-6, 1e-4, 1e-2, 1.0, 1e2)


def natural_size(qs: Any, arrays: Any) -> int:
    """The number of natural parameters of the plan's q, the Hessian's side (from their shapes:
    nothing runs)."""
    from blrppl.blr.starts import placeholder_natural

    shapes = jax.eval_shape(lambda a: placeholder_natural(qs, a), arrays)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def symmetric(tree: Any) -> Any:
    """Every square-matrix leaf (a precision-like natural parameter) made symmetric."""
    def sym(x):
        if jnp.ndim(x) >= 2 and x.shape[-1] == x.shape[-2]:
            return 0.5 * (x + jnp.swapaxes(x, -1, -2))
        return x

    return jax.tree.map(sym, tree)


def newton_candidate(elbo_of: Callable[[Any], jax.Array], natural: Any) -> tuple[Any, jax.Array]:
    """The best damped Newton step from ``natural`` on ``elbo_of``: (natural, its ELBO).

    ``elbo_of(natural)`` is the deterministic ELBO. Candidates that are not
    finite (a step out of the natural parameter space makes q's Cholesky
    fail) get -inf.
    """
    flat, unravel = ravel_pytree(symmetric(natural))

    # One trace of the ELBO's Python code for the gradient, the Hessian and every candidate:
    # jit caches the jaxpr, and the derivatives are taken of it (tracing the model's ELBO was
    # most of the time to trace a full-Gaussian step: eight schools 0.9 s per trace, four traces).
    @jax.jit
    def objective(x):
        return elbo_of(symmetric(unravel(x)))

    grad = jax.grad(objective)(flat)
    hess = jax.hessian(objective)(flat)
    scale = jnp.maximum(jnp.max(jnp.abs(jnp.diagonal(hess))), 1e-12)
    eye = jnp.eye(flat.shape[0], dtype=flat.dtype)
    dampings = scale * jnp.asarray(DAMPINGS, flat.dtype)

    def candidate(damping):
        step = jnp.linalg.solve(-hess + damping * eye, grad)
        x = flat + step
        value = objective(x)
        return x, jnp.where(jnp.isfinite(value) & jnp.all(jnp.isfinite(x)), value, -jnp.inf)

    xs, values = map_batch(candidate, dampings)
    best = jnp.argmax(values)
    return symmetric(unravel(xs[best])), values[best]
