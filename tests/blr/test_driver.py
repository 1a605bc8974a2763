"""The driver: one compiled loop, resumable, chunked for the progress bar."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr import driver


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
