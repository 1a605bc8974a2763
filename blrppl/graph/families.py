"""Which q family each latent site gets: the default from its prior, and overrides.

Family names are plain strings (the ``families={site: name}`` vocabulary):

==================  ==========================================================
prior               q family
==================  ==========================================================
Normal              ``"Normal"`` (scalar events), ``"MultivariateNormal"``
                    (``.to_event``)
MultivariateNormal  ``"MultivariateNormal"`` (also ``LowRankMultivariateNormal``)
Gamma, Exponential  ``"Gamma"``
InverseGamma        ``"InverseGamma"``
Beta                ``"Beta"``
Dirichlet           ``"Dirichlet"``
Categorical         ``"Categorical"`` (and any other finite discrete prior,
                    over its enumerated support)
Bernoulli           ``"Bernoulli"``
Wishart             ``"Wishart"``
GaussianRandomWalk, ``"ChainGaussian"`` (also Gaussian chains written with
GaussianStateSpace  ``scan``; discrete ones get ``"ChainCategorical"``);
                    ``families={site: "ChainGaussianParallel"}`` selects the
                    parallel-in-time (associative scan) smoother
anything else       ``"Normal"`` / ``"MultivariateNormal"`` on the
                    unconstrained space, with ``transform = biject_to(support)``
==================  ==========================================================

A discrete prior with infinite support (Poisson, Geometric, ...) has no q
family and raises :class:`~blrppl.errors.ModelError`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from blrppl.errors import site_error

GAUSSIAN_FAMILIES = ("Normal", "MultivariateNormal", "DiagonalNormal")
# "ChainGaussianParallel" is the chain Gaussian whose smoother runs as an
# associative scan (Sarkka & Garcia-Fernandez 2021): same q, O(log T) depth.
CHAIN_FAMILIES = ("ChainGaussian", "ChainGaussianParallel", "ChainCategorical")

# Families whose values live in one fixed support; an override to one of these
# must match the site's support exactly.
_FIXED_SUPPORT = {
    "Gamma": constraints.positive,
    "InverseGamma": constraints.positive,
    "Beta": constraints.unit_interval,
    "Dirichlet": constraints.simplex,
    "Wishart": constraints.positive_definite,
}

FAMILY_NAMES = (
    *GAUSSIAN_FAMILIES,
    *_FIXED_SUPPORT,
    "Categorical",
    "Bernoulli",
    *CHAIN_FAMILIES,
)

# Order matters: subclasses (Chi2 of Gamma) are caught by their parents.
_DEFAULTS: tuple[tuple[type, str], ...] = (
    (dist.GaussianRandomWalk, "ChainGaussian"),
    (dist.GaussianStateSpace, "ChainGaussian"),
    (dist.MultivariateNormal, "MultivariateNormal"),
    (dist.LowRankMultivariateNormal, "MultivariateNormal"),
    (dist.Gamma, "Gamma"),
    (dist.Exponential, "Gamma"),
    (dist.InverseGamma, "InverseGamma"),
    (dist.Beta, "Beta"),
    (dist.Dirichlet, "Dirichlet"),
    (dist.CategoricalProbs, "Categorical"),
    (dist.CategoricalLogits, "Categorical"),
    (dist.BernoulliProbs, "Bernoulli"),
    (dist.BernoulliLogits, "Bernoulli"),
    (dist.Wishart, "Wishart"),
)

_WRAPPERS = (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)


class FamilyChoice(NamedTuple):
    """A site's q family and, for a Gaussian on an unconstrained space, its transform."""

    family: str
    transform: Any  # numpyro Transform from the unconstrained space, or None


def base_distribution(fn: dist.Distribution) -> dist.Distribution:
    """``fn`` without ``Independent`` / ``Expanded`` / ``Masked`` wrappers."""
    while isinstance(fn, _WRAPPERS):
        fn = fn.base_dist
    return fn


def _base_constraint(c: Any) -> Any:
    while isinstance(c, constraints._IndependentConstraint):
        c = c.base_constraint
    return c


def is_real(support: Any) -> bool:
    """Whether ``support`` is the real line (or a product of real lines)."""
    return isinstance(_base_constraint(support), constraints._Real)


def is_finite_discrete(support: Any) -> bool:
    """Whether ``support`` is a finite set of integers (boolean or an integer interval)."""
    base = _base_constraint(support)
    return isinstance(base, (constraints._Boolean, constraints._IntegerInterval))


