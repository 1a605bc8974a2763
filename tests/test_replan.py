"""Compile once, fit many: new data of the same shapes are planned by one compiled call.

The first plan records the data arithmetic of the symbolic analysis
(:mod:`blrppl.graph.tape`); later data of the same shapes are replanned by
replaying it (:mod:`blrppl.blr.replan`): the model is not traced, nothing is
compiled, and the plan equals the one the host would make. Data that would
change a decision of the first plan (a term dropped for a zero coefficient)
or fail validation are planned on the host, which says what is wrong.
"""

import dataclasses
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr.plan import make_plan
from blrppl.graph.data import split_model_data
from models import ZOO
from tests.test_data_as_arguments import _grouped_means

JOINT = functools.partial(blrppl.NonConjugateVI, blocks="all")

CASES = [
    ("normal_mean_precision", blrppl.VMP),
    ("eight_schools_noncentered", blrppl.NonConjugateVI),
    ("linear_regression", blrppl.VMP),
    ("beta_bernoulli", blrppl.ConjugateBayes),
    ("logistic_regression", blrppl.NonConjugateVI),  # a GLM's design matrix, replayed by its own code
    ("gaussian_mixture", blrppl.VMP),  # k-means starts on the observations
    ("hmm_markov", blrppl.VMP),  # a loop chain's k-means points, stacked over its steps
    ("hmm", blrppl.VMP),  # a scan: its symbolic analysis on the tape
    ("nile", blrppl.EM),  # point estimates whose initial values are constants
    ("hmm_enum", blrppl.VMP),  # a chain of states whose distribution is masked by the data (lengths)
    ("eight_schools_centered", JOINT),  # one joint block: block-hybrid analyses on the tape
]


def moved(kwargs, args, seed):
    """The data with float observations moved a little (binary ones flipped), same shapes."""
    rng = np.random.default_rng(seed)

    def move(leaf):
        array = np.asarray(leaf)
        if not np.issubdtype(array.dtype, np.floating):
            return leaf
        if set(np.unique(array)) <= {0.0, 1.0}:
            flip = rng.random(array.shape) < 0.3
            return jnp.asarray(np.where(flip, 1.0 - array, array), array.dtype)
        return jnp.asarray(array + 0.1 * (1.0 + np.std(array)) * rng.normal(size=array.shape), array.dtype)

    return jax.tree.map(move, (args, kwargs))


def counted(model):
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        return model(*args, **kwargs)

    wrapped.__name__ = getattr(model, "__name__", "model")
    return wrapped, calls


class Compiles:
    """Counts XLA compilations while active (JAX's monitoring events)."""

    def __init__(self):
        self.count = 0
        self.on = False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if self.on and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


COMPILES = Compiles()


@pytest.mark.parametrize("name, engine_cls", CASES, ids=[c[0] for c in CASES])
def test_replanned_arrays_equal_the_host_plan(name, engine_cls):
    entry = ZOO[name]
    args, kwargs = entry.data()
    engine = engine_cls(entry.model)
    first = engine.plan(*args, **kwargs)
    plain = make_plan(entry.model, args, kwargs, engine.config)
    assert first.signature == plain.signature  # recording the first plan changes nothing in it
    for a, b in zip(jax.tree.leaves(first.arrays), jax.tree.leaves(plain.arrays)):
        assert type(a) is type(b)
        np.testing.assert_array_equal(a, b)
    replanner = engine.replanner(*args, **kwargs)
    assert replanner is not None
    new_args, new_kwargs = moved(kwargs, args, 3)
    replanned = replanner.plan_for(split_model_data(new_args, new_kwargs))
    assert replanned is not None
    host = make_plan(entry.model, new_args, new_kwargs, engine.config)
    assert replanned.signature == host.signature
    for a, b in zip(jax.tree.leaves(replanned.arrays), jax.tree.leaves(host.arrays)):
        assert jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert replanned.graph.model_kwargs.keys() == new_kwargs.keys()
    for key in new_kwargs:
        assert replanned.graph.model_kwargs[key] is new_kwargs[key]
    # The replanned plan and graph are the reference ones with the new data, nothing else changed
    # (they are copied without dataclasses.replace), and the graph's data are the new data.
    for new, old in ((replanned, first), (replanned.graph, first.graph)):
        for field in dataclasses.fields(old):
            if field.name not in ("arrays", "graph", "model_args", "model_kwargs"):
                assert getattr(new, field.name) is getattr(old, field.name)
    assert all(a is b for a, b in zip(replanned.graph.data.arrays, split_model_data(new_args, new_kwargs).arrays))
    assert any(a is not b for a, b in zip(first.graph.data.arrays, replanned.graph.data.arrays))


