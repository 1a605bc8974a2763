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
    assert [rule.engine for rule in RULES] == ["SVI", "EM", "ConjugateBayes", "VMP", "NonConjugateVI", "NonConjugateVI"]
    assert [dict(rule.options) for rule in RULES][-2:] == [{"blocks": "all"}, {}]
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
    # A plan whose q differ (a joined block) is not read: the factors are analysed again.
    joined = blrppl.NonConjugateVI(poisson_hierarchy, blocks=[("mu", "sd")]).plan(g, y=y)
    assert plan_module.nonconjugate_block(graph, joined) == reference and analysed
