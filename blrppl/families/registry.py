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
a family's ``prior_types``          that family (Gamma and Exponential: Gamma,
                                    MultivariateNormal, InverseGamma, Beta,
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

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import constraints

from blrppl._types import ArrayTree
from blrppl.errors import ModelError
from blrppl.families import _util
from blrppl.families.base import ExpFamily
from blrppl.families.bernoulli import BERNOULLI
from blrppl.families.beta import BETA
from blrppl.families.categorical import CATEGORICAL
from blrppl.families.chain_categorical import CHAIN_CATEGORICAL as _CHAIN_CATEGORICAL
from blrppl.families.chain_categorical import ChainCategoricalStats
from blrppl.families.chain_gaussian import (
    CHAIN_GAUSSIAN as _CHAIN_GAUSSIAN,
    CHAIN_GAUSSIAN_PARALLEL as _CHAIN_GAUSSIAN_PARALLEL,
    SCALAR_CHAIN_GAUSSIAN as _SCALAR_CHAIN_GAUSSIAN,
    SCALAR_CHAIN_GAUSSIAN_PARALLEL as _SCALAR_CHAIN_GAUSSIAN_PARALLEL,
)
from blrppl.families.dirichlet import DIRICHLET
from blrppl.families.gamma import GAMMA
from blrppl.families.inverse_gamma import INVERSE_GAMMA
from blrppl.families.layout import Layout, elementwise_layout, symmetrize
from blrppl.families.mvn import MULTIVARIATE_NORMAL, MVNStats
from blrppl.families.normal import DIAGONAL_NORMAL, NORMAL, NormalStats
from blrppl.families.wishart import WISHART


# -- chain layouts (kept here until the chain modules carry their own records) --


def _chain_to_value(q: Any, mean: Any) -> dict:
    return dict(mean._asdict())


def _chain_from_value(q: Any, grads: dict) -> Any:
    xx = grads["xx"] if jnp.ndim(grads["xx"]) == 1 else symmetrize(grads["xx"])
    return q.family.stats_type(x=grads["x"], xx=xx, x_next=grads["x_next"])


def _chain_example(q: Any) -> Any:
    length, state = q.shape[0], q.shape[1:]
    if not state:
        return q.family.stats_type(x=jnp.zeros((length,)), xx=jnp.full((length,), -0.5), x_next=jnp.zeros((length - 1,)))
    d = state[0]
    return q.family.stats_type(
        x=jnp.zeros((length, d)),
        xx=-0.5 * jnp.broadcast_to(jnp.eye(d), (length, d, d)),
        x_next=jnp.zeros((length - 1, d, d)),
    )


def _chain_marginals(q: Any, mean: Any) -> Any:
    """A chain Gaussian's per-time marginals as independent Gaussian blocks."""
    if jnp.ndim(mean.xx) == jnp.ndim(mean.x):
        return NormalStats(x=mean.x, x_sq=mean.xx)
    return MVNStats(x=mean.x, xxT=mean.xx)


def _chain_from_marginals(q: Any, mean: Any, grad: Any) -> Any:
    """Per-time site parameters back in the chain's layout (no lag-one part)."""
    xx = grad.x_sq if isinstance(grad, NormalStats) else grad.xxT
    return type(mean)(x=grad.x, xx=xx, x_next=jnp.zeros_like(mean.x_next))


_CHAIN_LAYOUT = Layout(_chain_to_value, _chain_from_value, _chain_example, _chain_marginals, _chain_from_marginals)


def _chain_gaussian(family: ExpFamily, prior_types: tuple = ()) -> ExpFamily:
    return family._replace(
        kind="chain_gaussian",
        layout=_CHAIN_LAYOUT,
        reparameterised=True,
        gaussian=True,
        prior_types=prior_types,
        random_restart=False,
        chain=True,
    )


def _chain_categorical_example(q: Any) -> ChainCategoricalStats:
    length, k = q.shape[0], q.num_categories
    return ChainCategoricalStats(one_hot=jnp.zeros((length, k)), pair=jnp.zeros((length - 1, k, k)))


def _chain_categorical_start(natural: ChainCategoricalStats, value: Any) -> ChainCategoricalStats:
    num = natural.one_hot.shape[-1]
    probs = 0.9 * jax.nn.one_hot(jnp.asarray(value).astype(jnp.int32), num) + 0.1 / num
    return natural._replace(one_hot=jnp.log(probs), pair=jnp.zeros_like(natural.pair))


CHAIN_GAUSSIAN = _chain_gaussian(_CHAIN_GAUSSIAN, (dist.GaussianRandomWalk, dist.GaussianStateSpace))
CHAIN_GAUSSIAN_PARALLEL = _chain_gaussian(_CHAIN_GAUSSIAN_PARALLEL)
SCALAR_CHAIN_GAUSSIAN = _chain_gaussian(_SCALAR_CHAIN_GAUSSIAN)
SCALAR_CHAIN_GAUSSIAN_PARALLEL = _chain_gaussian(_SCALAR_CHAIN_GAUSSIAN_PARALLEL)
CHAIN_CATEGORICAL = _CHAIN_CATEGORICAL._replace(
    kind="chain_categorical",
    layout=Layout(_chain_to_value, elementwise_layout().from_value, _chain_categorical_example),
    start_at=_chain_categorical_start,
    random_restart=False,
    index_valued=True,
    chain=True,
)

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

#: Family names users choose for Gaussian q on any continuous support.
GAUSSIAN_NAMES = ("Normal", "MultivariateNormal", "DiagonalNormal")

#: A chain family name -> the family used when the chain's states are scalars.
SCALAR_STATE = {
    "ChainGaussian": "ScalarChainGaussian",
    "ChainGaussianParallel": "ScalarChainGaussianParallel",
}

#: Family names users may pass in ``families={site: name}``.
USER_NAMES = (*GAUSSIAN_NAMES, "Gamma", "InverseGamma", "Beta", "Dirichlet", "Wishart",
              "Categorical", "Bernoulli", "ChainGaussian", "ChainGaussianParallel", "ChainCategorical")


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
    base = _util.unwrap(d)
    if isinstance(base, dist.Normal):
        return "MultivariateNormal" if d.event_shape else "Normal"
    for family in FAMILIES.values():
        if family.prior_types and isinstance(base, family.prior_types):
            return family.name
    if d.support.is_discrete and _is_finite_discrete(d.support):
        return "Categorical"
    return None


def family_for_distribution(d: dist.Distribution) -> Optional[str]:
    """:func:`default_family_name` for priors that are not chains or enumerated (None else)."""
    name = default_family_name(d)
    if name is None or get_family(name).chain:
        return None
    if name == "Categorical" and not isinstance(_util.unwrap(d), CATEGORICAL.prior_types):
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
