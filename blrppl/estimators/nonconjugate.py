"""Estimators for factors without exact site parameters (Khan & Rue, Sec. 5.4).

A non-conjugate factor whose neighbours all have Gaussian q (on the site's own
space, or on the unconstrained space of its support) gets its site parameters
from a Gaussian natural-gradient estimator: the delta method (Newton/Laplace),
reparameterised Monte Carlo, or Gauss-Hermite quadrature
(:mod:`blrppl.estimators.gaussian`). The log factor is the model's own
numpyro log density (Jacobians of transforms included in each variable's own
prior factor), so any differentiable model code is fine.
"""

from __future__ import annotations

from typing import Any, Mapping

from blrppl.errors import ModelError
from blrppl.estimators.base import FactorEstimator, factor_log_density
from blrppl.estimators.delta import delta
from blrppl.estimators.monte_carlo import monte_carlo
from blrppl.estimators.quadrature import gauss_hermite
from blrppl.graph.nodes import FactorGraph
from blrppl.symbolic.expectation import GAUSSIAN

QUADRATURE_POINTS = 10


def gaussian_factor_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
    method: str,
    num_samples: int,
    reason: str,
) -> FactorEstimator:
    """A delta / Monte Carlo / quadrature estimator for one factor.

    Raises:
      ModelError: when a neighbour's q is not Gaussian (its non-conjugate
        site parameters are not available yet), or quadrature is asked of a
        factor with several neighbours.
    """
    node = graph.factors[factor]
    neighbours = tuple(node.neighbours)
    for v in neighbours:
        if qs[v].kind != GAUSSIAN:
            raise ModelError(
                f"site {factor!r}: the factor is not conjugate in its neighbours ({reason}), and "
                f"{v!r} has a {qs[v].family.name} q; non-conjugate site parameters are available for "
                "Gaussian q only; use families={" + repr(v) + ": 'Normal'} (a Gaussian on the "
                "unconstrained space) or a conjugate model."
            )
    if method == "quadrature" and len(neighbours) != 1:
        raise ModelError(
            f"site {factor!r}: Gauss-Hermite quadrature needs a factor with one Gaussian neighbour, "
            f"this one has {list(neighbours)}; use estimator='mc' or 'delta' for it."
        )
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    fixed = {k: v for k, v in examples.items() if k not in neighbours}
    log_density = factor_log_density(graph, factor, transforms, fixed, use_canonical=False)
    if method == "delta":
        gaussian = delta()
    elif method == "mc":
        gaussian = monte_carlo(num_samples, hessian="reparam" if _small(qs, neighbours) else "first_order")
    elif method == "quadrature":
        gaussian = gauss_hermite(QUADRATURE_POINTS)
    else:
        raise ModelError(f"site {factor!r}: unknown estimator {method!r}; use 'delta', 'mc' or 'quadrature'.")

    def estimate(rng_key, mean, params, batch=None):
        if batch is not None:
            raise ModelError(
                f"site {factor!r}: minibatches of non-conjugate factors are not supported yet; "
                "use SVI on conjugate models."
            )
        blocks = {v: mean[v] for v in neighbours}
        if method == "quadrature":
            (v,) = neighbours
            value, grad = gaussian.estimate(rng_key, blocks[v], lambda x: log_density({v: x}, params))
            return value, {v: grad}
        value, grads = gaussian.estimate(rng_key, blocks, lambda xs: log_density(xs, params))
        return value, dict(grads)

    return FactorEstimator(factor, neighbours, method, estimate)


def _small(qs, neighbours) -> bool:
    """Exact Hessians for small factors; gradient-only estimates for large ones."""
    import math

    return sum(math.prod(qs[v].shape) for v in neighbours) <= 64
