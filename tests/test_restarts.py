"""num_restarts=C: C starts in one vmapped run, reported as C ArviZ chains."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from models import ZOO
from tests.compiles import cheap_jit


def two_means(y):
    """Two exchangeable components: every relabelling of a fit is another optimum."""
    with numpyro.plate("K", 2):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(jnp.array([0.5, 0.5])))
        numpyro.sample("y", dist.Normal(mu[z], 0.5), obs=y)


@pytest.fixture(scope="module")
def mixture_fit():
    rng = np.random.default_rng(1)
    y = jnp.asarray(np.concatenate([rng.normal(-2.0, 0.5, 20), rng.normal(2.0, 0.5, 20)]))
    return blrppl.VMP(two_means).run(jax.random.key(0), 30, y, progress_bar=False, num_restarts=6), y


def test_restarts_in_different_modes_give_large_rhat(mixture_fit):
    result, _ = mixture_fit
    assert result.num_restarts == 6 and result.restarts.elbo.shape == (6, 30)
    means = np.stack([np.asarray(result.restart(c).posterior["mu"].mean) for c in range(6)])
    labellings = {tuple(np.argsort(m)) for m in means}
    assert len(labellings) == 2  # both orders of the two clusters were found
    sorted_means = np.sort(means, axis=1)  # the same optimum up to relabelling
    np.testing.assert_allclose(sorted_means, np.broadcast_to(sorted_means[0], sorted_means.shape), atol=1e-6)
    idata = result.to_arviz(jax.random.key(1), 200, restarts="all")
    assert idata.posterior.sizes["chain"] == 6 and idata.posterior["mu"].dims == ("chain", "draw", "K")
    assert float(az.rhat(idata, var_names=["mu"])["mu"].max()) > 1.1


def test_by_default_only_restarts_at_the_best_optimum_are_chains(mixture_fit):
    """Relabelled optima (label switching) are equally good but not the same q: left out, not averaged."""
    result, _ = mixture_fit
    idata = result.to_arviz(jax.random.key(1), 200)
    assert 1 <= idata.posterior.sizes["chain"] < 6 and idata.attrs["restarts"] == "same"
    assert result.restarts.best in idata.posterior.coords["chain"].values
    assert float(az.rhat(idata, var_names=["mu"])["mu"].max()) < 1.05
    best = result.to_arviz(jax.random.key(1), 200, restarts="best")
    assert list(best.posterior.coords["chain"].values) == [result.restarts.best]


def test_the_result_is_the_best_restart_and_restart_zero_is_the_plain_run(mixture_fit):
    result, y = mixture_fit
    finals = np.asarray(result.restarts.elbo[:, -1])
    assert result.restarts.best == int(np.argmax(finals))
    np.testing.assert_array_equal(result.elbo, result.restarts.elbo[result.restarts.best])
    plain = blrppl.VMP(two_means).run(jax.random.key(0), 30, y, progress_bar=False)
    np.testing.assert_allclose(result.restarts.elbo[0], plain.elbo, rtol=1e-10)
    for a, b in zip(jax.tree.leaves(result.restart(0).state), jax.tree.leaves(plain.state)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):  # the run's random stream
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_a_restart_is_taken_by_index_and_a_missing_one_is_an_error(mixture_fit):
    result, _ = mixture_fit
    count = result.num_restarts
    last = result.restart(count - 1)
    for a, b in zip(jax.tree.leaves(result.restart(-1).state), jax.tree.leaves(last.state)):
        np.testing.assert_array_equal(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a,
                                      jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key) else b)
    steps = int(result.restarts.num_steps[count - 1])
    np.testing.assert_array_equal(last.elbo, result.restarts.elbo[count - 1, :steps])
    with pytest.raises(IndexError, match="does not exist"):  # JAX's indexing clamped it to the last restart
        result.restart(count)


def test_unimodal_model_gives_rhat_near_one(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(rng_key, 40, *args, progress_bar=False, num_restarts=4, **kwargs)
    first = np.asarray(result.restarts.elbo[:, 0])
    assert np.ptp(first) > 1e-3  # the restarts really started from different points
    idata = result.to_arviz(jax.random.key(1), 500)
    assert idata.posterior.sizes["chain"] == 4
    rhat = az.rhat(idata)
    assert float(max(rhat["mu"], rhat["tau"])) < 1.02


def test_tol_stops_each_restart_and_resuming_continues_all(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    result = engine.run(rng_key, 200, *args, progress_bar=True, num_restarts=3, tol=1e-9, **kwargs)
    steps = np.asarray(result.restarts.num_steps)
    assert np.all(steps < 200) and len(result.elbo) == steps[result.restarts.best]
    for c, n in enumerate(steps):
        assert np.all(np.isfinite(result.restarts.elbo[c, :n])) and np.all(np.isnan(result.restarts.elbo[c, n:]))
    resumed = engine.run(rng_key, 2, *args, progress_bar=False, num_restarts=3, init_state=result.restarts.state, **kwargs)
    assert np.all(np.asarray(resumed.restarts.state.step) == steps + 2)
    with pytest.raises(ValueError, match="restarts"):
        engine.run(rng_key, 2, *args, progress_bar=False, num_restarts=3, init_state=result.state, **kwargs)


def test_restart_points_of_gamma_based_families_have_q_s_mean_and_spread():
    """``restart_draw`` (log-normal, no rejection loop) matches q's mean and variance."""
    from blrppl.families import beta, dirichlet, gamma, inverse_gamma

    key = jax.random.key(3)
    n = 40_000
    cases = [
        (gamma.GAMMA, gamma.from_usual(jnp.asarray([0.7, 3.0]), jnp.asarray([2.0, 0.5]))),
        (inverse_gamma.INVERSE_GAMMA, inverse_gamma.from_usual(jnp.asarray([6.0]), jnp.asarray([2.0]))),
        (beta.BETA, beta.from_usual(jnp.asarray([2.0, 0.8]), jnp.asarray([5.0, 0.8]))),
        (dirichlet.DIRICHLET, dirichlet.from_usual(jnp.asarray([1.0, 2.0, 7.0]))),
    ]
    for family, natural in cases:  # each draw one program (eager, a Gamma sampler compiles op by op)
        draws = np.asarray(cheap_jit(family.restart_draw, static_argnums=2)(key, natural, (n,)))
        exact = np.asarray(cheap_jit(family.sample, static_argnums=2)(key, natural, (n,)))
        assert np.all(np.isfinite(draws)) and draws.shape == exact.shape
        np.testing.assert_allclose(draws.mean(0), exact.mean(0), rtol=0.05, err_msg=family.name)
        if family.name == "Gamma":  # matched variance (the others: their Gamma components')
            np.testing.assert_allclose(draws.var(0), exact.var(0), rtol=0.1, err_msg=family.name)


