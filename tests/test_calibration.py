"""Many data sets in one compiled fit, and simulation-based calibration on top of it.

``ConjugateBayes`` is the exact posterior on truly conjugate models, so the
ranks of the true parameters among draws from q are uniform (a chi-square
test at a fixed seed); the batched fit of each data set equals its own run.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

import blrppl
from blrppl.calibration import Calibration, simulation_based_calibration
from models import ZOO


def normal_known_variance(num_obs=10, *, y=None):
    mu = numpyro.sample("mu", dist.Normal(1.0, 2.0))
    with numpyro.plate("N", num_obs):
        numpyro.sample("y", dist.Normal(mu, 0.7), obs=y)


def ridge(X, *, y=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, 0.5), obs=y)


def test_a_batched_fit_equals_each_data_set_fitted_alone(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    rng = np.random.default_rng(0)
    ys = np.stack([np.asarray(kwargs["y"]) + rng.normal(size=np.shape(kwargs["y"])) for _ in range(6)])
    engine = blrppl.VMP(entry.model)
    batch = engine.run_batched(rng_key, 300, *args, tol=1e-10, y=ys)
    assert len(batch) == 6 and batch.elbo.shape[0] == 6
    for i in (0, 4):
        key = rng_key if i == 0 else jax.random.fold_in(rng_key, i)
        alone = engine.run(key, 300, *args, tol=1e-10, progress_bar=False, y=ys[i])
        np.testing.assert_allclose(batch[i].elbo, alone.elbo, rtol=1e-12)
        np.testing.assert_allclose(batch[i].posterior["mu"].mean, alone.posterior["mu"].mean, rtol=1e-12)
        assert bool(batch[i].converged) and int(batch.num_steps[i]) == len(alone.elbo)


def test_batches_need_a_common_leading_axis(rng_key):
    entry = ZOO["linear_regression"]
    (X,), kwargs = entry.data()
    y = np.stack([kwargs["y"]] * 3)
    # The message names each array argument with its shape.
    shapes = rf"argument 0 \({X.shape[0]}, {X.shape[1]}\), y \(3, {y.shape[1]}\)"
    with pytest.raises(blrppl.ModelError, match=f"leading batch axis.*{shapes}.*np.broadcast_to"):
        blrppl.VMP(entry.model).run_batched(rng_key, 5, X, y=y)


def test_shared_arguments_are_named_not_broadcast(rng_key):
    """shared=(...) names the arguments every data set shares (by position or keyword): the
    same fits as with those arrays broadcast by hand; a name that is no argument is an error."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(15, 3))
    ys = X @ rng.normal(size=(4, 3)).T + 0.5 * rng.normal(size=(15, 4))
    engine = blrppl.ConjugateBayes(ridge)
    by_hand = engine.run_batched(rng_key, 5, np.broadcast_to(X, (4,) + X.shape), y=ys.T)
    named = engine.run_batched(rng_key, 5, X, y=ys.T, shared=("X",))
    keyword = engine.run_batched(rng_key, 5, X=X, y=ys.T, shared="X")
    for batch in (named, keyword):
        assert len(batch) == 4
        for i in range(4):
            np.testing.assert_allclose(batch[i].posterior["beta"].mean, by_hand[i].posterior["beta"].mean, rtol=1e-12)
            np.testing.assert_allclose(batch[i].elbo, by_hand[i].elbo, rtol=1e-12)
    with pytest.raises(blrppl.ModelError, match="shared names 'Z'.*its arguments: X, y"):
        engine.run_batched(rng_key, 5, X, y=ys.T, shared=("Z",))
    with pytest.raises(blrppl.ModelError, match="leading batch axis.*shared="):  # nothing left to batch
        engine.run_batched(rng_key, 5, X, y=ys[:, 0], shared=("X", "y"))


def ridge_with_intercept(X, y=None):
    """Slopes under a MultivariateNormal prior and a separate intercept: one joint Gaussian block."""
    w = numpyro.sample("w", dist.MultivariateNormal(jnp.zeros(X.shape[1]), 2.0 * jnp.eye(X.shape[1])))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(X @ w + b, 0.5), obs=y)


