"""The delta method for Gaussian q: Newton's method / the Laplace approximation.

E_q[g] and E_q[H] are replaced by their values at the mean, g(m) and H(m), and
E_q[log f] by that of log f's quadratic expansion at m, log f(m) + ½ tr(H(m) Σ)
(Khan & Rue, Sec. 1.3.2 and 4.4). The natural gradient is then
(g(m) - H(m) m, H(m) / 2), so a BLR step with ρ = 1 is a Newton step on
log p̄ and its fixed point is the Laplace approximation, where the ELBO is
Laplace's evidence, log p̄(m) + ½ log det(2π Σ). With a diagonal q only
the diagonal of H(m) is used (in both terms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from blrppl._types import Array, PRNGKey
from blrppl.estimators.gaussian import (
    JOINT_HESSIAN_MAX_SIZE,
    GaussianEstimator,
    beside_zero,
    block_hessian,
    conditional,
    curvature_term,
    flatten_blocks,
    is_full,
    joint_log_factor,
    natural_gradient,
    value_grad_hessians,
)


def delta(*, separable: bool = False, second_order: bool = True) -> GaussianEstimator:
    """Build the delta-method estimator (Khan & Rue, Eqs. 10-11 with E at the mean).

    .. math::

        \\hat g = \\big(g(m) - H(m)\\, m,\\; H(m) / 2\\big),
        \\qquad \\text{value} = \\log f(m) + \\tfrac12 \\operatorname{tr}(H(m)\\, \\Sigma).

    ``mean`` may be one Gaussian block or a pytree of blocks (see
    :mod:`~blrppl.estimators.gaussian`); ``log_factor`` takes values shaped alike.

    Args:
      separable: promise that log f is a sum of terms each touching one element
        (``NormalStats``) or one block (``MVNStats``); the Hessian blocks then
        cost one (resp. d) Hessian-vector products instead of the full n x n
        Hessian. Wrong answers if the promise is false.
      second_order: the value with ½ tr(H(m) Σ) (:func:`~blrppl.estimators.gaussian.curvature_term`);
        False gives log f(m) alone (a Newton start's guard: with the entropy it favours wide q).

    Returns:
      A :class:`GaussianEstimator` with ``method="delta"``; its ``estimate``
      ignores ``rng_key`` and the covariance part of ``mean``.

    Example:
        >>> from blrppl.families.normal import NormalStats
        >>> mean = NormalStats(x=jax.numpy.array(1.0), x_sq=jax.numpy.array(2.0))
        >>> value, g = delta().estimate(None, mean, lambda x: -0.5 * (x - 3.0) ** 2)
        >>> float(value), [float(v) for v in g]  # log f(m) + H v / 2; (g - H m, H / 2) with H = -1, v = 1
        (-2.5, [3.0, -0.5])
    """

    def estimate(
        rng_key: PRNGKey | None,
        mean: Any,
        log_factor: Callable[[Any], Array],
    ) -> tuple[Array, Any]:
        del rng_key  # Deterministic.
        blocks, treedef = flatten_blocks(mean)
        total = joint_log_factor(log_factor, treedef)
        locs = [beside_zero(block.x) for block in blocks]  # (a zero-mean start's kinks)
        if not separable and sum(x.size for x in locs) <= JOINT_HESSIAN_MAX_SIZE:
            value, grads, hessians = value_grad_hessians(total, locs, [is_full(b) for b in blocks])
        else:
            value, grads = jax.value_and_grad(total)(locs)
            hessians = [
                block_hessian(conditional(total, locs, i), locs[i], is_full(block), separable)
                for i, block in enumerate(blocks)
            ]
        nat_grads = [natural_gradient(b, g, h) for b, g, h in zip(blocks, grads, hessians)]
        if second_order:
            value = value + sum(curvature_term(b, n) for b, n in zip(blocks, nat_grads))
        return value, jax.tree.unflatten(treedef, nat_grads)

    return GaussianEstimator(estimate=estimate, method="delta")