def test_the_start_computes_no_mean_a_prior_factor_does_not_read(rng_key):
    """Starting trans, mu and tau of an HMM reads their own means, not the chain's
    (a forward-backward per variable started)."""
    import dataclasses

    from blrppl.blr.starts import initial_natural

    entry = ZOO["hmm"]
    args, kwargs = entry.data()
    plan = blrppl.VMP(entry.model).plan(*args, **kwargs)

    def refused(_):
        raise AssertionError("the chain's mean parameters were computed")

    chain = next(v for v, q in plan.qs.items() if q.family.chain)
    qs = dict(plan.qs)
    qs[chain] = dataclasses.replace(qs[chain], family=qs[chain].family._replace(mean_params=refused))
    natural = initial_natural(rng_key, plan.graph, qs, plan.estimators, plan.arrays)
    assert set(natural) == set(plan.qs)


def test_restarts_at_one_optimum_pick_the_first_not_the_last_bit():
    """Final ELBOs within ``TIE`` (relative) are tied: the first restart is the best, whatever
    rounding made one of them highest (a batch and a single fit picked different ones)."""
    from types import SimpleNamespace

    from blrppl.blr.restarts import best_restart

    states = SimpleNamespace(natural={"mu": np.zeros((3, 2))})
    tied = np.asarray([[-10.0, -165.38000000001], [-10.0, -165.38], [-10.0, -165.381]])
    assert best_restart(states, tied, [2, 2, 2])[0] == 0
    apart = np.asarray([[-10.0, -165.3801], [-10.0, -165.38], [-10.0, -165.381]])
    assert best_restart(states, apart, [2, 2, 2])[0] == 1  # 1e-4 apart: the higher, as ever


