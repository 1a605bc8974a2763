"""The exact estimator against NumPyro's own log densities, and its interface.

Under a point-mass q (every mean parameter the statistic of one value: E[x] = x,
E[x^2] = x^2, E[log x] = log x, one_hot(z), ...), E_q[log f] is log f at that
value. The exact estimator evaluates the canonical densities of
``blrppl.symbolic.canonical``; here each factor of several conjugate models,
priors included, is compared with ``site["fn"].log_prob`` of NumPyro at a
prior draw (rtol 1e-10). The estimator must also be pure: jit-compatible and
independent of the rng key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers

from blrppl.engines.vmp import VMP
from blrppl.families import NORMAL, MVNStats, NormalStats
from tests.compiles import cheap_jit

_rs = np.random.RandomState(0)
N, D, K, J = 7, 3, 3, 4
X = _rs.randn(N, D)
Y = _rs.randn(N)
Y_POS = _rs.gamma(2.0, 1.0, N)
Y_COUNT = _rs.poisson(2.0, N).astype(float)
Y_BIN = (_rs.rand(N) > 0.5).astype(float)
Y_CAT = _rs.randint(0, K, N)
Y_VEC = _rs.randn(N, 2)
COUNTY = np.array([0, 0, 1, 3, 3, 2, 1])
EXPOSURE = _rs.uniform(0.5, 2.0, N)


def normal_gamma(y):
    mu = numpyro.sample("mu", dist.Normal(0.3, 1.5))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.5))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Normal(mu, 1 / jnp.sqrt(tau)), obs=y)


def hierarchical(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    var = numpyro.sample("var", dist.InverseGamma(3.0, 2.0))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, jnp.sqrt(var)))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Normal(theta[COUNTY], 0.5), obs=y)


def regression(X, y):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
    beta = numpyro.sample("beta", dist.MultivariateNormal(jnp.zeros(D), 2.0 * jnp.eye(D)))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Normal(alpha + X @ beta, jax.lax.rsqrt(tau)), obs=y)


def mean_field_regression(X, y):
    with numpyro.plate("D", D):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Normal(X @ beta, 0.7), obs=y)


def mvn_wishart(Y):
    mu = numpyro.sample("mu", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
    lam = numpyro.sample("Lam", dist.Wishart(4.5, jnp.array([[1.0, 0.2], [0.2, 0.5]])))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.MultivariateNormal(mu, precision_matrix=lam), obs=Y)


def gamma_rates(y):
    b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
    with numpyro.plate("G", 2):
        lam = numpyro.sample("lam", dist.Gamma(2.5, b))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Poisson(lam[COUNTY % 2] * EXPOSURE), obs=y)


def exponential_gamma(y):
    b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Exponential(b), obs=y)


def beta_models(y):
    p = numpyro.sample("p", dist.Beta(2.0, 3.0))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Bernoulli(probs=p), obs=y)
        numpyro.sample("k", dist.Binomial(5, probs=p), obs=2.0 * y)


def dirichlet_models(y):
    w = numpyro.sample("w", dist.Dirichlet(jnp.array([1.5, 0.7, 2.0])))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Categorical(probs=w), obs=y)
    with numpyro.plate("M", 2):
        numpyro.sample("m", dist.Multinomial(4, probs=w), obs=jnp.array([[1.0, 2.0, 1.0], [0.0, 4.0, 0.0]]))


def mixture(y):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(K)))
    with numpyro.plate("K", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", dist.Categorical(probs=w))
        numpyro.sample("y", dist.Normal(mu[z], 1 / jnp.sqrt(lam[z])), obs=y)


def spike(y):
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    m = numpyro.sample("m", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", N):
        z = numpyro.sample("z", dist.Bernoulli(probs=p))
        numpyro.sample("y", dist.Normal(z * m, 0.5), obs=y)


MODELS = {
    "normal_gamma": (normal_gamma, (Y,)),
    "hierarchical": (hierarchical, (Y,)),
    "regression": (regression, (X, Y)),
    "mean_field_regression": (mean_field_regression, (X, Y)),
    "mvn_wishart": (mvn_wishart, (Y_VEC,)),
    "gamma_rates": (gamma_rates, (Y_COUNT,)),
    "exponential_gamma": (exponential_gamma, (Y_POS,)),
    "beta_models": (beta_models, (Y_BIN,)),
    "dirichlet_models": (dirichlet_models, (Y_CAT,)),
    "mixture": (mixture, (Y,)),
    "spike": (spike, (Y,)),
}


def point_mean(q, value):
    """Family-layout mean parameters of a point mass at ``value``."""
    v = jnp.asarray(value, jnp.float64) if q.kind != "categorical" else jnp.asarray(value)
    if q.kind == "gaussian":
        if q.family is NORMAL:
            return NormalStats(x=v, x_sq=v**2)
        return MVNStats(x=v, xxT=v[..., :, None] * v[..., None, :])
    stats = {
        "gamma": lambda: {"x": v, "log_x": jnp.log(v)},
        "inverse_gamma": lambda: {"inv_x": 1 / v, "log_x": jnp.log(v)},
        "beta": lambda: {"log_x": jnp.log(v), "log1m_x": jnp.log1p(-v)},
        "dirichlet": lambda: {"log_x": jnp.log(v)},
        "bernoulli": lambda: {"x": v},
        "categorical": lambda: {"one_hot": jax.nn.one_hot(v, q.num_categories, dtype=jnp.float64)},
        "wishart": lambda: {"x": v, "log_det_x": jnp.linalg.slogdet(v)[1]},
    }[q.kind]()
    return q.family.stats_type(**stats)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_point_mass_expectation_is_numpyro_log_prob(name):
    model, args = MODELS[name]
    plan = VMP(model).plan(*args)
    for seed in range(2):
        trace = handlers.trace(handlers.seed(model, seed)).get_trace(*args)
        mean = {v: point_mean(q, trace[v]["value"]) for v, q in plan.qs.items()}
        for est in plan.estimators:
            value, _ = est.estimate(jax.random.key(0), mean, plan.init_params, plan.arrays)
            site = trace[est.factor]
            want = jnp.sum(site["fn"].log_prob(site["value"]))
            np.testing.assert_allclose(float(value), float(want), rtol=1e-10, atol=1e-10, err_msg=est.factor)


@pytest.mark.parametrize("name", ["regression", "mixture", "mvn_wishart"])
def test_estimator_is_pure(name):
    """Same value and site parameters under jit and for any rng key; matrix site parameters symmetric."""
    model, args = MODELS[name]
    plan = VMP(model).plan(*args)
    trace = handlers.trace(handlers.seed(model, 3)).get_trace(*args)
    mean = {v: point_mean(q, trace[v]["value"]) for v, q in plan.qs.items()}
    for est in plan.estimators:
        assert est.method.label == "exact"
        eager = est.estimate(jax.random.key(0), mean, plan.init_params, plan.arrays)
        other_key = est.estimate(jax.random.key(123), mean, plan.init_params, plan.arrays)
        jitted = cheap_jit(est.estimate)(jax.random.key(7), mean, plan.init_params, plan.arrays)
        for a, b, c in zip(jax.tree.leaves(eager), jax.tree.leaves(other_key), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-12, atol=1e-12)
        for v, site in eager[1].items():
            assert type(site) is plan.qs[v].family.stats_type
            for leaf in site:
                leaf = np.asarray(leaf)
                if leaf.ndim >= 2 and leaf.shape[-1] == leaf.shape[-2] and plan.qs[v].kind in ("gaussian", "wishart"):
                    np.testing.assert_array_equal(leaf, np.swapaxes(leaf, -1, -2))


def test_prior_site_parameter_is_the_prior_natural_parameter():
    """A prior factor's site parameter for its own variable is the prior's natural parameter."""
    plan = VMP(mixture).plan(Y)

    def draw(key):  # the prior's draws in one program (eager, its samplers compile op by op)
        trace = handlers.trace(handlers.seed(mixture, key)).get_trace(Y)
        return {k: site["value"] for k, site in trace.items() if site["type"] == "sample" and not site["is_observed"]}

    values = cheap_jit(draw)(jax.random.key(0))
    trace = handlers.trace(handlers.substitute(mixture, data=values)).get_trace(Y)
    mean = {v: point_mean(q, trace[v]["value"]) for v, q in plan.qs.items()}
    by_factor = {e.factor: e for e in plan.estimators}
    for v in ("w", "mu", "lam"):
        q = plan.qs[v]
        _, grads = cheap_jit(by_factor[v].estimate)(jax.random.key(0), mean, {}, plan.arrays)  # one program
        prior = trace[v]["fn"]
        want = q.family.from_numpyro(prior)
        for got_leaf, want_leaf in zip(grads[v], want, strict=True):
            np.testing.assert_allclose(
                np.asarray(got_leaf), np.broadcast_to(np.asarray(want_leaf), np.shape(got_leaf)), rtol=1e-12, atol=1e-14
            )
