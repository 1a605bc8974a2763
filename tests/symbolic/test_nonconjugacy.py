"""Non-conjugate factors are flagged, with a readable reason, and never get a wrong number.

The exact estimator must refuse any factor whose expected log density is not
affine in a neighbour's sufficient statistics (Khan & Rue, Sec. 5.4: those
need estimated natural gradients). The verdict of every edge (factor,
variable) is recorded in the factor graph: conjugate edges stay True, the
failing ones get False and the reason.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.plan import param_examples
from blrppl.engines.conjugate import ConjugateBayes
from blrppl.engines.presets import EXACT
from blrppl.engines.vmp import VMP
from blrppl.estimators.base import q_space_examples
from blrppl.graph.concrete import example_latents
from blrppl.estimators.select import choose_estimator
from blrppl.graph.families import variable_q
from blrppl.graph.trace import build_graph
from blrppl.symbolic import canonical as C
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo
from blrppl.symbolic.terms import NonConjugate

from ._helpers import example

_rs = np.random.RandomState(7)
X = _rs.randn(6, 2)
Y_REAL = _rs.randn(6)
Y_POS = _rs.gamma(2.0, 1.0, 6)
Y_COUNT = _rs.poisson(2.0, 6).astype(float)
Y_BIN = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
Y_VEC = _rs.randn(6, 2)


def all_verdicts(model, *args):
    """Choose every factor's estimator the way ``make_plan`` does, but go on past failures.

    Returns ``(graph, errors)``: the traced graph with every edge's verdict
    (``blrppl.trace``) and the ModelError message of each failing factor.
    """
    graph = build_graph(model, args, {})
    qs = {name: variable_q(node, graph.plates) for name, node in graph.variables.items()}
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples(example_latents(graph), transforms)
    init_params, _ = param_examples(graph)
    errors = {}
    for name in graph.factors:
        try:
            choose_estimator(graph, name, qs, examples, init_params, EXACT)
        except blrppl.ModelError as error:
            errors[name] = str(error)
    return blrppl.trace(model, *args), errors


def plan_failure(model, *args, engine_cls=VMP, monkeypatch=None):
    """Run the real ``plan``; it must raise. Returns (the traced graph with verdicts, the error)."""
    del monkeypatch
    with pytest.raises(blrppl.ModelError) as info:
        engine_cls(model).plan(*args)
    return blrppl.trace(model, *args), info.value


# ---------------------------------------------------------------------------
# Non-conjugate models: (model, args, failing factor, its variable, words the reason must hold).


def poisson_log_link(X, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([2]))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Poisson(jnp.exp(X @ beta)), obs=y)


def logistic_regression(X, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([2]))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Bernoulli(probs=jax.nn.sigmoid(X @ beta)), obs=y)


def half_cauchy_scale(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfCauchy(1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def sqrt_precision_as_scale(y):
    """Normal(0, tau ** 0.5): precision 1/tau needs E[1/tau], not a Gamma statistic."""
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(0.0, tau**0.5), obs=y)


def precision_as_scale(y):
    """Normal(mu, 1 / tau): precision tau^2 needs E[tau^2]."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(mu, 1 / tau), obs=y)


def gamma_as_location(y):
    """Normal(tau, 1): (y - tau)^2 needs E[tau^2]."""
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(tau, 1.0), obs=y)


def variance_as_scale(y):
    """Normal(mu, var) with inverse-Gamma var: needs E[1/var^2]."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    var = numpyro.sample("var", dist.InverseGamma(3.0, 2.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(mu, var), obs=y)


def quartic_location(y):
    """Normal(mu * mu, 1): a polynomial of degree 4 in mu."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(mu * mu, 1.0), obs=y)


def shifted_poisson_rate(y):
    """Poisson(lam + 1): log(lam + 1) is not a Gamma statistic."""
    lam = numpyro.sample("lam", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Poisson(lam + 1.0), obs=y)


def inverse_exponential_rate(y):
    """Exponential(1 / b): needs E[1/b] under a Gamma q."""
    b = numpyro.sample("b", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Exponential(1 / b), obs=y)


def latent_gamma_shape(y):
    """Gamma(a, 1) with latent a: log Gamma(a) is not a statistic of a."""
    a = numpyro.sample("a", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Gamma(a, 1.0), obs=y)


