"""Family names, the default q family of a numpyro prior, and its natural parameters."""

from __future__ import annotations

import numpyro.distributions as dist

from blrppl._types import ArrayTree
from blrppl.errors import ModelError
from blrppl.families import _util
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
    )
}
"""Every exponential family for q, by the name used in ``families={site: name}``."""

# Prior distribution types whose own family is the default q (checked in order).
_DEFAULT_FAMILY = (
    (dist.MultivariateNormal, "MultivariateNormal"),
    ((dist.Gamma, dist.Exponential), "Gamma"),
    (dist.InverseGamma, "InverseGamma"),
    (dist.Beta, "Beta"),
    (dist.Dirichlet, "Dirichlet"),
    ((dist.CategoricalProbs, dist.CategoricalLogits), "Categorical"),
    ((dist.BernoulliProbs, dist.BernoulliLogits), "Bernoulli"),
    (dist.Wishart, "Wishart"),
)


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


def family_for_distribution(d: dist.Distribution) -> str | None:
    """Return the default q family name for a numpyro prior ``d``, or None.

    Wrappers (``expand``, ``to_event``, ``mask``) are looked through. A ``Normal``
    with scalar values gets ``"Normal"``; a ``Normal`` with one event dimension
    (``Normal(...).to_event(1)``) gets a full-covariance ``"MultivariateNormal"``
    over its event. ``Exponential`` gets ``"Gamma"``. Anything else, including a
    ``Normal`` with two or more event dimensions, returns None: the caller then
    uses a Gaussian on the unconstrained space of the support.

    Example:
        >>> family_for_distribution(dist.Exponential(1.0))
        'Gamma'
        >>> family_for_distribution(dist.HalfCauchy(1.0)) is None
        True
    """
    base = _util.unwrap(d)
    if isinstance(base, dist.Normal):
        event_ndim = len(d.event_shape)
        return {0: "Normal", 1: "MultivariateNormal"}.get(event_ndim)
    for types, name in _DEFAULT_FAMILY:
        if isinstance(base, types):
            return name
    return None


def prior_natural(family_name: str, d: dist.Distribution) -> ArrayTree:
    """Return λ₀, the natural parameters of the prior ``d`` in family ``family_name``.

    The result is broadcast to the family's batch shape (the prior's
    ``batch_shape + event_shape`` less the family's event dimensions) plus each
    statistic's event shape. A mask, if any, is ignored (masking is the caller's).

    Raises:
        ModelError: if the name is unknown or ``d`` is not in that family.

    Example:
        >>> natural = prior_natural("Normal", dist.Normal(0.0, 1.0).expand([2]))
        >>> natural.x_sq.tolist()
        [-0.5, -0.5]
    """
    return get_family(family_name).from_numpyro(d)
