"""Site kinds: masks, params, factors, handlers, reparameterisation, wrappers, families."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.contrib.control_flow import scan
from numpyro.infer.reparam import LocScaleReparam
from numpyro.ops.indexing import Vindex

import blrppl
from blrppl.graph import build_graph


def test_obs_mask_splits_into_observed_latent_and_deterministic():
    mask = jnp.array([True, False, True, False])
    y = jnp.array([1.0, jnp.nan, 2.0, jnp.inf])  # non-finite only where missing

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 4):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, obs_mask=mask)

    fg = blrppl.trace(model, y)
    missing = fg.variables["y_unobserved"]
    assert missing.family == "Normal" and missing.shape == (4,)
    np.testing.assert_array_equal(missing.observed_mask, mask)
    assert fg.variables["mu"].observed_mask is None
    observed = fg.factors["y_observed"]
    assert observed.kind == "likelihood" and observed.neighbours == ("mu",)
    np.testing.assert_array_equal(observed.mask, mask)
    prior = fg.factors["y_unobserved"]
    assert prior.kind == "prior" and prior.neighbours == ("y_unobserved", "mu")
    np.testing.assert_array_equal(prior.mask, ~mask)
    assert fg.deterministics["y"].neighbours == ("y_unobserved",)


def test_masked_distribution_and_scale():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with handlers.scale(scale=0.25):
            numpyro.sample(
                "y", dist.Normal(mu, 1.0).expand([3]).mask(jnp.array([True, False, True])), obs=y
            )

    fg = blrppl.trace(model, jnp.array([0.0, jnp.nan, 1.0]))
    assert fg.factors["y"].scale == 0.25
    np.testing.assert_array_equal(fg.factors["y"].mask, [True, False, True])


def test_params_factor_terms_and_deterministics():
    def model(y):
        loc = numpyro.param("loc", jnp.zeros(2))
        scale = numpyro.param("scale", 1.0, constraint=dist.constraints.positive)
        z = numpyro.sample("z", dist.Normal(loc, 1.0).to_event(1))
        numpyro.deterministic("total", z.sum())
        numpyro.factor("penalty", -jnp.sum(z**2))
        numpyro.sample("y", dist.Normal(z[0], scale), obs=y)

    fg = blrppl.trace(model, 0.5)
    assert set(fg.params) == {"loc", "scale"}
    assert fg.params["scale"].constraint == dist.constraints.positive
    assert fg.params["loc"].shape == (2,)
    assert fg.factors["z"].neighbours == ("z",) and fg.factors["z"].param_neighbours == ("loc",)
    assert fg.factors["y"].param_neighbours == ("scale",)
    penalty = fg.factors["penalty"]
    assert (penalty.kind, penalty.neighbours, penalty.observed) == ("factor", ("z",), False)
    assert fg.deterministics["total"].neighbours == ("z",)
    assert "loc" not in fg.variables


def test_blocked_sites_are_invisible():
    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with handlers.block():
            numpyro.sample("hidden", dist.Normal(mu, 1.0))

    fg = blrppl.trace(model)
    assert set(fg.variables) == {"mu"} and set(fg.factors) == {"mu"}


def test_loc_scale_reparam():
    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        with numpyro.plate("J", 8), handlers.reparam(config={"theta": LocScaleReparam(0)}):
            numpyro.sample("theta", dist.Normal(mu, 2.0))

    fg = blrppl.trace(model)
    assert set(fg.variables) == {"mu", "theta_decentered"}
    assert fg.deterministics["theta"].neighbours == ("mu", "theta_decentered")
    assert fg.deterministics["theta"].plates == ("J",)


def test_condition_and_substitute_wrappers():
    def model():
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(a, 1.0))
        numpyro.sample("c", dist.Normal(b, 1.0))

    fg = blrppl.trace(handlers.substitute(handlers.condition(model, {"c": 1.0}), {"a": 0.5}))
    assert set(fg.variables) == {"b"}
    assert fg.factors["c"].kind == "likelihood" and fg.factors["c"].neighbours == ("b",)
    assert fg.factors["a"].observed and fg.factors["b"].neighbours == ("b",)


@pytest.mark.parametrize(
    "prior, family, transformed",
    [
        (dist.Normal(0.0, 1.0), "Normal", False),
        (dist.Normal(0.0, 1.0).expand([3]).to_event(1), "MultivariateNormal", False),
        (dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)), "MultivariateNormal", False),
        (dist.Gamma(2.0, 1.0).expand([3]), "Gamma", False),
        (dist.Exponential(1.0), "Gamma", False),
        (dist.InverseGamma(2.0, 1.0), "InverseGamma", False),
        (dist.Beta(2.0, 2.0), "Beta", False),
        (dist.Dirichlet(jnp.ones(3)), "Dirichlet", False),
        (dist.Categorical(jnp.ones(3) / 3), "Categorical", False),
        (dist.Bernoulli(0.3), "Bernoulli", False),
        (dist.Wishart(4.0, jnp.eye(2)), "Wishart", False),
        (dist.GaussianRandomWalk(1.0, num_steps=6), "ChainGaussian", False),
        (dist.GaussianStateSpace(5, 0.9 * jnp.eye(2), jnp.eye(2)), "ChainGaussian", False),
        (dist.HalfCauchy(1.0), "Normal", True),
        (dist.LogNormal(0.0, 1.0).expand([2]).to_event(1), "MultivariateNormal", True),
        (dist.StudentT(3.0, 0.0, 1.0), "Normal", False),
        (dist.Binomial(4, 0.5), "Categorical", False),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, dist.Distribution) else str(x),
)
def test_default_families(prior, family, transformed):
    def model():
        numpyro.sample("x", prior)

    v = blrppl.trace(model).variables["x"]
    assert v.family == family
    assert (v.transform is not None) == transformed
    assert v.shape == tuple(prior.shape())


def test_gaussian_state_space_chain():
    def model():
        numpyro.sample("s", dist.GaussianStateSpace(5, 0.9 * jnp.eye(2), jnp.eye(2)))

    chain = blrppl.trace(model).variables["s"].chain
    assert (chain.sites, chain.length, chain.state_shape, chain.time_axis) == (("s",), 5, (2,), 0)


def test_vector_scan_chain_joined_with_its_initial_state():
    def model(y):
        x0 = numpyro.sample("x0", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
        A = numpyro.sample("A", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))

        def step(x_prev, y_t):
            x = numpyro.sample("x", dist.MultivariateNormal(A @ x_prev, jnp.eye(2)))
            numpyro.sample("y", dist.Normal(x, 1.0).to_event(1), obs=y_t)
            return x, None

        scan(step, x0, y)

    fg = blrppl.trace(model, jnp.zeros((7, 2)))
    assert set(fg.variables) == {"x", "A"}
    v = fg.variables["x"]
    assert (v.family, v.shape) == ("ChainGaussian", (8, 2))
    assert (v.chain.sites, v.chain.length, v.chain.state_shape) == (("x0", "x"), 8, (2,))
    assert fg.factors["x0"].neighbours == ("x",)
    assert fg.factors["x"].neighbours == ("x", "A")
    assert fg.factors["y"].neighbours == ("x",)


def test_scan_chain_without_a_separate_initial_state():
    def model(y):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

        def step(prev, y_t):
            x = numpyro.sample("x", dist.Normal(prev, sigma))
            numpyro.sample("y", dist.Normal(x, 1.0), obs=y_t)
            return x, None

        scan(step, 0.0, y)

    v = blrppl.trace(model, jnp.zeros(9)).variables["x"]
    assert (v.family, v.shape, v.chain.sites, v.chain.length) == ("ChainGaussian", (9,), ("x",), 9)


def test_enumeration_ready_model_with_vindex():
    def model(y):
        probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones((2, 2))).to_event(1))
        with numpyro.plate("N", 4):
            z = numpyro.sample(
                "z", dist.Categorical(jnp.ones(2) / 2), infer={"enumerate": "parallel"}
            )
            w = numpyro.sample(
                "w", dist.Categorical(Vindex(probs)[z]), infer={"enumerate": "parallel"}
            )
            numpyro.sample("y", dist.Normal(w.astype(float), 1.0), obs=y)

    fg = blrppl.trace(model, jnp.zeros(4))
    assert fg.variables["w"].family == "Categorical"
    assert fg.factors["w"].neighbours == ("w", "probs", "z")
    assert fg.factors["y"].neighbours == ("w",)


def test_markov_loop_is_joined_into_one_chain():
    pytest.importorskip("funsor")
    from numpyro.contrib.funsor import markov

    def model(y):
        trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones((2, 2))).to_event(1))
        x = 0
        for t in markov(range(len(y))):
            x = numpyro.sample(
                f"x_{t}", dist.Categorical(Vindex(trans)[x]), infer={"enumerate": "parallel"}
            )
            numpyro.sample(f"y_{t}", dist.Normal(x.astype(float), 1.0), obs=y[t])

    fg = blrppl.trace(model, jnp.zeros(3))
    assert list(fg.variables) == ["trans", "x_0"]
    chain = fg.variables["x_0"].chain
    assert chain.kind == "markov" and chain.sites == ("x_0", "x_1", "x_2") and chain.length == 3
    assert fg.variables["x_0"].family == "ChainCategorical" and fg.variables["x_0"].shape == (3,)
    # The steps' priors and likelihoods are one factor each, as a scan would give.
    assert list(fg.factors) == ["trans", "x_0", "y_0"]
    assert fg.factors["x_0"].sites == ("x_0", "x_1", "x_2") and fg.factors["x_0"].neighbours == ("x_0", "trans")
    assert fg.factors["y_0"].sites == ("y_0", "y_1", "y_2") and fg.factors["y_0"].value.shape == (3,)
    assert fg.factor_of("y_2") is fg.factors["y_0"]
    # Two linked sites are not a chain: they keep one node each.
    fg = blrppl.trace(model, jnp.zeros(2))
    assert list(fg.variables) == ["trans", "x_0", "x_1"]


def test_family_overrides():
    def model():
        numpyro.sample("tau", dist.HalfCauchy(1.0))
        numpyro.sample("beta", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
        numpyro.sample("p", dist.Uniform(0.0, 1.0))

    fg = build_graph(model, families={"tau": "Gamma", "beta": "DiagonalNormal", "p": "Beta"})
    assert fg.variables["tau"].family == "Gamma" and fg.variables["tau"].transform is None
    assert fg.variables["beta"].family == "DiagonalNormal"
    assert fg.variables["p"].family == "Beta"
    fg = build_graph(model, families={"p": "Normal"})
    assert fg.variables["p"].family == "Normal" and fg.variables["p"].transform is not None


def test_override_keeps_a_scan_chain():
    def model(y):
        x0 = numpyro.sample("x0", dist.Normal(0.0, 1.0))

        def step(prev, y_t):
            x = numpyro.sample("x", dist.Normal(prev, 1.0))
            numpyro.sample("y", dist.Normal(x, 1.0), obs=y_t)
            return x, None

        scan(step, x0, y)

    v = build_graph(model, (jnp.zeros(4),), families={"x": "MultivariateNormal"}).variables["x"]
    assert v.family == "MultivariateNormal" and v.chain.sites == ("x0", "x")
