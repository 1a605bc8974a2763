"""Data are arguments of the compiled fit: new data of the same shapes reuse it, correctly.

For models of every kind (conjugate, mixture with k-means starts, HMM and
Gaussian chains, batches of sequences, in-scan starts, EM point estimates,
hybrid and GLM factors), a second ``run``
of the same engine on perturbed data of the same shapes must give exactly what
a fresh engine gives on those data (no stale constant in the compiled
program), compile nothing (planned on the host or by the compiled planner),
and, where the plan's signature is unchanged, reuse the compiled algorithm.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpyro
import numpyro.distributions as dist

import blrppl
import blrppl.graph.data
from models import ZOO
from tests.compiles import compilations

CASES = [
    ("normal_mean_precision", blrppl.VMP, {}),
    ("gaussian_mixture", blrppl.VMP, {}),
    ("hmm", blrppl.VMP, {}),
    ("hmm_enum", blrppl.VMP, {}),
    ("local_level_in_scan", blrppl.VMP, {}),
    ("local_level_scan", blrppl.NonConjugateVI, {}),
    ("nile", blrppl.EM, {}),
    ("radon", blrppl.NonConjugateVI, {}),
    ("logistic_regression", blrppl.NonConjugateVI, {}),
    ("eight_schools_noncentered", blrppl.NonConjugateVI, {}),
    ("beta_bernoulli", blrppl.ConjugateBayes, {}),
    # Planned on the host at every call (np.unique of an argument); its joint block's transform
    # once digested differently at the second plan (blrppl.graph.data.content_digest): a recompile.
    ("ucbadmit", blrppl.NonConjugateVI, {"blocks": "all"}),
]
# Models whose new data are replanned by the compiled planner (blrppl.blr.replan), not on the host.
REPLANNED = {
    "normal_mean_precision", "eight_schools_noncentered", "beta_bernoulli", "gaussian_mixture", "hmm", "radon",
    "logistic_regression", "local_level_scan", "local_level_in_scan", "hmm_enum",
}


def perturb(tree, seed):
    """Float arrays moved by a little noise (same shapes and dtypes); the rest unchanged."""
    rng = np.random.default_rng(seed)

    def move(leaf):
        if isinstance(leaf, (np.ndarray, jax.Array)) and jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating):
            array = np.asarray(leaf)
            if set(np.unique(array)) <= {0.0, 1.0}:  # binary observations: flip a few
                flip = rng.random(array.shape) < 0.1
                return jnp.asarray(np.where(flip, 1.0 - array, array), array.dtype)
            return jnp.asarray(array + 0.05 * np.std(array) * rng.normal(size=array.shape), array.dtype)
        return leaf

    return jax.tree.map(move, tree)


def perturb_counts(tree, seed):
    """UCBadmit's data: each department's applications and admissions moved by a few (integers)."""
    rng = np.random.default_rng(seed)
    (dept, male, applications), kwargs = tree
    admitted = np.asarray(kwargs["y"]) + rng.integers(0, 5, size=applications.shape)
    applications = np.asarray(applications) + rng.integers(5, 10, size=applications.shape)
    return (dept, male, jnp.asarray(applications)), {"y": jnp.asarray(admitted)}


PERTURB = {"ucbadmit": perturb_counts}


@pytest.mark.parametrize("name, engine_cls, options", CASES, ids=[c[0] for c in CASES])
def test_second_run_on_new_data_equals_a_fresh_fit(name, engine_cls, options, rng_key):
    entry = ZOO[name]
    args, kwargs = entry.data()
    engine = engine_cls(entry.model, **options)
    engine.run(rng_key, 3, *args, progress_bar=False, **kwargs)
    new_args, new_kwargs = PERTURB.get(name, perturb)((args, kwargs), 1)
    with compilations() as messages:
        reused = engine.run(rng_key, 3, *new_args, progress_bar=False, **new_kwargs)
    assert messages == [], f"the second run compiled {messages}"
    if name in REPLANNED:
        assert engine.replanner(*new_args, **new_kwargs).plan_for(blrppl.graph.data.split_model_data(new_args, new_kwargs))
    fresh = engine_cls(entry.model, **options).run(rng_key, 3, *new_args, progress_bar=False, **new_kwargs)
    np.testing.assert_allclose(reused.elbo, fresh.elbo, rtol=1e-9, atol=1e-9)
    for a, b in zip(jax.tree.leaves(reused.natural_params), jax.tree.leaves(fresh.natural_params)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    if not reused.plan.data_static and not any(e.closed_data for e in reused.plan.estimators):
        signatures = {key[0] for key in engine._algorithms}
        assert len(signatures) == 1, "new data of the same shapes compiled a new algorithm"


def _grouped_means(group, y=None):
    """Group means where the model counts its groups with numpy: ``group`` must be concrete."""
    num_groups = len(np.unique(np.asarray(group)))
    with numpyro.plate("groups", num_groups):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", len(y)):
        numpyro.sample("y", dist.Normal(mu[group], 1.0), obs=y)


def _grouped_logistic(x, group, y=None):
    """A GLM factor (Gauss-Hermite on its linear predictor) whose plate size reads ``group``."""
    num_groups = int(np.max(np.asarray(group))) + 1
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
    with numpyro.plate("groups", num_groups):
        alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", len(y)):
        numpyro.sample("y", dist.Bernoulli(logits=alpha[group] + beta * x), obs=y)


def _grouped_beta_binomial(group, n, y=None):
    """A hybrid factor (p ~ Beta(a, b): exact in p, log B(a, b) added back) over counted groups."""
    num_groups = len(set(np.asarray(group).tolist()))
    a = numpyro.sample("a", dist.Exponential(0.1))
    b = numpyro.sample("b", dist.Exponential(0.1))
    with numpyro.plate("groups", num_groups):
        p = numpyro.sample("p", dist.Beta(a, b))
    with numpyro.plate("rows", len(y)):
        numpyro.sample("y", dist.Binomial(n, p[group]), obs=y)


def _held_cases():
    rng = np.random.default_rng(0)
    group, other_group = np.array([0, 0, 1, 1, 2, 2] * 5), np.array([0, 1, 1, 1, 2, 2] * 5)
    x = jnp.asarray(rng.normal(size=30))
    n = jnp.asarray(rng.integers(10, 30, size=30), float)
    return {
        "conjugate": (_grouped_means, blrppl.VMP, "mu", lambda g, k: ((g,), {"y": jnp.asarray(rng.normal(k, 1.0, 30))})),
        "glm": (_grouped_logistic, blrppl.NonConjugateVI, "alpha",
                lambda g, k: ((x, g), {"y": jnp.asarray(rng.random(30) < 0.3 + 0.2 * k, float)})),
        "hybrid": (_grouped_beta_binomial, blrppl.NonConjugateVI, "p",
                   lambda g, k: ((g, n), {"y": jnp.asarray(rng.binomial(np.asarray(n, int), 0.2 + 0.1 * k), float)})),
    }, group, other_group


@pytest.mark.parametrize("case", ["conjugate", "glm", "hybrid"])
def test_only_the_arrays_a_model_reads_as_values_are_constants_of_the_compiled_fit(case, rng_key):
    """An index array the model reads with numpy (``np.unique``, ``np.max``) is held as a constant of
    the compiled fit, keyed by its content; the other arrays stay arguments: new observations refit
    without compiling, a new index array compiles anew, and both equal fresh fits."""
    cases, group, other_group = _held_cases()
    model, engine_cls, site, make = cases[case]
    (args, kwargs), (new_args, new_kwargs), (moved_args, moved_kwargs) = make(group, 0), make(group, 1), make(other_group, 0)
    engine = engine_cls(model)
    first = engine.run(rng_key, 300, *args, progress_bar=False, tol=1e-10, **kwargs)
    assert first.plan.held_data == (next(i for i, a in enumerate(args) if a is group),)
    assert not first.plan.data_static and not any(e.closed_data for e in first.plan.estimators)
    with compilations() as messages:  # new observations: arguments of the same program
        reused = engine.run(rng_key, 300, *new_args, progress_bar=False, tol=1e-10, **new_kwargs)
    assert messages == []
    moved = engine.run(rng_key, 300, *moved_args, progress_bar=False, tol=1e-10, **moved_kwargs)  # a new program
    assert len({key[0] for key in engine._algorithms}) == 2
    for result, (a, k) in ((reused, (new_args, new_kwargs)), (moved, (moved_args, moved_kwargs))):
        fresh = engine_cls(model).run(rng_key, 300, *a, progress_bar=False, tol=1e-10, **k)
        np.testing.assert_allclose(result.elbo, fresh.elbo, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(result.posterior[site].mean, fresh.posterior[site].mean, rtol=1e-9, atol=1e-12)
    # Where the posterior is known: each group's mean is N(sum y_g / (n_g + 1), 1 / (n_g + 1)).
    if case == "conjugate":
        for result, g, obs in ((reused, group, new_kwargs["y"]), (moved, other_group, moved_kwargs["y"])):
            expected = np.bincount(g, weights=np.asarray(obs)) / (np.bincount(g) + 1.0)
            np.testing.assert_allclose(result.posterior["mu"].mean, expected, rtol=1e-9)