def same_support(a: Any, b: Any) -> bool:
    """Whether two numpyro constraints describe the same set (event dims ignored)."""
    a, b = _base_constraint(a), _base_constraint(b)
    # UnitInterval is an Interval(0, 1), Positive a GreaterThan(0): compare bounds.
    if not (isinstance(a, type(b)) or isinstance(b, type(a))):
        return False
    for attr in ("lower_bound", "upper_bound"):
        if hasattr(a, attr) or hasattr(b, attr):
            x, y = getattr(a, attr, None), getattr(b, attr, None)
            try:
                if not np.array_equal(np.asarray(x), np.asarray(y)):
                    return False
            except TypeError:  # abstract bounds: compare by identity
                if x is not y:
                    return False
    return True


def _gaussian(fn: dist.Distribution, family: Optional[str] = None) -> FamilyChoice:
    if family is None:
        family = "MultivariateNormal" if fn.event_shape else "Normal"
    transform = None if is_real(fn.support) else biject_to(fn.support)
    return FamilyChoice(family, transform)


def default_family(name: str, fn: dist.Distribution) -> FamilyChoice:
    """The q family a latent site gets from its prior ``fn`` (see the module table).

    Raises:
        ModelError: for a discrete prior with infinite support.
    """
    base = base_distribution(fn)
    if isinstance(base, dist.Normal):
        return FamilyChoice("MultivariateNormal" if fn.event_shape else "Normal", None)
    for cls, family in _DEFAULTS:
        if isinstance(base, cls):
            return FamilyChoice(family, None)
    if fn.support.is_discrete:
        if is_finite_discrete(fn.support):
            return FamilyChoice("Categorical", None)
        raise site_error(
            name,
            f"a latent discrete site with infinite support ({type(base).__name__}) has no q family",
            "observe it, marginalise it out, or replace it by a finite discrete prior "
            "(e.g. dist.Categorical over a truncated support)",
        )
    return _gaussian(fn)


def override_family(
    name: str, fn: dist.Distribution, family: str, *, chain: bool = False
) -> FamilyChoice:
    """Validate a user's ``families={name: family}`` override for a site with prior ``fn``.

    Gaussian families ("Normal", "MultivariateNormal", "DiagonalNormal") fit any
    continuous support (on the unconstrained space when it is not the real
    line); the others only a site whose support equals theirs; chain families
    only chain sites.

    Raises:
        ModelError: for an unknown family or one that does not fit the site.
    """
    support = fn.support
    if family not in FAMILY_NAMES:
        raise site_error(
            name,
            f"unknown q family {family!r}",
            f"use one of {', '.join(repr(f) for f in FAMILY_NAMES)}",
        )
    if family in GAUSSIAN_FAMILIES:
        if support.is_discrete:
            raise site_error(
                name,
                f"family {family!r} needs a continuous site but the prior's support is {support}",
                "use 'Categorical' or 'Bernoulli' for a finite discrete site",
            )
        return _gaussian(fn, family)
    if family in CHAIN_FAMILIES:
        gaussian = family.startswith("ChainGaussian")
        fits = chain and (is_real(support) if gaussian else is_finite_discrete(support))
        if not fits:
            raise site_error(
                name,
                f"family {family!r} needs a {'real' if gaussian else 'discrete'} "
                f"latent chain, and this site is not one (support {support})",
                "use it only on GaussianRandomWalk, GaussianStateSpace or scan chains",
            )
        return FamilyChoice(family, None)
    if family in _FIXED_SUPPORT:
        needed = _FIXED_SUPPORT[family]
        if not same_support(needed, support):
            raise site_error(
                name,
                f"family {family!r} has support {needed} but the prior's support is {support}",
                "choose a family with the site's support, or 'Normal' (unconstrained Gaussian)",
            )
        return FamilyChoice(family, None)
    base = _base_constraint(support)
    fits = is_finite_discrete(support) and (
        isinstance(base, constraints._Boolean) or np.all(np.asarray(base.lower_bound) == 0)
    )
    if family == "Bernoulli":
        fits = fits and (
            isinstance(base, constraints._Boolean) or np.all(np.asarray(base.upper_bound) == 1)
        )
    if not fits:
        raise site_error(
            name,
            f"family {family!r} needs a finite discrete support starting at 0 "
            f"but the prior's support is {support}",
            "choose a family with the site's support",
        )
    return FamilyChoice(family, None)