def squared_probability(y):
    """Bernoulli(p * p): log(1 - p^2) is not a Beta statistic."""
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Bernoulli(probs=p * p), obs=y)


def wishart_as_covariance(Y):
    """MultivariateNormal(mu, covariance_matrix=Lam) with Wishart Lam: needs E[Lam^-1]."""
    mu = numpyro.sample("mu", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
    lam = numpyro.sample("Lam", dist.Wishart(4.0, jnp.eye(2)))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.MultivariateNormal(mu, covariance_matrix=lam), obs=Y)


NONCONJUGATE = {
    "poisson_log_link": (poisson_log_link, (X, Y_COUNT), "y", "beta", ["exp"]),
    "logistic_regression": (logistic_regression, (X, Y_BIN), "y", "beta", ["logistic"]),
    "half_cauchy_prior": (half_cauchy_scale, (Y_REAL,), "sigma", "sigma", ["HalfCauchy"]),
    "sqrt_precision_as_scale": (sqrt_precision_as_scale, (Y_REAL,), "y", "tau", ["tau"]),
    "precision_as_scale": (precision_as_scale, (Y_REAL,), "y", "tau", ["tau"]),
    "gamma_as_location": (gamma_as_location, (Y_REAL,), "y", "tau", ["tau"]),
    "variance_as_scale": (variance_as_scale, (Y_REAL,), "y", "var", ["var"]),
    "quartic_location": (quartic_location, (Y_REAL,), "y", "mu", ["mu", "4"]),
    "shifted_poisson_rate": (shifted_poisson_rate, (Y_COUNT,), "y", "lam", ["lam"]),
    "inverse_exponential_rate": (inverse_exponential_rate, (Y_POS,), "y", "b", ["b"]),
    "latent_gamma_shape": (latent_gamma_shape, (Y_POS,), "y", "a", ["a"]),
    "squared_probability": (squared_probability, (Y_BIN,), "y", "p", ["p"]),
    "wishart_as_covariance": (wishart_as_covariance, (Y_VEC,), "y", "Lam", ["Lam"]),
}


@pytest.mark.parametrize("name", sorted(NONCONJUGATE))
def test_plan_raises_model_error_naming_factor_variable_and_reason(name, monkeypatch):
    model, args, factor, var, words = NONCONJUGATE[name]
    graph, error = plan_failure(model, *args, monkeypatch=monkeypatch)
    message = str(error)
    assert message.startswith(f"site {factor!r}:"), message
    assert repr(var) in message, message
    edge = graph.factors[factor].edges[var]
    assert edge.conjugate is False
    assert edge.reason and edge.reason in message, (edge.reason, message)
    for word in words:
        assert word in edge.reason, (word, edge.reason)
    # The house format: problem; remedy.
    assert "; " in message and message.endswith(".")


@pytest.mark.parametrize("name", sorted(NONCONJUGATE))
def test_conjugate_bayes_refuses_non_conjugate_models(name):
    model, args, factor, _, _ = NONCONJUGATE[name]
    with pytest.raises(blrppl.ModelError, match=f"site '{factor}'"):
        ConjugateBayes(model).plan(*args)


@pytest.mark.parametrize("name", sorted(NONCONJUGATE))
def test_every_edge_gets_a_verdict(name):
    """Planning every factor (past the failure) leaves no edge undecided; priors of
    exponential-family latents stay conjugate."""
    model, args, factor, _, _ = NONCONJUGATE[name]
    graph, errors = all_verdicts(model, *args)
    assert factor in errors
    for fname, node in graph.factors.items():
        for v, edge in node.edges.items():
            assert edge.conjugate in (True, False), (fname, v, edge)
            assert isinstance(edge.reason, str) and edge.reason, (fname, v, edge)
        if fname not in errors:
            assert all(e.conjugate for e in node.edges.values()), (fname, node.edges)
        else:
            assert any(not e.conjugate for e in node.edges.values()), (fname, node.edges)


def mixed_edges(y):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", 6):
        numpyro.sample("y", dist.Normal(jnp.exp(a), 1 / jnp.sqrt(tau)), obs=y)


def test_mixed_factor_verdicts_after_plan(monkeypatch):
    """y ~ Normal(exp(a), 1/sqrt(tau)): the edge to tau is conjugate, the edge to a is not."""
    graph, error = plan_failure(mixed_edges, Y_REAL, monkeypatch=monkeypatch)
    edges = graph.factors["y"].edges
    assert edges["a"].conjugate is False
    assert "exp" in edges["a"].reason and "'a'" in edges["a"].reason
    assert edges["tau"].conjugate is True
    assert "site 'y'" in str(error) and "'a'" in str(error) and "exp" in str(error)
    assert "'tau'" not in str(error)


