"""Which q each latent variable gets: its family (default or override) and layout.

The default family of a prior comes from the one registry
(:func:`blrppl.families.registry.default_family_name`); a prior without an
exponential-family q gets a Gaussian on the unconstrained space of its support
(``transform = biject_to(support)``). :func:`variable_q` lays the family out
over the variable's value (:class:`~blrppl.families.layout.VariableQ`):
mean-field over plates, a full-covariance Gaussian block over the other axes.

A discrete prior with infinite support (Poisson, Geometric, ...) has no q
family and raises :class:`~blrppl.errors.ModelError`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from blrppl.errors import ModelError, site_error
from blrppl.families import VariableQ
from blrppl.families.registry import (
    GAUSSIAN_NAMES,
    SCALAR_STATE,
    USER_NAMES,
    default_family_name,
    get_family,
)

GAUSSIAN_FAMILIES = GAUSSIAN_NAMES
CHAIN_FAMILIES = tuple(name for name in USER_NAMES if get_family(name).chain)
FAMILY_NAMES = USER_NAMES

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
    """The q family a latent site gets from its prior ``fn`` (module docstring).

    Raises:
        ModelError: for a discrete prior with infinite support.
    """
    if isinstance(base_distribution(fn), dist.DiscreteUniform):  # values low..high, q's categories 0..K-1
        raise site_error(
            name,
            "DiscreteUniform priors are not implemented (a Categorical q is over 0..K-1)",
            "write the site as low + numpyro.sample(name, dist.Categorical(probs=jnp.ones(K) / K)) "
            "with K = high - low + 1",
        )
    family = default_family_name(fn)
    if family is not None:
        return FamilyChoice(family, None)
    if fn.support.is_discrete:
        raise site_error(
            name,
            f"a latent discrete site with infinite support ({type(base_distribution(fn)).__name__}) "
            "has no q family",
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
    needed = get_family(family).fixed_support
    if needed is not None:
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


def variable_q(node: Any, plates: dict, family_override: Optional[str] = None) -> VariableQ:
    """Lay a variable's q family out over its value (:class:`VariableQ`).

    Args:
      node: a :class:`~blrppl.graph.nodes.VariableNode`.
      plates: the graph's plates (name -> Plate), to tell plate axes apart.
      family_override: a family name that replaces ``node.family``.

    Raises:
      ModelError: naming the site, for layouts that are not supported.
    """
    name = family_override or node.family
    family = get_family(name)
    if family.chain:
        return _chain_q(node, family)
    transform = node.transform
    shape = tuple(node.shape)
    if transform is not None:
        shape = tuple(transform.inverse_shape(shape))
    joint = bool(node.members)
    if name in GAUSSIAN_NAMES:
        batch_ndim = len(node.batch_shape)
        plate_axes = [
            batch_ndim + plates[p].dim for p in node.plates if p in plates and -plates[p].dim <= batch_ndim
        ]
        num_batch = (max(plate_axes) + 1) if plate_axes else 0
        if name == "DiagonalNormal":
            num_batch = len(shape)
        num_batch = min(num_batch, len(shape))
        family = get_family("Normal" if num_batch == len(shape) else "MultivariateNormal")
        return VariableQ(node.name, family, shape, num_batch, transform, joint=joint)
    if family.index_valued:
        return VariableQ(node.name, family, shape, len(shape), transform, num_categories(node))
    return VariableQ(node.name, family, shape, len(shape) - family.event_ndim, transform)


def _chain_q(node: Any, family: Any) -> VariableQ:
    """The q of a chain: independent sequences (batch axes), then time, then one state."""
    chain = node.chain
    if chain is not None:
        batch, state = tuple(chain.batch_shape), tuple(chain.state_shape)
    else:
        batch, state = (), tuple(node.shape[1:])
    shape = tuple(node.shape)
    length = shape[len(batch)]
    if family.index_valued:
        if state:
            raise ModelError(
                f"site {node.name!r}: a discrete chain with states of shape {state} is not supported; "
                "write one integer state per sequence and step (states of shape (N,) or (N, 1) per "
                "step for N sequences)."
            )
        if length < 2:
            raise ModelError(
                f"site {node.name!r}: a discrete chain of length {length} has no transitions; "
                "sample the state as an ordinary Categorical site."
            )
        return VariableQ(node.name, family, shape, len(batch), None, num_categories(node))
    if node.transform is not None or len(state) > 1:
        raise ModelError(
            f"site {node.name!r}: a chain with states of shape {state} on a transformed space is not "
            "supported; write each state as a vector (time first), on the real line, and declare "
            "independent sequences with numpyro.plate."
        )
    if not state:
        family = get_family(SCALAR_STATE[family.name])
    return VariableQ(node.name, family, shape, len(batch))


def num_categories(node: Any) -> int:
    """K of a finite discrete site: from its support, or its prior's probabilities."""
    upper = getattr(_base_constraint(node.support), "upper_bound", None)
    if upper is None:
        prior = node.prior
        while hasattr(prior, "base_dist"):
            prior = prior.base_dist
        probs = getattr(prior, "probs", None)
        if probs is None:
            probs = getattr(prior, "logits")
        return int(np.shape(probs)[-1])
    return int(np.max(np.asarray(upper))) + 1
