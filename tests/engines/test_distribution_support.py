"""Distributions that appear in many NumPyro models: each either fits or raises
``ModelError`` naming the site and the remedy (issue 14). Planning only: it
decides how every factor gets its site parameters, without compiling a fit.
(``LKJ`` plans like ``LKJCholesky``, and a ``TransformedDistribution``
likelihood like any other non-conjugate one: left out to keep the suite fast.)"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.distributions import transforms as T

import blrppl

Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, size=20))
Y3 = jnp.asarray(np.random.default_rng(1).normal(size=(20, 3)))


def factor(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    numpyro.factor("f", jnp.sum(dist.Normal(mu, 1.0).log_prob(y)))


def lkj_cholesky(y):
    L = numpyro.sample("L", dist.LKJCholesky(3, 2.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(3), scale_tril=L), obs=y)


def improper_uniform(y):
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.real, (), ()))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def transformed_prior(y):
    s = numpyro.sample("s", dist.TransformedDistribution(dist.Normal(0.0, 1.0), T.ExpTransform()))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, s), obs=y)


def mixture_same_family(y):
    mu = numpyro.sample("mu", dist.Normal(jnp.array([-1.0, 1.0]), 3.0).to_event(1))
    with numpyro.plate("N", y.shape[0]):
        mixing = dist.Categorical(jnp.array([0.5, 0.5]))
        numpyro.sample("y", dist.MixtureSameFamily(mixing, dist.Normal(mu, 1.0)), obs=y)


#: model, data, and either {factor: method} of NonConjugateVI's plan or (site, words of the remedy).
CASES = {
    "numpyro.factor": (factor, Y, {"mu": "exact", "f": "exact"}),
    "LKJCholesky": (lkj_cholesky, Y3, {"L": "cubature", "y": "cubature"}),
    "ImproperUniform": (improper_uniform, Y, ("mu", "proper prior")),
    "TransformedDistribution prior": (transformed_prior, Y, {"s": "quadrature", "y": "quadrature"}),
    "MixtureSameFamily": (mixture_same_family, Y, {"mu": "exact", "y": "quadrature"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_distribution_fits_or_says_what_to_do(name):
    model, data, expected = CASES[name]
    engine = blrppl.NonConjugateVI(model)
    if isinstance(expected, tuple):
        site, remedy = expected
        with pytest.raises(blrppl.ModelError, match=f"site '{site}'.*{remedy}"):
            engine.plan(data)
    else:
        plan = engine.plan(data)
        assert {e.factor: e.method.label for e in plan.estimators} == expected
