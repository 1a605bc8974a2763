"""VMP: coordinate ascent with exact site parameters; the ELBO never decreases."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr import driver
from models import ZOO


def hierarchical_normal_gamma(group, num_groups, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 2.0))
    lam = numpyro.sample("lam", dist.Gamma(2.0, 2.0))
    with numpyro.plate("J", num_groups):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0 / jnp.sqrt(tau)))
    with numpyro.plate("N", group.shape[0]):
        numpyro.sample("y", dist.Normal(theta[group], 1.0 / jnp.sqrt(lam)), obs=y)


def hierarchical_data():
    rng = np.random.default_rng(11)
    group = rng.integers(0, 6, 60)
    theta = 1.0 + rng.normal(size=6)
    return jnp.asarray(group), 6, jnp.asarray(theta[group] + 0.5 * rng.normal(size=60))


def assert_non_decreasing(elbo):
    elbo = np.asarray(elbo)
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:])), np.diff(elbo).min()


def test_elbo_never_decreases_on_the_gaussian_mixture(rng_key):
    entry = ZOO["gaussian_mixture"]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(rng_key, 60, *args, progress_bar=False, **kwargs)
    assert_non_decreasing(result.elbo)
    # Started away from the symmetric point: the components separate.
    means = np.sort(np.asarray(result.posterior["mu"].mean))
    assert np.ptp(means) > 5.0


def test_elbo_never_decreases_on_a_hierarchical_normal_gamma_model(rng_key):
    group, num_groups, y = hierarchical_data()
    result = blrppl.VMP(hierarchical_normal_gamma).run(rng_key, 60, group, num_groups, y=y, progress_bar=False)
    assert_non_decreasing(result.elbo)
    assert result.elbo[-1] > result.elbo[0]


def mean_field_fixed_point(y, m0, s0, a0, b0, iterations=500):
    """Bishop (2006) Sec. 10.1.3 with independent priors, iterated in numpy."""
    n, e_tau = y.size, a0 / b0
    for _ in range(iterations):
        precision = 1.0 / s0**2 + n * e_tau
        m, v = (m0 / s0**2 + e_tau * y.sum()) / precision, 1.0 / precision
        a, b = a0 + n / 2.0, b0 + 0.5 * (np.sum((y - m) ** 2) + n * v)
        e_tau = a / b
    return m, v, a, b


def test_vmp_reaches_the_closed_form_mean_field_fixed_point(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    y = np.asarray(kwargs["y"])
    result = blrppl.VMP(entry.model).run(rng_key, 200, *args, progress_bar=False, **kwargs)
    m, v, a, b = mean_field_fixed_point(y, 0.0, 10.0, 1.0, 1.0)
    q_mu, q_tau = result.posterior["mu"], result.posterior["tau"]
    np.testing.assert_allclose(q_mu.loc, m, rtol=1e-9)
    np.testing.assert_allclose(q_mu.scale**2, v, rtol=1e-9)
    np.testing.assert_allclose(q_tau.concentration, a, rtol=1e-9)
    np.testing.assert_allclose(q_tau.rate, b, rtol=1e-9)
    stopped = blrppl.VMP(entry.model).run(rng_key, 200, *args, progress_bar=False, tol=1e-10, **kwargs)
    assert len(stopped.elbo) < 200  # tol stops the run early
    assert abs(float(stopped.elbo[-1] - stopped.elbo[-2])) < 1e-10


def test_vmp_equals_blr_with_unit_learning_rate(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    vmp = blrppl.VMP(entry.model).run(rng_key, 7, *args, progress_bar=False, **kwargs)
    blr = blrppl.BLR(entry.model, learning_rate=1.0).run(rng_key, 7, *args, progress_bar=False, **kwargs)
    np.testing.assert_allclose(vmp.elbo, blr.elbo, rtol=1e-12)


def test_resume_from_state_continues_the_run(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model)
    whole = engine.run(rng_key, 6, *args, progress_bar=False, **kwargs)
    first = engine.run(rng_key, 3, *args, progress_bar=False, **kwargs)
    rest = engine.run(rng_key, 3, *args, progress_bar=False, init_state=first.state, **kwargs)
    np.testing.assert_allclose(rest.elbo, whole.elbo[3:], rtol=1e-12)
    assert int(rest.state.step) == 6


def test_init_by_value_and_by_distribution(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    engine = blrppl.VMP(entry.model, init={"mu": 3.0, "tau": dist.Gamma(5.0, 2.0)})
    plan = engine.plan(*args, **kwargs)
    state = driver.init(engine.build(plan), rng_key, plan.arrays)
    mu = plan.qs["mu"].family.to_usual(state.natural["mu"])
    tau = plan.qs["tau"].family.to_usual(state.natural["tau"])
    np.testing.assert_allclose(mu["loc"], 3.0, rtol=1e-12)
    np.testing.assert_allclose([tau["concentration"], tau["rate"]], [5.0, 2.0], rtol=1e-12)
    # The fit from there reaches the same optimum as from the prior.
    a = engine.run(rng_key, 100, *args, progress_bar=False, **kwargs)
    b = blrppl.VMP(entry.model).run(rng_key, 100, *args, progress_bar=False, **kwargs)
    np.testing.assert_allclose(a.elbo[-1], b.elbo[-1], rtol=1e-10)
