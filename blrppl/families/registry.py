"""The one registry of q families: names, defaults for numpyro priors, statistics.

Every family is an :class:`~blrppl.families.base.ExpFamily` record that
carries what the rest of blrppl needs (its symbolic kind and statistics, its
value layout, whether it is reparameterisable, which priors it is the default
q of, how it starts and restarts, its safe step). Adding a family is one new
module defining its record plus one line in :data:`FAMILIES`; nothing else in
blrppl switches on family names.

Defaults (``default_family_name``), in this order:

==================================  =============================================
prior                               q family
==================================  =============================================
Normal                              ``"Normal"`` (scalar events),
                                    ``"MultivariateNormal"`` (``.to_event``)
a family's ``prior_types``          that family (Gamma, Exponential and Chi2: Gamma,
                                    MultivariateNormal, InverseGamma, Beta and
                                    Uniform(0, 1): Beta,
                                    Dirichlet, Categorical, Bernoulli, Wishart,
                                    GaussianRandomWalk and GaussianStateSpace:
                                    ChainGaussian)
any other finite discrete prior     ``"Categorical"`` over its support
anything else                       None: a Gaussian on the unconstrained space
==================================  =============================================
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Optional

import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import ArrayTree
from blrppl.errors import ModelError
from blrppl.families import common
from blrppl.families.base import ExpFamily
from blrppl.families.bernoulli import BERNOULLI
from blrppl.families.beta import BETA
from blrppl.families.categorical import CATEGORICAL
from blrppl.families.chain_categorical import CHAIN_CATEGORICAL
from blrppl.families.chain_gaussian import (
    CHAIN_GAUSSIAN,
    CHAIN_GAUSSIAN_PARALLEL,
    SCALAR_CHAIN_GAUSSIAN,
    SCALAR_CHAIN_GAUSSIAN_PARALLEL,
)
from blrppl.families.dirichlet import DIRICHLET
from blrppl.families.gamma import GAMMA
from blrppl.families.inverse_gamma import INVERSE_GAMMA
from blrppl.families.mvn import MULTIVARIATE_NORMAL
from blrppl.families.normal import DIAGONAL_NORMAL, NORMAL
from blrppl.families.tied_chain_categorical import TIED_CHAIN_CATEGORICAL
from blrppl.families.wishart import WISHART

FAMILIES: dict[str, ExpFamily] = {
    family.name: family
    for family in (
        NORMAL,
        DIAGONAL_NORMAL,
        MULTIVARIATE_NORMAL,
        GAMMA,
        INVERSE_GAMMA,
        BETA,
        DIRICHLET,
        CATEGORICAL,
        BERNOULLI,
        WISHART,
        CHAIN_GAUSSIAN,
        CHAIN_GAUSSIAN_PARALLEL,
        SCALAR_CHAIN_GAUSSIAN,
        SCALAR_CHAIN_GAUSSIAN_PARALLEL,
        CHAIN_CATEGORICAL,
        TIED_CHAIN_CATEGORICAL,
    )
}
"""Every exponential family for q, by the name used in ``families={site: name}``."""

#: Family names users choose for Gaussian q on any continuous support.
GAUSSIAN_NAMES = ("Normal", "MultivariateNormal", "DiagonalNormal")

#: A chain family name -> the family used when the chain's states are scalars.
SCALAR_STATE = {
    "ChainGaussian": "ScalarChainGaussian",
    "ChainGaussianParallel": "ScalarChainGaussianParallel",
}

#: Family names users may pass in ``families={site: name}`` (the scalar-state
#: chains are chosen from the state's shape, not by name).
USER_NAMES = tuple(name for name in FAMILIES if name not in SCALAR_STATE.values())


def get_family(name: str) -> ExpFamily:
    """Return the family called ``name``.

    Raises:
        ModelError: for an unknown name; the message lists the known ones.

    Example:
        >>> get_family("Gamma").name
        'Gamma'
    """
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(FAMILIES))
        raise ModelError(f"unknown q family {name!r}; use one of {known}.") from None


def _is_finite_discrete(support: Any) -> bool:
    while isinstance(support, constraints._IndependentConstraint):
        support = support.base_constraint
    return isinstance(support, (constraints._Boolean, constraints._IntegerInterval))


def default_family_name(d: dist.Distribution) -> Optional[str]:
    """The default q family name of a numpyro prior ``d`` (module table), or None.

    Wrappers (``expand``, ``to_event``, ``mask``) are looked through. None
    means a Gaussian on the unconstrained space of the support (or, for a
    discrete prior with infinite support, no q at all: the caller says so).

    Example:
        >>> default_family_name(dist.Exponential(1.0))
        'Gamma'
        >>> default_family_name(dist.HalfCauchy(1.0)) is None
        True
    """
    base = common.unwrap(d)
    if isinstance(base, dist.Normal):
        return "MultivariateNormal" if d.event_shape else "Normal"
    for family in FAMILIES.values():
        if family.prior_types and isinstance(base, family.prior_types):
            if family.accepts is None or family.accepts(base):
                return family.name
    if d.support.is_discrete and _is_finite_discrete(d.support):
        return "Categorical"
    return None


def family_for_distribution(d: dist.Distribution) -> Optional[str]:
    """:func:`default_family_name` for priors that are not chains or enumerated (None else)."""
    name = default_family_name(d)
    if name is None or get_family(name).chain:
        return None
    if name == "Categorical" and not isinstance(common.unwrap(d), CATEGORICAL.prior_types):
        return None
    return name


def statistic_name(kind: str, atom_kind: str, power: Any) -> Optional[str]:
    """The statistic field that the monomial ``atom_kind ** power`` of a value is, if any.

    ``kind`` is a family's symbolic kind; ``atom_kind`` one of the symbolic
    atoms (``"x"``, ``"log"``, ``"log1m"``, ``"logdet"``, ``"one_hot"``).

    Example:
        >>> statistic_name("inverse_gamma", "x", -1)
        'inv_x'
    """
    if power is None:
        return None
    power = Fraction(power)
    for family in FAMILIES.values():
        if family.kind == kind:
            for (atom, p), field in family.statistics:
                if atom == atom_kind and Fraction(p) == power:
                    return field
            return None
    return None


def prior_natural(family_name: str, d: dist.Distribution) -> ArrayTree:
    """Return λ₀, the natural parameters of the prior ``d`` in family ``family_name``.

    Raises:
        ModelError: if the name is unknown or ``d`` is not in that family.

    Example:
        >>> natural = prior_natural("Normal", dist.Normal(0.0, 1.0).expand([2]))
        >>> natural.x_sq.tolist()
        [-0.5, -0.5]
    """
    return get_family(family_name).from_numpyro(d)
