"""The delta method for Gaussian q: Newton's method / the Laplace approximation.

E_q[g] and E_q[H] are replaced by their values at the mean, g(m) and H(m), and
E_q[log f] by log f(m) (Khan & Rue, Sec. 1.3.2 and 4.4). The natural gradient
is then (g(m) - H(m) m, H(m) / 2), so a BLR step with ρ = 1 is a Newton step on
log p̄ and its fixed point is the Laplace approximation. With a diagonal q only
the diagonal of H(m) is used (in both terms).
"""

from __future__ import annotations

from typing import Callable

import jax

from blrppl._types import Array, PRNGKey
from blrppl.estimators.gaussian import (
    GaussianEstimator,
    GaussianStats,
    block_hessian,
    is_full,
    natural_gradient,
    total_log_factor,
)


def delta(*, separable: bool = False) -> GaussianEstimator:
    """Build the delta-method estimator (Khan & Rue, Eqs. 10-11 with E at the mean).

    .. math::

        \\hat g = \\big(g(m) - H(m)\\, m,\\; H(m) / 2\\big),
        \\qquad \\text{value} = \\log f(m).

    Args:
      separable: promise that log f is a sum of terms each touching one element
        (``NormalStats``) or one block (``MVNStats``); the Hessian blocks then
        cost one (resp. d) Hessian-vector products instead of the full n x n
        Hessian. Wrong answers if the promise is false.

    Returns:
      A :class:`GaussianEstimator` with ``method="delta"``; its ``estimate``
      ignores ``rng_key`` and the covariance part of ``mean``.

    Example:
        >>> from blrppl.families.normal import NormalStats
        >>> mean = NormalStats(x=jax.numpy.array(1.0), x_sq=jax.numpy.array(2.0))
        >>> delta().estimate(None, mean, lambda x: -0.5 * (x - 3.0) ** 2)
        (Array(-2., dtype=float64), NormalStats(x=Array(3., dtype=float64), x_sq=Array(-0.5, dtype=float64)))
    """

    def estimate(
        rng_key: PRNGKey | None, mean: GaussianStats, log_factor: Callable[[Array], Array]
    ) -> tuple[Array, GaussianStats]:
        del rng_key  # Deterministic.
        total = total_log_factor(log_factor)
        value, grad = jax.value_and_grad(total)(mean.x)
        hessian = block_hessian(total, mean.x, is_full(mean), separable)
        return value, natural_gradient(mean, grad, hessian)

    return GaussianEstimator(estimate=estimate, method="delta")