def test_half_cauchy_scale_verdicts():
    """A HalfCauchy scale gets a Gaussian q on log sigma: its prior has no exact site
    parameter, and neither has the likelihood's edge to sigma; the edge to mu is exact."""
    graph, errors = all_verdicts(half_cauchy_scale, Y_REAL)
    assert set(errors) == {"sigma", "y"}
    assert graph.factors["sigma"].edges["sigma"].conjugate is False
    assert "HalfCauchy" in graph.factors["sigma"].edges["sigma"].reason
    assert graph.factors["y"].edges["sigma"].conjugate is False
    assert graph.factors["y"].edges["mu"].conjugate is True
    assert graph.factors["mu"].edges["mu"].conjugate is True


def test_logistic_regression_prior_stays_conjugate():
    graph, errors = all_verdicts(logistic_regression, X, Y_BIN)
    assert set(errors) == {"y"}
    assert graph.factors["beta"].edges["beta"].conjugate is True
    assert graph.factors["y"].edges["beta"].conjugate is False


def test_trace_records_conjugacy_verdicts():
    fg = blrppl.trace(mixed_edges, Y_REAL)
    assert fg.factors["y"].edges["tau"].conjugate is True
    assert fg.factors["y"].edges["a"].conjugate is False


# ---------------------------------------------------------------------------
# At the symbolic level: analyse raises NonConjugate, never returns terms.

_Y = np.array([0.3, -1.2, 0.7])
_GAMMA = VarInfo("gamma", (), 0)
_GAUSS = VarInfo("gaussian", (), 0)

SYMBOLIC = {
    "sqrt_tau_scale": (lambda v: jnp.sum(C._normal(_Y, 0.0, v["tau"] ** 0.5)), {"tau": _GAMMA}, "tau"),
    "sqrt_tau_scale_jnp": (lambda v: jnp.sum(C._normal(_Y, 0.0, jnp.sqrt(v["tau"]))), {"tau": _GAMMA}, "tau"),
    "one_over_tau_scale": (lambda v: jnp.sum(C._normal(_Y, 0.0, 1 / v["tau"])), {"tau": _GAMMA}, "tau"),
    "exp_location": (lambda v: jnp.sum(C._normal(_Y, jnp.exp(v["a"]), 1.0)), {"a": _GAUSS}, "a"),
    "gaussian_as_scale": (lambda v: jnp.sum(C._normal(_Y, 0.0, v["s"])), {"s": _GAUSS}, "s"),
    "cubic_location": (lambda v: jnp.sum(C._normal(_Y, v["a"] ** 3, 1.0)), {"a": _GAUSS}, "a"),
    "log_rate_of_sum": (lambda v: jnp.sum(C._poisson(_Y**2, v["lam"] + 1.0)), {"lam": _GAMMA}, "lam"),
    "sigmoid_probs": (
        lambda v: jnp.sum(C._bernoulli_probs(jnp.array([1.0, 0.0, 1.0]), jax.nn.sigmoid(v["a"]))),
        {"a": _GAUSS},
        "a",
    ),
    "sqrt_variance_missing": (
        lambda v: jnp.sum(C._normal(_Y, 0.0, v["var"])),
        {"var": VarInfo("inverse_gamma", (), 0)},
        "var",
    ),
    "beta_squared": (
        lambda v: jnp.sum(C._bernoulli_probs(jnp.array([1.0, 0.0, 1.0]), v["p"] ** 2)),
        {"p": VarInfo("beta", (), 0)},
        "p",
    ),
    "categorical_as_number": (
        lambda v: jnp.sum(C._normal(_Y, 1.0 * v["z"], 1.0)),
        {"z": VarInfo("categorical", (3,), 1, 2)},
        "z",
    ),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC))
def test_analyse_refuses(name):
    log_factor, infos, var = SYMBOLIC[name]
    examples = {v: example(i) for v, i in infos.items()}
    with pytest.raises(NonConjugate) as info:
        analyse(log_factor, examples, infos)
    assert info.value.var == var
    assert isinstance(info.value.reason, str) and info.value.reason
