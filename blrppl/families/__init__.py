"""Exponential families for q: natural <-> mean <-> usual parameters, A, entropy, KL.

Each family is an :class:`ExpFamily` value (a NamedTuple of pure functions) over
one ``*Stats`` NamedTuple shared by λ, μ and T(x). Look families up by name with
:func:`get_family`; :data:`FAMILIES` lists them all.
"""

from blrppl.families.base import ExpFamily, checked_moments, entropy, family_inner, kl_divergence, mean_and_log_normalizer
from blrppl.families.bernoulli import BERNOULLI, BernoulliStats
from blrppl.families.beta import BETA, BetaStats
from blrppl.families.categorical import CATEGORICAL, CategoricalStats
from blrppl.families.chain_categorical import ChainCategoricalStats
from blrppl.families.chain_gaussian import ChainGaussianStats
from blrppl.families.dirichlet import DIRICHLET, DirichletStats
from blrppl.families.gamma import GAMMA, GammaStats
from blrppl.families.inverse_gamma import INVERSE_GAMMA, InverseGammaStats
from blrppl.families.mvn import MULTIVARIATE_NORMAL, MVNStats
from blrppl.families.normal import DIAGONAL_NORMAL, NORMAL, NormalStats
from blrppl.families.point_mass import PointMass
from blrppl.families.tied_chain_categorical import TIED_CHAIN_CATEGORICAL, TiedChainStats
from blrppl.families.layout import Layout, VariableQ
from blrppl.families.registry import (
    CHAIN_CATEGORICAL,
    CHAIN_GAUSSIAN,
    CHAIN_GAUSSIAN_PARALLEL,
    FAMILIES,
    SCALAR_CHAIN_GAUSSIAN,
    SCALAR_CHAIN_GAUSSIAN_PARALLEL,
    default_family_name,
    family_for_distribution,
    get_family,
    prior_natural,
    statistic_name,
)
from blrppl.families.wishart import WISHART, WishartStats

__all__ = [
    "BERNOULLI",
    "BETA",
    "CATEGORICAL",
    "CHAIN_CATEGORICAL",
    "CHAIN_GAUSSIAN",
    "CHAIN_GAUSSIAN_PARALLEL",
    "SCALAR_CHAIN_GAUSSIAN",
    "SCALAR_CHAIN_GAUSSIAN_PARALLEL",
    "TIED_CHAIN_CATEGORICAL",
    "DIAGONAL_NORMAL",
    "DIRICHLET",
    "FAMILIES",
    "GAMMA",
    "INVERSE_GAMMA",
    "MULTIVARIATE_NORMAL",
    "NORMAL",
    "WISHART",
    "BernoulliStats",
    "BetaStats",
    "CategoricalStats",
    "ChainCategoricalStats",
    "ChainGaussianStats",
    "DirichletStats",
    "ExpFamily",
    "GammaStats",
    "InverseGammaStats",
    "Layout",
    "MVNStats",
    "NormalStats",
    "PointMass",
    "TiedChainStats",
    "VariableQ",
    "WishartStats",
    "default_family_name",
    "statistic_name",
    "checked_moments",
    "entropy",
    "mean_and_log_normalizer",
    "family_for_distribution",
    "family_inner",
    "get_family",
    "kl_divergence",
    "prior_natural",
]
