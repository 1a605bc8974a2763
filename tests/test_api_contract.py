"""The names of shared/API.md exist and behave as documented."""

import inspect

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl

ENGINES = ["BLR", "ConjugateBayes", "EM", "VMP", "SVI", "NonConjugateVI", "Laplace"]


def test_top_level_names():
    for name in ENGINES + ["trace", "FactorGraph", "ModelError"]:
        assert hasattr(blrppl, name), name
    assert issubclass(blrppl.ModelError, ValueError)


def test_blr_accepts_every_documented_option():
    params = inspect.signature(blrppl.BLR).parameters
    for option in ("mode", "schedule", "learning_rate", "estimator", "num_samples", "families", "blocks", "point_estimates", "init"):
        assert option in params, option
        assert params[option].kind is inspect.Parameter.KEYWORD_ONLY


def model(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", 20):
        numpyro.deterministic("centred", mu - 1.0)
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def test_trace_and_networkx():
    fg = blrppl.trace(model, y=jnp.ones(20))
    assert set(fg.variables) == {"mu", "tau"} and set(fg.factors) == {"mu", "tau", "y"}
    g = fg.to_networkx()
    assert nx.is_bipartite(g)
    assert g.nodes[("variable", "mu")]["kind"] == "variable" and g.nodes[("factor", "y")]["name"] == "y"
    assert g.has_edge(("factor", "y"), ("variable", "tau"))
    assert fg.factors["y"].edges["tau"].conjugate is True


def test_result_surface(rng_key):
    y = 1.0 + jax.random.normal(jax.random.key(3), (20,))
    engine = blrppl.VMP(model, mode="local")
    result = engine.run(rng_key, 10, y=y, progress_bar=False, tol=None, init_state=None)
    assert result.elbo.shape == (10,)
    assert result.posterior["mu"].mean.shape == () and result.posterior["tau"].variance.shape == ()
    assert result.params == {}
    assert set(result.natural_params) == {"mu", "tau"}
    assert set(result.site_params) == {"mu", "tau", "y"}
    draws = result.sample(rng_key, 7)
    assert draws["mu"].shape == (7,) and draws["centred"].shape == (7,)
    np.testing.assert_allclose(draws["centred"], draws["mu"] - 1.0, rtol=1e-12)
    predictive = numpyro.infer.Predictive(model, guide=engine.guide(result), num_samples=11)
    assert predictive(rng_key)["y"].shape == (11, 20)
    resumed = engine.run(rng_key, 3, y=y, progress_bar=False, init_state=result.state)
    assert int(resumed.state.step) == 13
