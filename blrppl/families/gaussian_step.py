"""The Gaussian BLR step kept positive definite (Lin, Schmidt & Khan 2020).

A Gaussian q's natural parameters hold -Λ/2 in their second statistic; a BLR
step (Khan & Rue, Eq. 58) towards a target whose precision is indefinite (an
estimated site parameter of a non-concave factor) would leave the family.
:func:`positive_definite_step` is the improved BLR step that cannot; it is the
``safe_step`` of the Normal and MultivariateNormal families.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from blrppl._types import Array, ArrayLike
from blrppl.families import mvn as _mvn
from blrppl.families import normal as _normal
from blrppl.families.mvn import MVNStats
from blrppl.families.normal import NormalStats

GaussianStats = NormalStats | MVNStats


def is_full(stats: GaussianStats) -> bool:
    """Return True for ``MVNStats`` (full covariance), False for ``NormalStats``.

    Raises:
      TypeError: for any other layout.
    """
    if isinstance(stats, MVNStats):
        return True
    if isinstance(stats, NormalStats):
        return False
    raise TypeError(
        f"expected NormalStats or MVNStats parameters, got {type(stats).__name__}; "
        "only Gaussian q have a precision."
    )


def precision(natural: GaussianStats) -> Array:
    """Return the precision Λ of q from λ: -2 x_sq (Normal) or -(xxT + xxTᵀ) (MVN)."""
    if is_full(natural):
        return -(natural.xxT + jnp.swapaxes(natural.xxT, -1, -2))
    return -2.0 * natural.x_sq


def precision_is_positive_definite(natural: Any) -> Array:
    """Report whether a candidate λ is a valid Gaussian: Λ positive definite, λ finite.

    Nothing is clipped or repaired; use the answer to reject a step, shrink ρ,
    or switch to :func:`positive_definite_step`.

    Args:
      natural: λ as ``NormalStats``, ``MVNStats``, or a mapping (e.g. variable
        name -> λ) of them.

    Returns:
      A boolean array: for ``NormalStats`` elementwise (shape of ``x``), for
      ``MVNStats`` one per block (batch shape). For a mapping, a scalar: all
      blocks of all entries valid. Reduce with ``jnp.all`` for one verdict.
    """
    if isinstance(natural, Mapping):
        verdicts = [
            jnp.all(precision_is_positive_definite(v)) for v in natural.values()
        ]
        return jnp.all(jnp.stack(verdicts)) if verdicts else jnp.asarray(True)
    if is_full(natural):
        return _mvn.is_valid(natural)
    return _normal.is_valid(natural)


def positive_definite_step(
    natural: Any, target: Any, rho: ArrayLike, *, only_if_needed: bool = False
) -> Any:
    """Take the BLR step λ ← (1-ρ)λ + ρλ̂ keeping the precision positive definite.

    The improved BLR of Lin, Schmidt & Khan (2020, "Handling the
    positive-definite constraint in the Bayesian learning rule", ICML; their
    Gaussian case) adds a second-order term to the precision step. With
    S = Λ the current precision (from ``natural``), Ŝ the precision of the
    target λ̂ (``target``, usually λ₀ + Σ_f ĝ_f, possibly indefinite when the
    ĝ_f are estimates of non-concave factors), G = Ŝ - S, m = S⁻¹ λ₁::

        S_new = (1 - ρ) S + ρ Ŝ + (ρ² / 2) G S⁻¹ G
              = ½ S + ½ (S + ρG) S⁻¹ (S + ρG)             (positive definite)
        m_new = m + ρ S_new⁻¹ (λ̂₁ - Ŝ m)                  (Khan & Rue, Eq. 12)
        λ_new = (S_new m_new, -S_new / 2)

    Here λ̂₁ - Ŝ m = ∇_m E_q[log p̄] is the gradient of the expected log joint,
    so the mean step is Newton-like with the new precision. Without the ρ² term
    this is exactly the plain rule (Khan & Rue, Eq. 58): the improved step equals
    the plain one plus (c m, -c / 2) with c = (ρ²/2) G S⁻¹ G, a second-order
    difference. For a diagonal q the same formulas hold elementwise. S must be
    positive definite on entry (as it is for any valid q); Ŝ need not be.

    .. warning::
       ``xxT`` / ``x_sq`` hold -Λ/2, so S = -2 · (xxT coefficient); a target with
       an *indefinite* precision is one whose ``xxT`` is not negative definite.
       With ρ = 1 and a positive-definite target this step is *not* the plain
       (VMP) step, because the correction G S⁻¹ G / 2 remains; pass
       ``only_if_needed=True`` to take the plain step wherever it is valid.

    Args:
      natural: the current λ (``NormalStats``, ``MVNStats``, or a mapping of them).
      target: λ̂, same structure and shapes.
      rho: step size ρ in (0, 1], a scalar.
      only_if_needed: use the plain step (1-ρ)λ + ρλ̂ for every block (element
        for ``NormalStats``) where it is a valid Gaussian, and the improved step
        only elsewhere. Still no clipping: each block is one of the two rules.

    Returns:
      The new λ, same structure as ``natural``.

    Example:
        >>> lam = NormalStats(x=jnp.array(0.0), x_sq=jnp.array(-0.5))
        >>> bad = NormalStats(x=jnp.array(1.0), x_sq=jnp.array(0.5))  # precision -1
        >>> new = positive_definite_step(lam, bad, 0.5)
        >>> bool(precision_is_positive_definite(new))
        True
    """
    if isinstance(natural, Mapping):
        return {
            name: positive_definite_step(lam, target[name], rho, only_if_needed=only_if_needed)
            for name, lam in natural.items()
        }
    module = _mvn if is_full(natural) else _normal
    if only_if_needed:
        return module.safe_step(natural, target, rho)
    return module.improved_step(natural, target, rho)