@pytest.mark.parametrize(
    "model, args, kwargs, latents",
    [
        (ZOO["beta_bernoulli"].model, (20,), {}, {"p"}),
        (normal_known_variance, (), {"num_obs": 10}, {"mu"}),
        (ridge, (np.random.default_rng(1).normal(size=(15, 3)),), {}, {"beta"}),
        (ridge_with_intercept, (np.random.default_rng(1).normal(2.0, 1.0, size=(15, 3)),), {}, {"w", "b"}),
    ],
    ids=["beta_bernoulli", "normal_known_variance", "ridge", "ridge_with_intercept"],
)
def test_exact_posteriors_are_calibrated(model, args, kwargs, latents, rng_key):
    calibration = simulation_based_calibration(
        blrppl.ConjugateBayes(model), rng_key, 60, *args, observed=("y",), num_steps=5, **kwargs
    )
    assert set(calibration.ranks) == latents  # every latent, those of a joint block included
    for site, ranks in calibration.ranks.items():
        assert ranks.shape[0] == 60 and ranks.min() >= 0 and ranks.max() <= calibration.num_draws
    pvalues = calibration.chi_square()
    assert min(pvalues.values()) > 0.01, pvalues


def test_the_chi_square_test_detects_miscalibration():
    rng = np.random.default_rng(0)
    too_narrow = np.where(rng.random(200) < 0.5, rng.integers(0, 5, 200), rng.integers(95, 100, 200))
    uniform = rng.integers(0, 100, 200)
    p = Calibration({"narrow": too_narrow, "fine": uniform}, 99, None).chi_square()
    assert p["narrow"] < 1e-10 and p["fine"] > 0.01


def test_dependent_components_do_not_make_a_calibrated_site_look_miscalibrated():
    """A site whose components' ranks move together (correlated coefficients) is tested per
    component (Bonferroni): five copies of one column (p = 0.11 alone) give p = 5 x 0.11, where
    summing their statistics as independent gave 0.007."""
    column = np.repeat(np.arange(10) * 10, 20)  # 200 ranks, 20 per bin
    column[20:32] = 95  # 12 of bin 1's ranks in bin 9: chi-square 14.4 on 9 degrees of freedom
    p_alone = Calibration({"x": column}, 99, None).chi_square()["x"]
    p_copies = Calibration({"x": np.stack([column] * 5, axis=1)}, 99, None).chi_square()["x"]
    assert 0.01 < p_alone < 0.2 and p_copies == pytest.approx(min(1.0, 5 * p_alone))


def test_observed_maps_an_argument_to_a_site_of_another_name(rng_key):
    def model(num_obs=10, y=None):
        mu = numpyro.sample("mu", dist.Normal(1.0, 2.0))
        with numpyro.plate("N", num_obs):
            numpyro.sample("obs", dist.Normal(mu, 0.7), obs=y)

    calibration = simulation_based_calibration(
        blrppl.ConjugateBayes(model), rng_key, 20, observed={"y": "obs"}, num_steps=5, num_obs=10
    )
    assert set(calibration.ranks) == {"mu"} and calibration.ranks["mu"].shape == (20,)
    with pytest.raises(blrppl.ModelError, match="site 'y'.*observed=\\{'y': 'obs'\\}"):
        simulation_based_calibration(blrppl.ConjugateBayes(model), rng_key, 4, observed=("y",), num_obs=10)


