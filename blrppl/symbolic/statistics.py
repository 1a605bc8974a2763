"""What the symbolic layer knows about each q family: its kind and its statistics.

A variable's q is described to the symbolic layer by a :class:`VarInfo`: a
family *kind* (a string), the value's shape and the axes q factorises over.
Everything the symbolic layer decides by kind is read from this module,
which asks the family registry (each family declares its kind, statistics
and whether its values are indices):

- :func:`statistic_name`: which mean parameter (statistic) of a kind an
  elementwise function of the variable reads (``log(tau)`` of a Gamma is its
  ``log_x``, ``x ** -1`` of an InverseGamma its ``inv_x``, ...);
- :func:`is_index_kind`: whether the variable's values are indices,
  enumerated on use (``mu[z]``);
- :func:`point_statistic_name` and :func:`point_stats`: the statistics of a
  point estimate, where every function of the value is its own statistic.

How reads of one variable pair up within a term is decided per kind too; that
table is in :mod:`blrppl.symbolic.resolve`.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any, Iterable

import jax.numpy as jnp

from blrppl.families.registry import FAMILIES
from blrppl.families.registry import statistic_name as family_statistic_name
from blrppl.symbolic.terms import NonConjugate, VarAtom

GAUSSIAN = "gaussian"
POINT = "point"
CHAIN = "chain_gaussian"
CHAIN_CATEGORICAL = "chain_categorical"
TIED_CHAIN_CATEGORICAL = "tied_chain_categorical"
CATEGORICAL = "categorical"
BERNOULLI = "bernoulli"


@dataclasses.dataclass(frozen=True)
class VarInfo:
    """What the expectation needs to know about a variable's q.

    ``kind``: ``"gaussian"``, ``"gamma"``, ``"inverse_gamma"``, ``"beta"``,
    ``"dirichlet"``, ``"bernoulli"``, ``"categorical"``, ``"wishart"``,
    ``"chain_gaussian"``, ``"chain_categorical"``, ``"tied_chain_categorical"`` or ``"point"`` (a point
    estimate).
    ``num_batch``: the leading axes of the value over which q factorises; the
    remaining axes form one block (a full covariance for a Gaussian).
    """

    kind: str
    shape: tuple[int, ...]
    num_batch: int
    num_categories: int = 0


def statistic_name(kind: str, atom_kind: str, power: Any = 1) -> str | None:
    """The statistic of a ``kind`` q that an elementwise function of its value reads.

    Answered by the family registry (each family declares its statistics,
    :func:`blrppl.families.registry.statistic_name`), plus one rule of the
    value's support: for a Bernoulli, ``x ** p`` is ``x`` (x in {0, 1}).

    Args:
      kind: the q's family kind (:class:`VarInfo`).
      atom_kind: the function: ``"x"`` (the value raised to ``power``),
        ``"log"``, ``"log1m"`` (log(1 - x)), ``"logdet"`` or ``"one_hot"``
        (see :class:`~blrppl.symbolic.terms.VarAtom`).
      power: the power of the value (a number or ``Fraction``), for ``"x"``.

    Returns:
      The statistic's name in the value layout of
      :mod:`blrppl.symbolic.expectation` (e.g. ``"log_x"``), or None when the
      function is not a sufficient statistic of the family.
    """
    power = Fraction(power)
    if kind == BERNOULLI and atom_kind == "x" and power > 0 and power.denominator == 1:
        return "x"  # x ** p = x for x in {0, 1}.
    return family_statistic_name(kind, atom_kind, power)


def is_index_kind(kind: str) -> bool:
    """Whether a ``kind`` variable's values are indices, enumerated on use (``mu[z]``)."""
    return any(family.index_valued for family in FAMILIES.values() if family.kind == kind)


def point_statistic_name(atom: VarAtom) -> str:
    """The statistic of a point estimate that ``atom`` reads (every function is one).

    Raises:
      NonConjugate: for ``one_hot`` of a point estimate.
    """
    if atom.kind == "x":
        return "x" if atom.power == 1 else f"x**{atom.power}"
    if atom.kind in ("log", "log1m"):
        return f"{atom.kind}_x"
    if atom.kind == "logdet":
        return "log_det_x"
    raise NonConjugate(atom.var, f"{atom.kind}({atom.var!r}) of a point estimate")


def point_stats(value: Any, names: Iterable[str]) -> dict:
    """Statistics of a point estimate ``x``: ``x``, ``x**p``, ``log_x``, ``log1m_x``, ``log_det_x``."""
    out = {}
    for name in names:
        if name == "x":
            out[name] = value
        elif name.startswith("x**"):
            out[name] = value ** float(Fraction(name[3:]))
        elif name == "log_x":
            out[name] = jnp.log(value)
        elif name == "log1m_x":
            out[name] = jnp.log1p(-value)
        elif name == "log_det_x":
            out[name] = jnp.linalg.slogdet(value)[1]
    return out
