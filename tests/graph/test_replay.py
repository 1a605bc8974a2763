"""replay: the model re-run at given values, a pure function of the arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

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