def halfnormal_scale(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_a_failed_data_set_is_flagged_and_the_others_stand(rng_key):
    """A single run raises on identical observations under a HalfNormal scale (an improper
    posterior); in a batch only that member fails, flagged, and the others equal their own runs."""
    ys = np.random.default_rng(0).normal(2.0, 1.0, (3, 10))
    ys[1] = 2.0
    engine = blrppl.NonConjugateVI(halfnormal_scale)
    with pytest.raises(blrppl.ModelError, match="site 'sigma'.*improper"):
        engine.run(jax.random.fold_in(rng_key, 1), 200, y=jnp.asarray(ys[1]), progress_bar=False)
    batch = engine.run_batched(rng_key, 200, y=ys)
    assert batch.failed.tolist() == [False, True, False] and batch.flagged == (1,)
    assert "failed" in batch[1].flags[0] and "site 'sigma'" in batch[1].flags[0] and "improper" in batch[1].flags[0]
    alone = engine.run(rng_key, 200, y=jnp.asarray(ys[0]), progress_bar=False)
    np.testing.assert_allclose(batch[0].elbo, alone.elbo, rtol=1e-10)
    assert batch[0].flags == alone.flags == ()


def test_a_batched_member_carries_the_flags_of_its_own_run(rng_key):
    """EM on eight schools with tau a parameter: its MLE is on the boundary (tau = 0) for the
    original data, interior for three times the data (tests/engines/test_em_joint.py)."""
    from tests.engines.test_em_joint import Y, eight_schools

    engine = blrppl.EM(eight_schools)
    batch = engine.run_batched(rng_key, 200, y=np.stack([Y, 3.0 * Y]), tol=1e-13)
    assert not batch.failed.any() and batch.flagged == (0,)
    alone = engine.run(rng_key, 200, y=jnp.asarray(Y), progress_bar=False, tol=1e-13)
    assert batch[0].flags == alone.flags and "'tau'" in alone.flags[0] and "boundary" in alone.flags[0]


def test_calibration_leaves_failed_fits_out_of_the_ranks(rng_key, monkeypatch):
    engine = blrppl.ConjugateBayes(normal_known_variance)
    checks = engine.batch_member_flags
    calls = []

    def second_fails(*args, **kwargs):  # as if the second data set's fit had diverged
        calls.append(None)
        flags, failed = checks(*args, **kwargs)
        return (("this data set's fit failed: ...",), True) if len(calls) == 2 else (flags, failed)

    monkeypatch.setattr(engine, "batch_member_flags", second_fails)
    calibration = simulation_based_calibration(engine, rng_key, 6, observed=("y",), num_steps=5, num_obs=10)
    assert calibration.failed == (1,) and calibration.ranks["mu"].shape[0] == 5
    assert calibration.batch.failed.tolist() == [False, True, False, False, False, False]


def two_clusters(y=None):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(2)))
    with numpyro.plate("K", 2):
        locs = numpyro.sample("locs", dist.Normal(0.0, 5.0))
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(weights))
        numpyro.sample("y", dist.Normal(locs[z], 1.0), obs=y)


def test_batched_data_sets_restart_as_their_own_runs(rng_key, monkeypatch):
    """A mixture restarts by default (discrete latents): each data set's restarts in the batch are
    its own run's (same starts and keys), and so are the best restart and the flags."""
    rng = np.random.default_rng(3)
    ys = np.stack([np.concatenate([rng.normal(-2.0, 1.0, 12), rng.normal(2.5, 1.0, 12)]) for _ in range(3)])
    engine = blrppl.VMP(two_clusters)
    batch = engine.run_batched(rng_key, 100, y=ys, tol=1e-8)
    for i in (0, 2):
        alone = engine.run(jax.random.fold_in(rng_key, i) if i else rng_key, 100, y=ys[i], tol=1e-8, progress_bar=False)
        assert batch[i].num_restarts == alone.num_restarts == blrppl.engines.base.default_restarts(alone.plan) > 1
        assert batch[i].restarts.best == alone.restarts.best and batch[i].flags == alone.flags
        np.testing.assert_allclose(batch[i].restarts.elbo, alone.restarts.elbo, rtol=1e-9)
        np.testing.assert_allclose(batch[i].elbo, alone.elbo, rtol=1e-9)
        np.testing.assert_allclose(batch.elbo[i, : len(alone.elbo)], alone.elbo, rtol=1e-9)
    with pytest.raises(ValueError, match="num_restarts must be a positive integer"):
        engine.run_batched(rng_key, 100, y=ys, num_restarts=0)
    # A data set whose every restart diverged (a single run raises) fails alone.
    best_of, calls = engine.best_of_restarts, []

    def second_diverged(*args):
        calls.append(None)
        return None if len(calls) == 2 else best_of(*args)

    monkeypatch.setattr(engine, "best_of_restarts", second_diverged)
    again = engine.run_batched(rng_key, 100, y=ys, tol=1e-8)
    assert again.failed.tolist() == [False, True, False] and "every restart diverged" in again[1].flags[0]
    np.testing.assert_allclose(again[2].elbo, batch[2].elbo, rtol=1e-12)


