"""Family names, default q families of numpyro priors, and prior natural parameters."""

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from blrppl.errors import ModelError
from blrppl.families import (
    FAMILIES,
    GAMMA,
    MULTIVARIATE_NORMAL,
    NORMAL,
    ExpFamily,
    MVNStats,
    NormalStats,
    family_for_distribution,
    get_family,
    prior_natural,
)
from tests.compiles import cheap_jit

DEFAULT_FAMILY_CASES = [
    (dist.Normal(0.0, 1.0), "Normal"),
    (dist.Normal(jnp.zeros(3), 1.0), "Normal"),
    (dist.Normal(0.0, 1.0).expand([4]), "Normal"),
    (dist.Normal(jnp.zeros(3), 1.0).to_event(1), "MultivariateNormal"),
    (dist.Normal(jnp.zeros((2, 3)), 1.0).to_event(2), "MultivariateNormal"),  # one block over both axes
    (dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)), "MultivariateNormal"),
    (dist.Gamma(2.0, 1.0), "Gamma"),
    (dist.Exponential(1.0).expand([3]), "Gamma"),
    (dist.Chi2(3.0), "Gamma"),
    (dist.InverseGamma(2.0, 1.0), "InverseGamma"),
    (dist.Beta(2.0, 2.0).mask(False), "Beta"),
    (dist.Dirichlet(jnp.ones(3)), "Dirichlet"),
    (dist.Categorical(probs=jnp.ones(3) / 3), "Categorical"),
    (dist.Categorical(logits=jnp.zeros(3)), "Categorical"),
    (dist.Bernoulli(probs=0.3), "Bernoulli"),
    (dist.Bernoulli(logits=0.3), "Bernoulli"),
    (dist.Wishart(3.0, jnp.eye(2)), "Wishart"),
    (dist.HalfCauchy(1.0), None),
    (dist.LogNormal(0.0, 1.0), None),
    (dist.Uniform(0.0, 1.0), "Beta"),  # Beta(1, 1)
    (dist.Uniform(2.0, 5.0), None),
    (dist.StudentT(3.0), None),
]


@pytest.mark.parametrize(
    "d, expected", DEFAULT_FAMILY_CASES, ids=[repr(e) for _, e in DEFAULT_FAMILY_CASES]
)
def test_family_for_distribution(d, expected):
    assert family_for_distribution(d) == expected
    if expected is not None:  # The default family contains the prior.
        natural = prior_natural(expected, d)
        assert get_family(expected).is_valid(natural).all()


def test_families_are_named_by_their_key():
    assert set(FAMILIES) == {
        "Normal",
        "DiagonalNormal",
        "MultivariateNormal",
        "Gamma",
        "InverseGamma",
        "Beta",
        "Dirichlet",
        "Categorical",
        "Bernoulli",
        "Wishart",
        "ChainGaussian",
        "ChainGaussianParallel",
        "ScalarChainGaussian",
        "ScalarChainGaussianParallel",
        "ChainCategorical",
        "TiedChainCategorical",
    }
    for name, family in FAMILIES.items():
        assert isinstance(family, ExpFamily)
        assert family.name == name
        assert get_family(name) is family


def test_unknown_family_raises_model_error_listing_names():
    with pytest.raises(ModelError, match="unknown q family 'Gaussian'") as info:
        get_family("Gaussian")
    for name in FAMILIES:
        assert name in str(info.value)


def test_prior_outside_the_family_raises_model_error():
    with pytest.raises(ModelError, match="HalfCauchy distribution is not in the Gamma"):
        prior_natural("Gamma", dist.HalfCauchy(1.0))
    with pytest.raises(ModelError, match="Normal"):
        prior_natural("Normal", dist.Gamma(1.0, 1.0).expand([2]))


def test_prior_natural_looks_through_wrappers_and_broadcasts():
    d = dist.Normal(jnp.array([0.0, 1.0, 2.0]), 2.0).expand([2, 3]).mask(True)
    natural = prior_natural("Normal", d)
    assert isinstance(natural, NormalStats)
    np.testing.assert_allclose(natural.x, jnp.broadcast_to(jnp.arange(3.0) / 4, (2, 3)))
    np.testing.assert_allclose(natural.x_sq, jnp.full((2, 3), -0.125))
    assert prior_natural("DiagonalNormal", d.to_event(1)).x.shape == (2, 3)


def test_normal_to_event_prior_in_the_multivariate_family_is_diagonal():
    d = dist.Normal(jnp.array([0.0, 1.0, 2.0]), jnp.array([1.0, 2.0, 4.0])).to_event(1)
    natural = prior_natural("MultivariateNormal", d.expand([5]))
    assert isinstance(natural, MVNStats)
    assert natural.x.shape == (5, 3) and natural.xxT.shape == (5, 3, 3)
    precision = -2.0 * natural.xxT[0]
    np.testing.assert_allclose(precision, jnp.diag(jnp.array([1.0, 0.25, 0.0625])))

    @cheap_jit
    def log_probs(natural):
        q = MULTIVARIATE_NORMAL.to_numpyro(natural)
        return q.log_prob(jnp.ones(3)), d.log_prob(jnp.ones(3))

    ours, expected = log_probs(natural)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)


def test_exponential_prior_is_gamma_with_unit_shape():
    natural = prior_natural("Gamma", dist.Exponential(jnp.array([0.5, 2.0])))
    np.testing.assert_allclose(GAMMA.to_usual(natural)["concentration"], 1.0)
    np.testing.assert_allclose(GAMMA.to_usual(natural)["rate"], [0.5, 2.0])


def test_from_usual_canonicalises_python_scalars_to_float():
    natural = NORMAL.from_usual(0, 1)
    assert natural.x.dtype == jnp.result_type(float)
    assert GAMMA.from_usual(2, 3).x.dtype == jnp.result_type(float)