def test_restarts_start_the_components_in_other_labellings_of_one_canonical_order(rng_key):
    """Where the components' priors differ (Stan's log_mix: mu ~ Normal((-2, 2), 1)), the
    labelling against them is a worse optimum that VB does not leave. k-means labels its
    clusters by their first coordinate and restarts relabel them (reverse, rotations), so the default
    restarts try both labellings whatever the key (random seeding alone put all four in the
    worse one for some keys), and the plain run starts in the canonical one."""
    entry = ZOO["log_mix"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    for seed in range(4):  # seed 1 put every restart in the worse labelling before
        result = engine.run(jax.random.key(seed), 100, *args, progress_bar=False, tol=1e-8, **kwargs)
        mu = np.asarray(result.posterior["mu"].mean)
        assert mu[0] < mu[1], (seed, mu)  # the labelling the priors expect
        steps = np.asarray(result.restarts.num_steps)
        finals = np.asarray([result.restarts.elbo[c, n - 1] for c, n in enumerate(steps)])
        assert float(result.elbo[-1]) == pytest.approx(-82.9077, abs=1e-3), seed
        assert np.ptp(finals) > 10.0 and any("optim" in f for f in result.flags)  # both labellings were tried
    plain = engine.run(rng_key, 100, *args, progress_bar=False, tol=1e-8, num_restarts=1, **kwargs)
    assert np.asarray(plain.posterior["mu"].mean)[0] < np.asarray(plain.posterior["mu"].mean)[1]


def test_restarts_from_a_newton_start_relabel_the_clusters_too():
    """A plain start that takes Newton steps (a non-conjugate scale) has restarts of its own
    random algorithm: they relabel the k-means clusters as well, so priors in the other order
    (mu ~ Normal((2, -2), 1)) are met by some restart whatever the key (before, every restart
    of key 2 ended in the labelling against them, 15 nats short, unflagged)."""

    def model(y):
        theta = numpyro.sample("theta", dist.Beta(2.0, 2.0))
        mu = numpyro.sample("mu", dist.Normal(jnp.array([2.0, -2.0]), 1.0).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        with numpyro.plate("N", y.shape[0]):
            z = numpyro.sample("z", dist.Categorical(jnp.stack([theta, 1 - theta])))
            numpyro.sample("y", dist.Normal(mu[z], sigma), obs=y)

    _, kwargs = ZOO["log_mix"].data()
    engine = blrppl.NonConjugateVI(model)
    assert engine.build(engine.plan(kwargs["y"])).finish is None  # the restarts' own random algorithm
    for seed in range(3):
        result = engine.run(jax.random.key(seed), 200, kwargs["y"], progress_bar=False, tol=1e-8)
        mu = np.asarray(result.posterior["mu"].mean)
        assert mu[0] > mu[1], (seed, mu)
        assert float(result.elbo[-1]) == pytest.approx(-84.985, abs=2e-3), seed


def test_a_restart_starts_the_components_in_the_reverse_order():
    """Three components with priors in descending order: no rotation of the ascending order
    is it, so odd restarts start from the reverse (before, the best of four restarts was the
    labelling (0.3, 4.2, -4.5), 17 nats short of (4.4, 0.1, -4.5))."""

    def model(y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
        mu = numpyro.sample("mu", dist.Normal(jnp.array([4.0, 0.0, -4.0]), 1.0).to_event(1))
        with numpyro.plate("N", y.shape[0]):
            z = numpyro.sample("z", dist.Categorical(w))
            numpyro.sample("y", dist.Normal(mu[z], 1.0), obs=y)

    rng = np.random.default_rng(5)
    y = np.concatenate([rng.normal(-4.5, 1, 15), rng.normal(0.5, 1, 20), rng.normal(4.5, 1, 25)])
    result = blrppl.VMP(model).run(jax.random.key(0), 300, y, progress_bar=False, tol=1e-8)
    mu = np.asarray(result.posterior["mu"].mean)
    assert mu[0] > mu[1] > mu[2], mu
    assert float(result.elbo[-1]) == pytest.approx(-152.76, abs=0.01)


def test_deterministic_restarts_a_fraction_of_a_nat_apart_are_several_optima():
    """The zoo's hmm_enum (VMP, exact site parameters), key 3: its four restarts ended at -384.242,
    -384.456, -384.456 and -385.144 (none at the -383.084 of keys 1 and 2) with no flag: the 1-nat
    slack is for Monte Carlo restarts, whose ELBOs are estimates."""
    from blrppl.blr.restarts import DETERMINISTIC_SLACK, NOISY_SLACK, disagreement

    ends = np.array([[-385.144], [-384.456], [-384.456], [-384.242]])
    assert disagreement(ends, [1] * 4, [True] * 4, NOISY_SLACK) == ()
    assert "different optima" in disagreement(ends, [1] * 4, [True] * 4, DETERMINISTIC_SLACK)[0]
    entry = ZOO["hmm_enum"]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(jax.random.key(3), 500, *args, progress_bar=False, tol=1e-8, **kwargs)
    finals = [float(result.restarts.elbo[c, n - 1]) for c, n in enumerate(np.asarray(result.restarts.num_steps))]
    assert max(finals) - min(finals) > DETERMINISTIC_SLACK
    assert any("different optima" in flag for flag in result.flags)