SECOND_RUNS = [
    ("normal_mean_precision", blrppl.VMP),
    ("gaussian_mixture", blrppl.VMP),  # 4 restarts from k-means on the new observations
    ("logistic_regression", blrppl.NonConjugateVI),
    ("eight_schools_centered", JOINT),
]


@pytest.mark.parametrize("name, engine_cls", SECOND_RUNS, ids=[c[0] for c in SECOND_RUNS])
def test_a_second_run_neither_traces_the_model_nor_compiles(rng_key, name, engine_cls):
    entry = ZOO[name]
    args, kwargs = entry.data()
    model, calls = counted(entry.model)
    engine = engine_cls(model)
    engine.run(rng_key, 50, *args, progress_bar=False, tol=1e-8, **kwargs)
    new_args, new_kwargs = moved(kwargs, args, 1)
    calls["n"], COMPILES.count, COMPILES.on = 0, 0, True
    try:
        second = engine.run(rng_key, 50, *new_args, progress_bar=False, tol=1e-8, **new_kwargs)
    finally:
        COMPILES.on = False
    assert calls["n"] == 0, "the model was traced again"
    assert COMPILES.count == 0, "the second call compiled"
    # The same fit from the host's plan of the new data (the same engine: nothing compiles again).
    fresh = engine.fit(make_plan(entry.model, new_args, new_kwargs, engine.config), rng_key, 50, progress_bar=False, tol=1e-8)
    # A design matrix replayed by another compilation than the host's may differ in its last bit.
    np.testing.assert_allclose(second.elbo, fresh.elbo, rtol=1e-11)
    for a, b in zip(jax.tree.leaves(second.natural_params), jax.tree.leaves(fresh.natural_params)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def scale_from_the_data(y):
    """EM of a mean, its noise scale a point estimate that starts at the data's spread."""
    sigma = numpyro.param("sigma", jnp.std(y), constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_a_point_estimate_that_starts_from_the_data_is_planned_on_the_host(rng_key):
    rng = np.random.default_rng(4)
    y = jnp.asarray(rng.normal(1.0, 2.0, 30))
    engine = blrppl.EM(scale_from_the_data)
    engine.run(rng_key, 100, y, progress_bar=False, tol=1e-10)
    assert engine.replanner(y) is None  # a replayed plan would start sigma at the old data's spread
    new = 3.0 * y
    second = engine.run(rng_key, 100, new, progress_bar=False, tol=1e-10)
    fresh = blrppl.EM(scale_from_the_data).run(rng_key, 100, new, progress_bar=False, tol=1e-10)
    np.testing.assert_allclose(second.elbo, fresh.elbo, rtol=1e-12)
    np.testing.assert_allclose(second.params["sigma"], fresh.params["sigma"], rtol=1e-12)


def prior_centred_on_the_data(y=None):
    mu = numpyro.sample("mu", dist.Normal(jnp.mean(y), 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_a_continuous_latent_whose_prior_reads_the_data_is_planned_on_the_host(rng_key):
    # (A discrete chain whose distribution reads the data, hmm_enum's masks, is replanned: its
    # start reads no prior. A continuous latent's prior is read by its start and by diagnostics.)
    y = jnp.asarray(np.random.default_rng(5).normal(1.0, 1.0, 20))
    engine = blrppl.VMP(prior_centred_on_the_data)
    engine.run(rng_key, 50, y=y, progress_bar=False, tol=1e-10)
    assert engine.replanner(y=y) is None
    new = y + 5.0
    second = engine.run(rng_key, 50, y=new, progress_bar=False, tol=1e-10)
    fresh = blrppl.VMP(prior_centred_on_the_data).run(rng_key, 50, y=new, progress_bar=False, tol=1e-10)
    np.testing.assert_allclose(second.posterior["mu"].mean, fresh.posterior["mu"].mean, rtol=1e-12)
    np.testing.assert_allclose(second.posterior["mu"].mean, (jnp.mean(new) + jnp.sum(new)) / 21.0, rtol=1e-10)


def test_a_chain_masked_by_sequence_lengths_is_replanned_and_equals_a_fresh_fit(rng_key):
    entry = ZOO["hmm_enum"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    engine.run(rng_key, 100, *args, progress_bar=False, tol=1e-8, **kwargs)
    assert engine.replanner(*args, **kwargs) is not None
    rng = np.random.default_rng(6)
    y = np.asarray(kwargs["y"])
    new = dict(kwargs, y=jnp.asarray(np.where(rng.random(y.shape) < 0.2, 1.0 - y, y), y.dtype))
    assert engine.replanner(*args, **new).plan_for(split_model_data(args, new)) is not None
    second = engine.run(rng_key, 100, *args, progress_bar=False, tol=1e-8, **new)
    fresh = blrppl.VMP(entry.model).run(rng_key, 100, *args, progress_bar=False, tol=1e-8, **new)
    np.testing.assert_allclose(second.elbo, fresh.elbo, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(second.state.natural), jax.tree.leaves(fresh.state.natural)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def bernoulli_coin(y=None):
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(p), obs=y)


def test_data_that_change_the_plan_are_planned_on_the_host(rng_key):
    y = jnp.asarray([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    engine = blrppl.ConjugateBayes(bernoulli_coin)
    engine.run(rng_key, 1, y=y, progress_bar=False)
    replanner = engine.replanner(y=y)
    assert replanner is not None
    # Equal counts of ones and zeros: the symbolic analysis drops a term whose coefficient vanishes
    # where the first data kept it; a changed decision is a failed guard, and the host plans.
    for new in (jnp.zeros(6), jnp.ones(6), jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])):
        host = make_plan(bernoulli_coin, (), {"y": new}, engine.config)
        replanned = replanner.plan_for(split_model_data((), {"y": new}))
        if replanned is None:
            continue
        assert replanned.signature == host.signature
        for a, b in zip(jax.tree.leaves(replanned.arrays), jax.tree.leaves(host.arrays)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for new in (jnp.zeros(6), jnp.ones(6)):
        result = engine.run(rng_key, 1, y=new, progress_bar=False)
        expected = dist.Beta(2.0 + float(new.sum()), 2.0 + 6 - float(new.sum())).mean
        np.testing.assert_allclose(result.posterior["p"].mean, expected, rtol=1e-10)


def test_invalid_new_data_are_reported_as_on_the_first_call(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    engine.run(rng_key, 5, *args, progress_bar=False, **kwargs)
    y = np.asarray(kwargs["y"]).copy()
    y[3] = np.nan
    assert engine.replanner(*args, y=y).plan_for(split_model_data(args, {"y": y})) is None
    with pytest.raises(blrppl.ModelError, match="NaN"):
        engine.run(rng_key, 5, *args, progress_bar=False, y=y)
    coin = blrppl.ConjugateBayes(bernoulli_coin)
    coin.run(rng_key, 1, y=jnp.asarray([0.0, 1.0, 1.0]), progress_bar=False)
    with pytest.raises(blrppl.ModelError, match="outside the support"):
        coin.run(rng_key, 1, y=jnp.asarray([0.0, 2.0, 1.0]), progress_bar=False)


def test_a_batch_is_replanned_in_one_call_and_equals_single_fits(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    rng = np.random.default_rng(5)
    ys = np.stack([rng.normal(rng.normal(), 1.0 + rng.random(), size=np.shape(kwargs["y"])) for _ in range(5)])
    model, calls = counted(entry.model)
    blrppl.VMP(model).plan(*args, y=ys[0])
    one_plan, calls["n"] = calls["n"], 0
    engine = blrppl.VMP(model)
    batch = engine.run_batched(rng_key, 100, *args, tol=1e-10, y=ys)
    # Data set 0 is planned on the host (and its checks traced once more, vmapped), and the
    # linear-response check's program (blrppl.linear_response), where it applies, traces the model once for
    # every data set of the signature; the others are not traced.
    assert calls["n"] <= one_plan + 2, "every data set was traced"
    for i in (1, 3):
        alone = blrppl.VMP(entry.model).run(jax.random.fold_in(rng_key, i), 100, *args, tol=1e-10, progress_bar=False, y=ys[i])
        np.testing.assert_allclose(batch[i].elbo, alone.elbo, rtol=1e-12)
        np.testing.assert_allclose(batch[i].posterior["mu"].mean, alone.posterior["mu"].mean, rtol=1e-12)
        assert batch[i].plan.graph.model_kwargs["y"].shape == ys[i].shape
    ys[2, 0] = np.nan  # fails the compiled checks, so it is planned on the host, which reports it
    with pytest.raises(blrppl.ModelError, match="NaN"):
        engine.run_batched(rng_key, 100, *args, tol=1e-10, y=ys)


def test_a_process_that_ends_while_the_planner_compiles_exits_cleanly(tmp_path):
    # The compiled planner compiles in a thread; a daemon thread inside XLA at exit aborted the process.
    script = tmp_path / "plan_and_exit.py"
    script.write_text(
        "import jax\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "import blrppl\n"
        "from models import ZOO\n"
        "entry = ZOO['logistic_regression']\n"
        "args, kwargs = entry.data()\n"
        "assert blrppl.NonConjugateVI(entry.model).plan(*args, **kwargs) is not None\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("BLRPPL_COMPILATION_CACHE", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def random_intercepts(g, num_groups, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([num_groups]).to_event(1))
    with numpyro.plate("n", len(g)):
        numpyro.sample("y", dist.Normal(mu + a[g], 0.7), obs=y)


def dirichlet_categorical(n, x=None):
    p = numpyro.sample("p", dist.Dirichlet(jnp.array([1.0, 2.0, 3.0])))
    with numpyro.plate("n", n):
        numpyro.sample("x", dist.Categorical(probs=p), obs=x)


@pytest.mark.parametrize("engine_cls, n", [(blrppl.ConjugateBayes, 40), (blrppl.VMP, 40), (blrppl.ConjugateBayes, 8)])
def test_new_group_indices_of_the_same_shape_compile_nothing(rng_key, engine_cls, n):
    """A data array used as an index (``a[g]``) is data of the compiled fit, not its structure:
    bootstrap and cross-validation resample the groups (before: every new ``g`` compiled anew).
    Eight indices are at most eight evenly spaced runs, but too short to be a chain's steps."""
    rng = np.random.default_rng(3)
    gs = [rng.integers(0, 5, n) for _ in range(3)]
    ys = [rng.normal(size=n) + 0.3 * g for g in gs]
    engine = engine_cls(random_intercepts)
    engine.run(rng_key, 100, gs[0], 5, y=ys[0], progress_bar=False, tol=1e-10)
    for g, y in zip(gs[1:], ys[1:]):
        COMPILES.count, COMPILES.on = 0, True
        try:
            second = engine.run(rng_key, 100, g, 5, y=y, progress_bar=False, tol=1e-10)
        finally:
            COMPILES.on = False
        assert COMPILES.count == 0, "new group indices compiled"
        fresh = engine_cls(random_intercepts).run(rng_key, 100, g, 5, y=y, progress_bar=False, tol=1e-10)
        np.testing.assert_allclose(second.posterior["a"].mean, fresh.posterior["a"].mean, rtol=1e-10)
        np.testing.assert_allclose(second.posterior["a"].variance, fresh.posterior["a"].variance, rtol=1e-10)


def test_categorical_observations_are_data_of_one_compiled_fit(rng_key):
    """``Categorical(probs=p)`` observations read ``log p[x]``: new x of the same shape compile
    nothing, and a batch of them is one plan signature (SBC of 300 data sets took 300 s)."""
    xs = np.random.default_rng(4).integers(0, 3, size=(5, 15))
    exact = np.array([1.0, 2.0, 3.0]) + np.stack([np.bincount(x, minlength=3) for x in xs])
    engine = blrppl.ConjugateBayes(dirichlet_categorical)
    engine.run(rng_key, 5, 15, x=xs[0], progress_bar=False)
    COMPILES.count, COMPILES.on = 0, True
    try:
        second = engine.run(rng_key, 5, 15, x=xs[1], progress_bar=False)
    finally:
        COMPILES.on = False
    assert COMPILES.count == 0
    np.testing.assert_allclose(second.posterior["p"].mean, exact[1] / exact[1].sum(), rtol=1e-12)
    batch = engine.run_batched(rng_key, 5, 15, x=xs)
    assert len({member.plan.signature for member in batch}) == 1
    for member, alpha in zip(batch, exact):
        np.testing.assert_allclose(member.posterior["p"].mean, alpha / alpha.sum(), rtol=1e-12)


def test_a_batch_planned_on_the_host_runs_the_batched_fit_compiled_before(rng_key):
    """New group indices in every data set: the batched start and loop compile once. (Written when
    such data were planned on the host, whose stacked arrays must be typed as the compiled
    planner's batch; since the index data are on the tape they are replanned in one call.)"""
    from tests.compiles import compilations, compiled_names

    rng = np.random.default_rng(5)
    engine = blrppl.ConjugateBayes(random_intercepts)
    first = [rng.integers(0, 5, (4, 30)), rng.normal(size=(4, 30))]
    engine.run_batched(rng_key, 20, first[0], 5, y=first[1])
    with compilations() as messages:
        batch = engine.run_batched(rng_key, 20, rng.integers(0, 5, (4, 30)), 5, y=rng.normal(size=(4, 30)))
    names = compiled_names(messages)
    assert "jit(_run_chunks)" not in names and "jit(_init_many)" not in names, names
    assert not batch.failed.any()


def test_a_minibatch_model_in_a_batch_says_it_cannot_be_batched(rng_key):
    def subsampled(g, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        a = numpyro.sample("a", dist.Normal(0.0, 2.0).expand([5]).to_event(1))
        with numpyro.plate("n", 200, subsample_size=40) as idx:
            numpyro.sample("y", dist.Normal(mu + a[g[idx]], 0.7), obs=y[idx])

    rng = np.random.default_rng(0)
    g, y = jnp.asarray(rng.integers(0, 5, (3, 200))), jnp.asarray(rng.normal(size=(3, 200)))
    with pytest.raises(blrppl.ModelError, match="minibatch fits cannot be batched"):
        blrppl.SVI(subsampled, mode="local").run_batched(rng_key, 10, g, y=y)


def _resampled(args, kwargs, seed):
    """A bootstrap resample of the rows (every array whose first axis is the rows), same shapes."""
    n = len(np.asarray(kwargs["y"]))
    rows = np.random.default_rng(seed).integers(0, n, n)

    def take(leaf):
        return jnp.asarray(np.asarray(leaf)[rows]) if np.ndim(leaf) and np.shape(leaf)[0] == n else leaf

    return tuple(take(a) for a in args), {k: take(v) for k, v in kwargs.items()}


@pytest.mark.parametrize(
    "model, data, engine_cls",
    [
        ("radon", None, blrppl.NonConjugateVI),
        ("random_intercepts", None, blrppl.VMP),
        ("random_intercepts", None, blrppl.ConjugateBayes),
    ],
)
def test_bootstrap_resamples_of_group_indices_are_replanned_without_tracing(rng_key, model, data, engine_cls):
    """Resampled rows change the group index ``a[g]``: the positions it reads are on the tape
    (guarded by the decisions made from them, and by being in range), so a resample is replanned
    by the compiled planner: no trace of the model (it was planned on the host: radon 149 ms
    against 7 ms per refit), arrays equal to the host's plan, and the fit equals a fresh one."""
    if model == "radon":
        entry = ZOO["radon"]
        fn, (args, kwargs) = entry.model, entry.data()
    else:
        rng = np.random.default_rng(8)
        g = rng.integers(0, 6, 50)
        fn, args, kwargs = random_intercepts, (jnp.asarray(g), 6), {"y": jnp.asarray(rng.normal(size=50) + 0.4 * g)}
    counted_model, calls = counted(fn)
    engine = engine_cls(counted_model)
    engine.run(rng_key, 200, *args, progress_bar=False, tol=1e-10, **kwargs)
    replanner = engine.replanner(*args, **kwargs)
    for seed in (1, 2):
        new_args, new_kwargs = _resampled(args, kwargs, seed)
        replanned = replanner.plan_for(split_model_data(new_args, new_kwargs))
        assert replanned is not None, "a resample was planned on the host"
        host = make_plan(counted_model, new_args, new_kwargs, engine.config)
        assert replanned.signature == host.signature
        for a, b in zip(jax.tree.leaves(replanned.arrays), jax.tree.leaves(host.arrays)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        calls["n"] = 0
        second = engine.run(rng_key, 200, *new_args, progress_bar=False, tol=1e-10, **new_kwargs)
        assert calls["n"] == 0, "the model was traced again"
        fresh = engine_cls(fn).run(rng_key, 200, *new_args, progress_bar=False, tol=1e-10, **new_kwargs)
        for name, q in fresh.posterior.items():
            np.testing.assert_allclose(second.posterior[name].mean, q.mean, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(second.posterior[name].variance, q.variance, rtol=1e-9, atol=1e-12)


def matrix_rows(g, x, y=None):
    a = numpyro.sample("a", dist.Normal(jnp.zeros((5, 2)), 1.0).to_event(2))
    with numpyro.plate("n", g.shape[0]):
        numpyro.sample("y", dist.Normal(a[g, 0] + a[g, 1] * x, 0.5), obs=y)


@pytest.mark.parametrize("model", ["one_group_first", "matrix_columns"])
def test_a_batch_whose_first_index_is_static_equals_single_fits(rng_key, model):
    """An index the first plan reads as a constant (every row in one group; a matrix latent's
    fixed column) is static: its value, not a tape value, is in the compiled fit (a batch whose
    first member had one raised ``TypeError: Dual.reshape()`` inside the fit)."""
    rng = np.random.default_rng(11)
    g = rng.integers(0, 5, 40)
    gs = np.stack([np.zeros(40, int), g]) if model == "one_group_first" else np.stack([g, rng.integers(0, 5, 40)])
    ys = rng.normal(size=(2, 40)) + 0.3 * gs
    if model == "one_group_first":
        fn, extra = random_intercepts, (5,)
        batch = blrppl.ConjugateBayes(fn).run_batched(rng_key, 20, gs, 5, y=ys)
    else:
        fn, x = matrix_rows, rng.normal(size=40)
        extra = (jnp.asarray(x),)
        batch = blrppl.ConjugateBayes(fn).run_batched(rng_key, 20, gs, np.stack([x, x]), y=ys)
    assert not batch.failed.any()
    for i in range(2):
        single = blrppl.ConjugateBayes(fn).run(rng_key, 20, jnp.asarray(gs[i]), *extra, y=jnp.asarray(ys[i]), progress_bar=False)
        np.testing.assert_allclose(batch[i].posterior["a"].mean, single.posterior["a"].mean, rtol=1e-9, atol=1e-12)


def loop_with_group_indices(g, y=None):
    """A Python-loop chain whose every step reads a latent at that step's group indices."""
    num_series, num_steps = g.shape
    a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
    x = numpyro.sample("x_0", dist.Normal(0.0, 1.0).expand([num_series]).to_event(1))
    for t in range(num_steps):
        x = numpyro.sample(f"x_{t + 1}", dist.Normal(0.9 * x, 0.3).to_event(1))
        numpyro.sample(f"y_{t}", dist.Normal(x + a[g[:, t]], 0.5).to_event(1), obs=y[:, t])


def test_a_loop_chain_with_new_group_indices_per_step_is_replanned(rng_key):
    """The loop's steps are stacked into one term over the steps; their index arrays are stacked on
    the tape, not read (which guarded them whole: new indices were planned on the host, T = 40
    series steps 0.77 s per refit against 0.17 s)."""
    rng = np.random.default_rng(12)
    gs = [jnp.asarray(rng.integers(0, 4, (8, 6))) for _ in range(2)]
    y = jnp.asarray(rng.normal(size=(8, 6)))
    engine = blrppl.VMP(loop_with_group_indices)
    engine.run(rng_key, 100, gs[0], y=y, progress_bar=False, tol=1e-10)
    assert engine.replanner(gs[1], y=y).plan_for(split_model_data((gs[1],), {"y": y})) is not None
    second = engine.run(rng_key, 100, gs[1], y=y, progress_bar=False, tol=1e-10)
    fresh = blrppl.VMP(loop_with_group_indices).run(rng_key, 100, gs[1], y=y, progress_bar=False, tol=1e-10)
    np.testing.assert_allclose(second.posterior["a"].mean, fresh.posterior["a"].mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(second.posterior["a"].variance, fresh.posterior["a"].variance, rtol=1e-9)


def grouped_scales(group, y=None):
    """A hierarchy that counts its groups with numpy (``group`` must be concrete): a hybrid
    factor (the group means exact given their scale, the scale by quadrature)."""
    num_groups = len(np.unique(np.asarray(group)))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", num_groups):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
    with numpyro.plate("rows", len(y)):
        numpyro.sample("y", dist.Normal(theta[group], 1.0), obs=y)


@pytest.mark.parametrize("engine_cls", [blrppl.NonConjugateVI, blrppl.VMP], ids=["hybrid", "exact"])
def test_a_model_that_reads_an_index_array_as_values_is_replanned_while_that_array_is_unchanged(rng_key, engine_cls):
    """The index array is a constant of the plan (``Plan.held_data``): new observations are
    replanned by the compiled planner, which checks the held array; a new index array, of the
    same shape or with fewer groups, is planned on the host. Every fit equals a fresh one."""
    rng = np.random.default_rng(7)
    group = np.repeat(np.arange(6), 5)
    model = grouped_scales if engine_cls is blrppl.NonConjugateVI else _grouped_means  # every factor exact
    model, calls = counted(model)
    engine = engine_cls(model)
    engine.run(rng_key, 100, group, progress_bar=False, tol=1e-8, y=jnp.asarray(rng.normal(size=30)))
    assert engine.replanner(group, y=jnp.zeros(30)) is not None
    cases = {
        "new observations": (group, jnp.asarray(rng.normal(size=30)), True),
        "moved rows": (np.roll(group, 1), jnp.asarray(rng.normal(size=30)), False),
        "fewer groups": (np.minimum(group, 3), jnp.asarray(rng.normal(size=30)), False),
    }
    for name, (g, y, replanned) in cases.items():
        calls["n"], COMPILES.count, COMPILES.on = 0, 0, True
        try:
            result = engine.run(rng_key, 100, g, progress_bar=False, tol=1e-8, y=y)
        finally:
            COMPILES.on = False
        assert (calls["n"] == 0) == replanned, name
        if replanned:
            assert COMPILES.count == 0, name
        fresh = engine_cls(model).run(rng_key, 100, g, progress_bar=False, tol=1e-8, y=y)
        np.testing.assert_allclose(result.elbo, fresh.elbo, rtol=1e-11, err_msg=name)
        for v in fresh.posterior:
            np.testing.assert_allclose(result.posterior[v].mean, fresh.posterior[v].mean, rtol=1e-9, atol=1e-12, err_msg=name)


def test_numpy_data_changed_in_place_between_runs_are_new_data(rng_key):
    """The plan holds the user's own arrays: one changed in place must not be mistaken for the
    data the plan was made from (that returned the first fit again), observations or an index
    array the model reads as values alike."""
    rng = np.random.default_rng(8)
    group, y = np.repeat(np.arange(6), 5), rng.normal(size=30)
    engine = blrppl.VMP(_grouped_means)
    engine.run(rng_key, 100, group, y=y, progress_bar=False, tol=1e-8)
    for change in (lambda: y.__iadd__(3.0), lambda: np.copyto(group, np.minimum(group, 3))):
        change()
        result = engine.run(rng_key, 100, group, y=y, progress_bar=False, tol=1e-8)
        expected = np.bincount(group, weights=y) / (np.bincount(group) + 1.0)  # N(0, 1) prior, unit noise
        np.testing.assert_allclose(result.posterior["mu"].mean, expected, rtol=1e-9)
