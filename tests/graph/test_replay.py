"""replay: the model re-run at given values, a pure function of the arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.graph import ReplayedSite, replay
from models import ZOO


def _model(y):
    W = numpyro.sample("W", dist.Wishart(4.0, jnp.eye(2)))
    x = numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(2), precision_matrix=W))
    s = numpyro.param("s", 1.0, constraint=dist.constraints.positive)
    with numpyro.plate("N", 6, subsample_size=3) as idx:
        numpyro.sample("y", dist.Normal(x[0], s), obs=y[idx])
    numpyro.deterministic("x_sum", x.sum())


def test_replay_substitutes_latents_params_and_plate_indices():
    y = jnp.arange(6.0)
    fg = blrppl.trace(_model, y)
    values = {"W": 2.0 * jnp.eye(2), "x": jnp.array([0.5, -1.0])}

    @jax.jit
    def run(values, s, idx):
        sites = replay(fg, values, {"s": s}, {"N": idx}, deterministic=True)
        assert list(sites) == ["W", "x", "y", "x_sum"]
        assert all(isinstance(site, ReplayedSite) for site in sites.values())
        assert [site.type for site in sites.values()] == ["sample"] * 3 + ["deterministic"]
        assert not sites["x"].is_observed and sites["y"].is_observed
        assert sites["y"].plates == ("N",) and sites["y"].cond_indep_stack[0].name == "N"
        assert sites["y"].scale == 2.0 and sites["x_sum"].fn is None
        # The constructor call is the user's: precision_matrix, not its Cholesky factor.
        call = sites["x"].call
        assert call.cls is dist.MultivariateNormal and call.captured
        return (
            sites["x"].value,
            sites["y"].value,
            sites["y"].call.arguments["base_dist"].scale,
            call.arguments["precision_matrix"],
            sites["x_sum"].value,
        )

    x, y_batch, scale, precision, x_sum = run(values, 3.0, jnp.array([1, 3, 5]))
    np.testing.assert_allclose(x, values["x"])
    np.testing.assert_allclose(y_batch, [1.0, 3.0, 5.0])
    np.testing.assert_allclose(scale, 3.0)
    np.testing.assert_allclose(precision, values["W"])
    np.testing.assert_allclose(x_sum, -0.5)


def _normal_normal(y):
    z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def test_replay_is_pure_under_jit_and_grad():
    y = jnp.array([0.3, 1.1, 0.8])
    fg = blrppl.trace(_normal_normal, y)

    def log_joint(z):
        sites = replay(fg, {"z": z})
        return sum(s.fn.log_prob(s.value).sum() for s in sites.values())

    z = 0.4
    expected = dist.Normal(0.0, 1.0).log_prob(z) + dist.Normal(z, 0.5).log_prob(y).sum()
    np.testing.assert_allclose(jax.jit(log_joint)(z), expected, rtol=1e-12)
    np.testing.assert_allclose(
        jax.jit(jax.grad(log_joint))(z), -z + ((y - z) / 0.25).sum(), rtol=1e-12
    )
    assert len(jax.make_jaxpr(log_joint)(z).jaxpr.invars) == 1


def test_replay_splits_a_joined_chain():
    entry = ZOO["local_level_scan"]
    args, kwargs = entry.data()
    fg = blrppl.trace(entry.model, *args, **kwargs)
    chain = jnp.linspace(0.0, 1.0, 51)
    values = {"level": chain, "sigma_level": 0.5, "sigma_obs": 0.2}

    def level_log_prob(chain):
        sites = replay(fg, dict(values, level=chain))
        return (
            sites["level0"].fn.log_prob(sites["level0"].value)
            + sites["level"].fn.log_prob(sites["level"].value).sum()
        )

    sites = replay(fg, values)
    np.testing.assert_allclose(sites["level0"].value, 0.0)
    np.testing.assert_allclose(sites["level"].value, chain[1:])
    # The transition's loc is the previous state: level_{t-1}.
    np.testing.assert_allclose(sites["level"].fn.loc, chain[:-1])
    np.testing.assert_allclose(sites["y"].fn.loc, chain[1:])
    expected = (
        dist.Normal(0.0, 10.0).log_prob(0.0)
        + dist.Normal(chain[:-1], 0.5).log_prob(chain[1:]).sum()
    )
    np.testing.assert_allclose(jax.jit(level_log_prob)(chain), expected, rtol=1e-10)


def test_replay_of_a_discrete_chain():
    entry = ZOO["hmm"]
    args, kwargs = entry.data()
    fg = blrppl.trace(entry.model, *args, **kwargs)
    z = jnp.arange(61) % 2
    sites = replay(fg, {"z": z, "trans": jnp.full((2, 2), 0.5), "mu": jnp.zeros(2), "tau": jnp.ones(2)})
    assert int(sites["z0"].value) == 0
    np.testing.assert_array_equal(sites["z"].value, z[1:])


def _minibatch_glm(X, y, groups):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", X.shape[0], subsample_size=4) as idx:
        u = numpyro.sample("u", dist.Normal(0.0, 1.0 / jnp.sqrt(tau)))
        logits = X[idx] @ beta + u + jnp.take(groups, idx)
        numpyro.sample("y", dist.Bernoulli(logits=logits).mask(y[idx] >= 0), obs=jnp.maximum(y[idx], 0))
    numpyro.deterministic("norm", jnp.sum(beta**2))


@pytest.mark.filterwarnings("ignore:subsample_size does not match")  # all 10 rows, as SVI's plan reads them
def test_a_compiled_trace_is_the_eager_trace(monkeypatch):
    """run_model_compiled (SVI's all-rows trace: no eager copies of the data) gives run_model's trace."""
    import importlib

    from blrppl.graph.replay import run_model, run_model_compiled

    module = importlib.import_module("blrppl.graph.replay")
    traced = []

    def spy(model, model_args, *rest, **options):
        traced.append(isinstance(model_args[0], jax.core.Tracer))
        return run_model(model, model_args, *rest, **options)

    monkeypatch.setattr(module, "run_model", spy)

    rs = np.random.default_rng(0)
    args = (jnp.asarray(rs.normal(size=(10, 3))), jnp.asarray([1.0, 0.0, -1.0] * 3 + [1.0]), jnp.arange(10.0))
    data = {"N": jnp.arange(10)}
    eager = run_model(_minibatch_glm, args, {}, data, placeholders=True, validate=True)
    traced.clear()
    compiled = run_model_compiled(_minibatch_glm, args, {}, data, placeholders=True, validate=True)
    assert list(compiled.trace) == list(eager.trace) and compiled.user_fixed == eager.user_fixed
    for name, site in eager.trace.items():
        other = compiled.trace[name]
        assert other["type"] == site["type"] and type(other.get("fn")) is type(site.get("fn"))
        np.testing.assert_allclose(other["value"], site["value"], rtol=1e-12)
        if site["type"] == "sample":
            assert other["fn"].batch_shape == site["fn"].batch_shape
            for a, b in zip(jax.tree.leaves(other["fn"]), jax.tree.leaves(site["fn"])):
                np.testing.assert_allclose(a, b, rtol=1e-12)
    assert not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(compiled.trace))
    assert traced == [True], "the compiled trace fell back to the eager one"


def test_the_compiled_trace_holds_no_copy_of_the_data():
    """X[idx] at all N rows is skipped (it returns X), not gathered into a temporary of X's size."""
    import importlib

    from jax.extend import core as jex_core

    from blrppl.blr.plan import _full_data_model
    from blrppl.graph.nodes import Plate

    module = importlib.import_module("blrppl.graph.replay")
    X, y = jnp.ones((4000, 50)), jnp.zeros(4000)

    def logistic(X, y):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(50), 1.0).to_event(1))
        with numpyro.plate("N", X.shape[0], subsample_size=100) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])

    full = _full_data_model(logistic, Plate("N", 4000, 100, -1))

    def traced(X, y):
        trace = module.run_model(full, (X, y), {}, placeholders=True).trace
        return [leaf for leaf in jax.tree.leaves(trace) if isinstance(leaf, jax.core.Tracer)]

    closed = jax.make_jaxpr(traced)(X, y)
    plain = jax.jit(jex_core.jaxpr_as_fun(closed)).lower(X, y).compile().memory_analysis()
    lean = jax.jit(module._without_copies(closed)).lower(X, y).compile().memory_analysis()
    assert plain.temp_size_in_bytes >= X.nbytes  # the gathered copy
    assert lean.temp_size_in_bytes < X.nbytes / 10
    for a, b in zip(jax.jit(module._without_copies(closed))(X, y), jax.jit(jex_core.jaxpr_as_fun(closed))(X, y)):
        np.testing.assert_array_equal(a, b)