def ridge_with_fit(X, *, y=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    numpyro.deterministic("fit", X @ beta)
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, 0.5), obs=y)


def test_the_data_sets_of_a_batch_share_their_compiled_draws(rng_key):
    """Draws (and a deterministic site that reads the data) compile once for all data sets
    of one plan signature, and equal draws compiled for the data set's own plan."""
    import blrppl.draws
    from tests.compiles import compilations

    rng = np.random.default_rng(2)
    Xs = rng.normal(size=(4, 12, 2))
    ys = np.einsum("bnd,d->bn", Xs, [0.5, -1.0]) + 0.5 * rng.normal(size=(4, 12))
    batch = blrppl.ConjugateBayes(ridge_with_fit).run_batched(rng_key, 5, Xs, y=ys)
    batch[0].sample(jax.random.key(1), 50)
    with compilations() as messages:
        shared = batch[3].sample(jax.random.key(1), 50)
    assert messages == []
    blrppl.draws._COMPILED.clear()
    own = batch[3].sample(jax.random.key(1), 50)  # compiled for data set 3's own plan
    np.testing.assert_allclose(shared["fit"], own["fit"], rtol=1e-12)
    np.testing.assert_allclose(shared["fit"], np.einsum("nd,sd->sn", Xs[3], shared["beta"]), rtol=1e-10)


FLOAT32_IMPROPER = """
import json, jax, numpy as np, blrppl
from tests.test_calibration import halfnormal_scale
ys = np.random.default_rng(0).normal(2.0, 1.0, (3, 10)).astype(np.float32)
ys[1] = 2.0
batch = blrppl.NonConjugateVI(halfnormal_scale).run_batched(jax.random.key(0), 200, y=ys)
print(json.dumps({"flagged": list(batch.flagged), "flags": list(batch[1].flags), "dtype": str(batch[0].elbo.dtype)}))
"""


def test_a_collapsed_member_is_flagged_in_float32():
    """In float32 the collapsing scale's fit can end with a flat, finite ELBO (every step rejected):
    the q centred at the boundary is flagged all the same."""
    from tests.float32 import run_in_float32

    out = json.loads(run_in_float32(FLOAT32_IMPROPER).strip().splitlines()[-1])
    assert out["dtype"] == "float32" and 1 in out["flagged"] and 0 not in out["flagged"]
    assert any("'sigma'" in f and ("boundary" in f or "improper" in f) for f in out["flags"])


def _local_level(num_steps, y=None):
    x0 = numpyro.sample("x0", dist.Normal(0.0, 3.0))

    def step(previous, y_t):
        x = numpyro.sample("x", dist.Normal(previous, 0.5))
        numpyro.sample("y", dist.Normal(x, 0.8), obs=y_t)
        return x, None

    scan(step, x0, y, length=num_steps)


def test_a_latent_that_q_holds_in_a_chain_is_ranked_too(rng_key):
    """A scan's initial state ``x0`` is part of the chain's q (``posterior`` has only ``x``): its
    draws come from q's samples, and its ranks are calibrated with the rest (before: left out)."""
    calibration = simulation_based_calibration(blrppl.ConjugateBayes(_local_level), rng_key, 100, 12, observed=("y",))
    assert sorted(calibration.ranks) == ["x", "x0"] and calibration.unranked == ()
    assert calibration.ranks["x0"].shape == (100,)
    assert min(calibration.chi_square().values()) > 1e-3


def _counts(n, y=None):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", n):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


@pytest.mark.parametrize("call, message", [
    (lambda e, k: simulation_based_calibration(e, k, 10, 5, observed=("z",)), "does not take"),
    (lambda e, k: simulation_based_calibration(e, k, 10, 5, None, observed=("y",)), "also given by position"),
    (lambda e, k: simulation_based_calibration(e, k, 10, 5, observed=("y",), extra=1), "could not be called"),
])
def test_misused_arguments_are_model_errors(rng_key, call, message):
    with pytest.raises(blrppl.ModelError, match=message):
        call(blrppl.ConjugateBayes(_counts), rng_key)
    with pytest.raises(ValueError, match="positive integer"):
        simulation_based_calibration(blrppl.ConjugateBayes(_counts), rng_key, 0, 5, observed=("y",))
