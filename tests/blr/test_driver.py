"""The driver: one compiled loop, resumable, chunked for the progress bar."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.blr import driver, stopping


def model(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("N", 20):
        numpyro.sample("y", dist.StudentT(4.0, mu, s), obs=y)


Y = jnp.asarray(np.random.default_rng(0).standard_t(4.0, 20) * 0.7 + 0.3)


def test_two_runs_of_a_monte_carlo_fit_equal_one_longer_run(rng_key):
    """The state carries the run's random stream, its step counter and the average."""
    engine = blrppl.NonConjugateVI(model, estimator="mc", num_samples=4)
    whole = engine.run(rng_key, 40, y=Y, progress_bar=False)
    first = engine.run(rng_key, 20, y=Y, progress_bar=False)
    second = engine.run(jax.random.key(99), 20, y=Y, progress_bar=False, init_state=first.state)
    np.testing.assert_allclose(jnp.concatenate([first.elbo, second.elbo]), whole.elbo, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(second.state), jax.tree.leaves(whole.state)):
        np.testing.assert_array_equal(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a,
                                      jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key) else b)


def test_chunks_for_the_progress_bar_give_the_same_run(rng_key):
    engine = blrppl.NonConjugateVI(model, estimator="mc", num_samples=4)
    plan = engine.plan(y=Y)
    algorithm = engine.build(plan)
    _, one, _ = driver.run(algorithm, rng_key, 30, plan.arrays, progress_bar=False)
    _, chunked, _ = driver.run(algorithm, rng_key, 30, plan.arrays, progress_bar=True, num_updates=7)
    np.testing.assert_array_equal(one, chunked)


def test_restarts_are_the_plain_run_vmapped(rng_key):
    engine = blrppl.NonConjugateVI(model, estimator="mc", num_samples=4)
    plain = engine.run(rng_key, 15, y=Y, progress_bar=False)
    restarted = engine.run(rng_key, 15, y=Y, progress_bar=False, num_restarts=3)
    np.testing.assert_allclose(restarted.restarts.elbo[0, :15], plain.elbo, rtol=1e-10)


def test_a_tol_below_the_elbos_resolution_is_raised_to_it_and_said_so():
    from types import SimpleNamespace

    from blrppl.blr.stopping import count_hits, elbo_resolution

    def _hits(*args):  # no earlier step: the plain test alone
        return count_hits(*args, jnp.float32(jnp.nan))

    from blrppl.results import Convergence

    deterministic = SimpleNamespace(exact=False, noisy=False)
    info = SimpleNamespace(change=jnp.float32(0.0))
    elbo = jnp.float32(-1234.5)
    one_ulp_up = jnp.nextafter(elbo, jnp.float32(0.0))  # a float32 fit cycling between q's one rounding apart
    hits = jnp.zeros((), jnp.int32)
    assert int(_hits(deterministic, info, one_ulp_up, elbo, hits, jnp.float32(1e-8))) == 1
    assert int(_hits(deterministic, info, one_ulp_up, elbo, hits, jnp.float32(-1.0))) == 0  # no tol: never stops
    moved = jnp.float32(elbo * (1 - 1e-5))
    assert int(_hits(deterministic, info, moved, elbo, hits, jnp.float32(1e-8))) == 0
    # float64 keeps the tol asked for: 1e-8 is far above its resolution
    assert int(_hits(deterministic, info, jnp.float64(-1234.5 * (1 - 1e-7)), jnp.float64(-1234.5), hits, 1e-8)) == 0
    assert elbo_resolution(jnp.float32) == pytest.approx(8 * 1.1920929e-07)
    assert elbo_resolution(jnp.float32) < 1e-6  # the CLI's default tol stands
    record = Convergence.of(True, 1e-8, 13, False, elbo_dtype=jnp.float32)
    assert "raised" in record.reason and "float32" in record.reason
    assert "raised" not in Convergence.of(True, 1e-8, 13, False, elbo_dtype=jnp.float64).reason


def test_without_tol_a_run_takes_every_step_even_at_an_elbo_of_zero(rng_key):
    # |0 - 0| <= -1 * |0| held (the no-tol threshold is -1), so a fit whose ELBO is exactly 0
    # (Laplace on a prior alone: its evidence) stopped after two steps, reported as "no tol given".
    def prior_only():
        numpyro.sample("mu", dist.Normal(0.0, 1.0))

    result = blrppl.Laplace(prior_only).run(rng_key, 7, progress_bar=False)
    assert len(result.elbo) == 7 and np.all(result.elbo == 0.0)


def test_aitkens_remaining_gain_of_geometric_steps():
    change = jnp.asarray([0.5, 2.0, -0.1, 0.5, 1e-16, 0.3])
    last = jnp.asarray([1.0, 1.0, 1.0, -0.2, 1e-15, jnp.nan])
    left = np.asarray(stopping.remaining_gain(change, last, jnp.asarray(1e-15)))
    # r = 1/2: the steps to come sum to 0.5 (1/2 + 1/4 + ...); a growing step, a fall, a rise
    # after a fall, a change within the noise and a step without a history: no extrapolation.
    np.testing.assert_allclose(left, [0.5, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_tol_bounds_the_gain_left_where_steps_shrink_slowly():
    # EM on the Nile converges linearly at r = 0.95 a step: a step's change of tol left 19
    # times that to gain, and the variances stopped 13% from the maximum-likelihood values
    # at tol 1e-6 (1,282 against 1,467). The stop now waits for Aitken's extrapolated gain.
    from models import ZOO

    entry = ZOO["nile"]
    args, kwargs = entry.data()
    engine = blrppl.EM(entry.model)
    tol = 1e-6
    fit = engine.run(jax.random.key(0), 1000, *args, progress_bar=False, tol=tol, **kwargs)
    limit = engine.run(jax.random.key(0), 2000, *args, progress_bar=False, tol=1e-13, **kwargs)
    assert fit.converged and limit.converged
    final, best = float(fit.elbo[-1]), float(limit.elbo[-1])
    assert 0.0 <= best - final <= tol * abs(best)
    level = float(fit.state.params["level_var"]) / float(limit.state.params["level_var"])
    assert abs(level - 1.0) < 0.05
