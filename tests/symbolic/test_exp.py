"""exp of a latent in the symbolic interpreter: an atom that only a log turns back into a statistic.

A variable with positive support gets a Gaussian q on its log scale, so its
value in the model is exp(u). A log-normal prior reads log(exp(u)) = u: its
site parameter is exact (and its estimator no longer traces the model per
cubature node or sample). Anywhere else exp(u) stays non-conjugate, with a
reason that names exp and the variable.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.build import judged_by_mode
from blrppl.symbolic import canonical as C
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value
from blrppl.symbolic.terms import NonConjugate

_INFOS = {"a": VarInfo("gaussian", (3,), 1), "b": VarInfo("gaussian", (), 0)}
_EXAMPLES = {"a": jnp.zeros(3), "b": jnp.zeros(())}
_MEAN = {
    "a": {"x": jnp.asarray([0.4, -1.0, 2.0]), "xx": jnp.asarray([0.9, 1.5, 4.5])},
    "b": {"x": jnp.asarray(0.3), "xx": jnp.asarray(0.5)},
}
_OFFSET = np.array([0.5, -2.0, 1.0])


def _expected(fn):
    return expected_value(analyse(lambda v: jnp.sum(fn(v["a"], v["b"])), _EXAMPLES, _INFOS), _MEAN)


@pytest.mark.parametrize(
    "fn, same",
    [
        (lambda a, b: jnp.log(jnp.exp(a)), lambda a, b: a),
        (lambda a, b: jnp.log(jnp.exp(2.0 * a + _OFFSET)), lambda a, b: 2.0 * a + _OFFSET),
        (lambda a, b: jnp.log(jnp.exp(a) ** 2 * 3.0), lambda a, b: 2.0 * a + np.log(3.0)),
        (lambda a, b: jnp.log(jnp.exp(a) * jnp.exp(-0.5 * a)), lambda a, b: 0.5 * a),
        (lambda a, b: jnp.log(jnp.sqrt(jnp.exp(b))) * a, lambda a, b: 0.5 * b * a),
        (lambda a, b: C._log_normal(jnp.exp(a), 0.3, 1.5) + a, lambda a, b: C._normal(a, 0.3, 1.5)),
    ],
    ids=["log_exp", "offset", "power", "product", "sqrt", "log_normal_prior"],
)
def test_a_log_of_exp_is_the_value_itself(fn, same):
    np.testing.assert_allclose(_expected(fn), _expected(same), rtol=1e-12)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda a, b: (1.0 - jnp.exp(a)) ** 2, ["exp('a')", "not a sufficient statistic"]),
        (lambda a, b: jnp.exp(-2.0 * b) * a, ["exp(-2 * 'b')", "not a sufficient statistic"]),
        (lambda a, b: jnp.log(jnp.exp(a + b)), ["primitive 'exp'"]),
        (lambda a, b: jnp.log(jnp.exp(a**2)), ["primitive 'exp'"]),
        (lambda a, b: jnp.log(jnp.exp(a) + 1.0), ["log of a sum"]),
    ],
    ids=["squared_residual", "scale", "two_variables", "square", "softplus"],
)
def test_exp_anywhere_else_is_non_conjugate_and_says_so(fn, words):
    with pytest.raises(NonConjugate) as info:
        _expected(fn)
    for word in words:
        assert word in info.value.reason, info.value.reason


def _log_normal_scale(y=None):
    s = numpyro.sample("s", dist.LogNormal(0.3, 1.5))
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", 20):
        numpyro.sample("y", dist.Normal(mu, s), obs=y)


def test_a_log_normal_prior_is_exact_and_the_likelihood_is_not():
    y = jnp.asarray(np.random.default_rng(0).normal(1.0, 2.0, 20))
    plan = blrppl.NonConjugateVI(_log_normal_scale).plan(y=y)
    methods = {e.factor: e.method for e in plan.estimators}
    assert not methods["s"].estimated and methods["s"].exact == ("s",)
    assert methods["y"].estimated == ("s",)
    with pytest.raises(blrppl.ModelError, match=r"site 'y'.*exp\(-2 \* 's'\) is not a sufficient statistic"):
        blrppl.VMP(_log_normal_scale).plan(y=y)


def test_the_prior_alone_is_fitted_exactly_on_the_log_scale():
    def model():
        numpyro.sample("s", dist.LogNormal(0.3, 1.5))

    result = blrppl.NonConjugateVI(model).run(jax.random.key(0), 20, progress_bar=False, tol=1e-10)
    q = result.posterior["s"]  # the Gaussian on log s
    np.testing.assert_allclose(q.base_dist.loc, 0.3, rtol=1e-10)
    np.testing.assert_allclose(q.base_dist.scale, 1.5, rtol=1e-10)


def test_newton_steps_are_judged_by_the_log_joint_beside_exact_priors():
    """A delta-method likelihood beside exact log-normal priors: the BLR step at ρ = 1 is a
    Newton step on log p̄ (their exact site parameters are the delta method's), so its guard
    reads log p̄(m); a broad start judged by the delta ELBO instead wandered (a Gaussian process
    start: 25 ms -> 250 ms, and its first step's ELBO -18.0 instead of -11.4)."""

    def model(y=None):
        s = numpyro.sample("s", dist.LogNormal(0.3, 1.5))
        with numpyro.plate("N", 20):
            numpyro.sample("y", dist.Normal(0.0, s), obs=y)

    y = jnp.asarray(np.random.default_rng(0).normal(0.0, 2.0, 20))
    plan = blrppl.NonConjugateVI(model).plan(y=y)
    start = dataclasses.replace(plan, estimators=plan.start_estimators, start_estimators=())
    methods = {e.factor: (e.method.estimator, bool(e.method.exact)) for e in start.estimators}
    assert methods == {"s": ("", True), "y": ("delta", False)}
    assert judged_by_mode(start)
    assert not judged_by_mode(plan)  # its likelihood by quadrature: the ELBO is the objective


def test_a_start_with_a_latent_scale_prior_stays_judged_by_its_elbo():
    """alpha ~ Normal(loc, scale) with scale latent: log p̄ grows without bound as scale collapses
    onto alpha = loc (a funnel). Beside loc's exact prior, the Newton start keeps the ELBO as its
    guard's objective, which keeps q wide (numpyro's baseball model, ``examples/baseball.py``)."""

    def baseball(at_bats, hits=None):
        loc = numpyro.sample("loc", dist.Normal(-1, 1))
        scale = numpyro.sample("scale", dist.HalfCauchy(1))
        with numpyro.plate("num_players", at_bats.shape[0]):
            alpha = numpyro.sample("alpha", dist.Normal(loc, scale))
            numpyro.sample("obs", dist.Binomial(at_bats, logits=alpha), obs=hits)

    hits = jnp.asarray([12.0, 9.0, 15.0, 11.0, 8.0, 13.0])
    plan = blrppl.NonConjugateVI(baseball, blocks="all").plan(jnp.full(6, 45.0), hits=hits)
    start = dataclasses.replace(plan, estimators=plan.start_estimators, start_estimators=())
    methods = {e.factor: (e.method.estimator, bool(e.method.exact)) for e in start.estimators}
    assert methods == {"loc": ("", True), "scale": ("delta", False), "alpha": ("delta", False), "obs": ("delta", False)}
    assert not judged_by_mode(start)
