"""result.save / engine.load: a plain .npz of the fit's arrays, no pickle."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints

import blrppl
from models import ZOO


def assert_same_tree(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(leaves_a, leaves_b):
        assert jnp.asarray(x).dtype == jnp.asarray(y).dtype
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # the run's random stream
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("mode", ["global", "local"])
def test_round_trip_gives_the_same_fit_and_resumes(tmp_path, rng_key, mode):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model, mode=mode)
    result = engine.run(rng_key, 5, *args, progress_bar=False, **kwargs)
    path = result.save(tmp_path / "fit")
    assert path.endswith(".npz")
    with np.load(path, allow_pickle=False) as arrays:  # plain arrays only
        assert all(arrays[k].dtype != object for k in arrays.files)
    loaded = engine.load(path, *args, **kwargs)
    assert_same_tree(loaded.state, result.state)
    np.testing.assert_array_equal(loaded.elbo, result.elbo)
    for site in ("mu", "tau"):
        np.testing.assert_array_equal(loaded.posterior[site].mean, result.posterior[site].mean)
    assert loaded.mode == mode and set(loaded.site_params) == set(result.site_params)
    more = engine.run(rng_key, 3, *args, progress_bar=False, init_state=result.state, **kwargs)
    more_loaded = engine.run(rng_key, 3, *args, progress_bar=False, init_state=loaded.state, **kwargs)
    np.testing.assert_array_equal(more_loaded.elbo, more.elbo)
    assert int(more_loaded.state.step) == 8


def mixture(y):
    mu = numpyro.param("mu", jnp.array([-1.0, 1.0]))
    sigma = numpyro.param("sigma", jnp.ones(2), constraint=constraints.positive)
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(jnp.array([0.5, 0.5])))
        numpyro.sample("y", dist.Normal(mu[z], sigma[z]), obs=y)


def test_point_estimates_and_restarts_round_trip(tmp_path, rng_key):
    y = jnp.asarray(np.concatenate([np.linspace(-3, -1, 10), np.linspace(1, 3, 10)]))
    engine = blrppl.EM(mixture)
    result = engine.run(rng_key, 10, y, progress_bar=False, num_restarts=2)
    loaded = blrppl.load(result.save(str(tmp_path / "em.npz")), engine, y)
    for name in ("mu", "sigma"):
        np.testing.assert_array_equal(loaded.params[name], result.params[name])
    assert_same_tree(loaded.restarts.state, result.restarts.state)
    np.testing.assert_array_equal(loaded.restarts.elbo, result.restarts.elbo)
    assert loaded.restarts.best == result.restarts.best
    np.testing.assert_array_equal(loaded.restart(1).elbo, result.restart(1).elbo)


def test_loading_with_other_data_or_a_foreign_file_is_a_clear_error(tmp_path, rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    path = engine.run(rng_key, 2, *args, progress_bar=False, **kwargs).save(tmp_path / "fit.npz")
    with pytest.raises(blrppl.ModelError, match="mode 'global'"):
        blrppl.VMP(entry.model, mode="local").load(path, *args, **kwargs)
    other = ZOO["linear_regression"]
    other_args, other_kwargs = other.data()
    with pytest.raises(blrppl.ModelError, match="does not match|differ from the data"):
        blrppl.VMP(other.model).load(path, *other_args, **other_kwargs)
    np.savez(tmp_path / "foreign.npz", x=np.zeros(3))
    with pytest.raises(blrppl.ModelError, match="not a blrppl result"):
        engine.load(tmp_path / "foreign.npz", *args, **kwargs)