def test_svi_traces_large_data_compiled_and_plans_the_same(monkeypatch):
    import importlib

    plan_module = importlib.import_module("blrppl.blr.plan")
    trace_module = importlib.import_module("blrppl.graph.trace")
    rs = np.random.default_rng(1)
    args = (jnp.asarray(rs.normal(size=(40, 3))), jnp.asarray(rs.integers(0, 2, 40).astype(float)))

    def logistic(X, y):
        beta = numpyro.sample("beta", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
        with numpyro.plate("N", X.shape[0], subsample_size=8) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])

    eager = blrppl.SVI(logistic, estimator="auto").plan(*args)
    calls = []
    compiled = trace_module.run_model_compiled
    monkeypatch.setattr(trace_module, "run_model_compiled", lambda *a, **k: calls.append(1) or compiled(*a, **k))
    monkeypatch.setattr(plan_module, "COMPILED_TRACE_BYTES", 0)  # these data count as large
    large = blrppl.SVI(logistic, estimator="auto").plan(*args)
    assert calls == [1]
    assert [(e.factor, e.method) for e in large.estimators] == [(e.factor, e.method) for e in eager.estimators]
    for a, b in zip(jax.tree.leaves(large.arrays), jax.tree.leaves(eager.arrays)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_planning_lifts_no_host_value_with_a_compiled_program():
    """Placeholders, dependency examples and point estimates' starts are transferred, not staged:
    eager ``jnp.asarray`` of a host value compiles a ``stage`` program per shape and dtype."""
    from tests.compiles import compilations, compiled_names

    def model(y):
        with numpyro.plate("groups", 3, dim=-2), numpyro.plate("members", 17, dim=-1):
            theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        scale = numpyro.param("scale", 1.25, constraint=dist.constraints.positive)
        numpyro.sample("y", dist.Normal(theta, scale), obs=y)

    y = jnp.asarray(np.random.default_rng(0).normal(size=(3, 17)))
    with compilations() as compiled:
        blrppl.EM(model).plan(y)
    assert "jit(stage)" not in compiled_names(compiled)


def test_a_replay_for_some_sites_stops_after_the_last_of_them():
    """A prior's log density does not run the model's later code (its likelihood: dead code that
    tracing, lowering and the symbolic analysis would all pay for), even past a model's own
    ``except Exception``."""
    ran = []

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        try:
            ran.append("likelihood")
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        except Exception:  # noqa: BLE001 - a model's own handler must not swallow the stop
            ran.append("swallowed")
            raise

    fg = blrppl.trace(model, jnp.arange(3.0))
    ran.clear()
    sites = replay(fg, {"mu": jnp.asarray(0.3)}, sites=("mu",))
    assert list(sites) == ["mu"] and ran == []
    np.testing.assert_allclose(sites["mu"].fn.log_prob(0.3), dist.Normal(0.0, 1.0).log_prob(0.3))
    sites = replay(fg, {"mu": jnp.asarray(0.3)}, sites=("y",))
    assert list(sites) == ["mu", "y"] and ran == ["likelihood"]
    assert list(replay(fg, {"mu": jnp.asarray(0.3)})) == ["mu", "y"]  # no sites named: the whole model


def test_a_chain_of_concrete_site_values_is_joined_without_compiling():
    """Planning's examples of a chain (an initial state and a scan's stacked states) are
    joined in numpy: eagerly, each ``jnp`` operation compiled a program of its own."""
    from blrppl.graph.replay import join_chain, split_chain
    from tests.compiles import compilations

    entry = ZOO["hmm_sequences"]
    args, kwargs = entry.data()
    graph = blrppl.trace(entry.model, *args, **kwargs)
    node = next(n for n in graph.variables.values() if n.chain is not None)
    values = {site: np.asarray(graph.site_values[site]) for site in node.chain.sites}
    with compilations() as compiled:
        joined = join_chain(values, node.chain)
    assert compiled == [] and isinstance(joined, jax.Array)
    traced = jax.jit(lambda v: join_chain(v, node.chain))(values)  # and inside a trace, with jnp
    np.testing.assert_array_equal(joined, traced)
    for site, value in split_chain(joined, node.chain).items():
        np.testing.assert_array_equal(value, values[site])
