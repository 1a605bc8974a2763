"""blrppl.choose: the engine the command line uses, and why, read off the trace."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.choosing import ENGINES, RULES
from models import ZOO

EXPECTED = {
    "gamma_poisson": "ConjugateBayes",  # one Gamma block: the posterior is in the family
    "normal_mean_precision": "VMP",  # conjugate, but y touches two q blocks
    "nile": "EM",  # numpyro.param noise variances
    "logistic_regression": "NonConjugateVI",  # the Bernoulli likelihood is not conjugate
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_models_get_the_documented_engine_and_its_plan(name):
    entry = ZOO[name]
    args, kwargs = entry.data()
    choice = blrppl.choose(entry.model, *args, **kwargs)
    assert choice.name == EXPECTED[name] and isinstance(choice.engine, ENGINES[choice.name])
    assert choice.reasons and str(choice).startswith(choice.name)
    # The plan the choice made is the one the engine would make: run reuses it.
    assert choice.plan.signature == choice.engine.plan(*args, **kwargs).signature


def test_reasons_name_the_sites():
    entry = ZOO["logistic_regression"]
    args, kwargs = entry.data()
    assert "'y' in 'beta'" in blrppl.choose(entry.model, *args, **kwargs).reasons[0]
    entry = ZOO["nile"]
    args, kwargs = entry.data()
    assert "obs_var" in blrppl.choose(entry.model, *args, **kwargs).reasons[0]


def minibatch(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0], subsample_size=10) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def test_subsampled_plate_chooses_svi():
    choice = blrppl.choose(minibatch, jnp.linspace(-1.0, 1.0, 50))
    assert choice.name == "SVI" and choice.plan is None and "10 of 50" in choice.reasons[0]
    result = choice.engine.run(jax.random.key(0), 20, jnp.linspace(-1.0, 1.0, 50), progress_bar=False)
    assert jnp.isfinite(result.elbo[-1])


def test_every_rule_names_an_engine():
    assert [rule.engine for rule in RULES] == [
        "SVI", "EM", "ConjugateBayes", "VMP", "VMP", "NonConjugateVI", "NonConjugateVI"
    ]
    assert [dict(rule.options) for rule in RULES][-4:] == [{"blocks": "gaussian"}, {}, {"blocks": "all"}, {}]
    assert all(rule.engine in ENGINES for rule in RULES)


def test_the_joint_block_rule_reads_the_plans_verdicts(monkeypatch):
    from blrppl.blr import plan as plan_module
    from tests.engines.test_joint_block_starts import COUNTS as y, GROUPS as g, poisson_hierarchy

    graph = blrppl.NonConjugateVI(poisson_hierarchy).plan(g, y=y).graph
    reference = plan_module.nonconjugate_block(graph)
    assert reference == [("mu", "sd", "eff")]
    analysed = []
    original = plan_module.graph_verdicts
    monkeypatch.setattr(plan_module, "graph_verdicts", lambda *a: analysed.append(1) or original(*a))
    choice = blrppl.choose(poisson_hierarchy, g, y=y)
    assert choice.engine.config.blocks == "all" and not analysed  # no second analysis of every factor
    # The choice carries the joint plan, made from the same verdicts: fit(choice.plan) plans nothing.
    assert [v for v, q in choice.plan.qs.items() if q.joint] == ["mu+sd+eff"]
    assert choice.plan.qs.keys() == choice.engine.plan(g, y=y).qs.keys()
    # A plan whose q differ (a joined block) is not read: the factors are analysed again.
    joined = blrppl.NonConjugateVI(poisson_hierarchy, blocks=[("mu", "sd")]).plan(g, y=y)
    assert plan_module.nonconjugate_block(graph, joined) == reference and analysed


def exponential_scales(group, x, y=None):
    """A varying-intercept regression with Exponential priors on both scales, as NumPyro's
    examples write them: in the priors' Gamma family the likelihood needs Monte Carlo for them."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sd_a = numpyro.sample("sd_a", dist.Exponential(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    with numpyro.plate("G", 50):
        a = numpyro.sample("a", dist.Normal(mu, sd_a))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("y", dist.Normal(a[group] + b * x, sigma), obs=y)


def exponential_scales_data():
    import numpy as np

    rng = np.random.default_rng(0)
    group, x = rng.integers(0, 50, 1000), rng.normal(size=1000)
    y = rng.normal(0.0, 0.8, 50)[group] + 0.5 * x + rng.normal(0.0, 1.2, 1000)
    return (jnp.asarray(group), jnp.asarray(x)), {"y": jnp.asarray(y)}


def test_scales_whose_prior_family_needs_monte_carlo_get_a_gaussian_q():
    """Too many latents for one full Gaussian (52 scalars): mean-field, with the two scales'
    q Gaussian on their logs, where the likelihood takes quadrature: no Monte Carlo left."""
    args, kwargs = exponential_scales_data()
    choice = blrppl.choose(exponential_scales, *args, **kwargs)
    assert choice.name == "NonConjugateVI" and choice.engine.config.blocks == ()
    assert dict(choice.engine.config.families) == {"sd_a": "Normal", "sigma": "Normal"}
    assert "Gaussian q on their unconstrained space" in str(choice)
    assert choice.plan is not None and not any(e.method.noisy for e in choice.plan.estimators)
    assert choice.plan.qs["sigma"].family.gaussian
    # The engine's own default plans the same fit (Config.gaussian_fallback).
    plan = blrppl.NonConjugateVI(exponential_scales).plan(*args, **kwargs)
    assert plan.signature == choice.plan.signature


@pytest.mark.slow
def test_the_gaussian_scales_match_nuts(rng_key):
    from numpyro.infer import MCMC, NUTS

    args, kwargs = exponential_scales_data()
    choice = blrppl.choose(exponential_scales, *args, **kwargs)
    result = choice.engine.fit(choice.plan, rng_key, 500, progress_bar=False, tol=1e-8)
    assert result.converged and len(result.elbo) < 100 and not result.flags
    mcmc = MCMC(NUTS(exponential_scales), num_warmup=1000, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.key(1), *args, **kwargs)
    draws = mcmc.get_samples()
    for site in ("mu", "b", "sd_a", "sigma"):
        q, ref = result.posterior[site], draws[site]
        assert abs(float(q.mean) - float(ref.mean())) < 0.1 * float(ref.std()), site
        assert abs(float(q.variance) ** 0.5 / float(ref.std()) - 1.0) < 0.15, site
