"""NonConjugateVI basics: estimator choice per factor, equivalences, a sane fit."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from models import ZOO


def test_conjugate_factors_keep_exact_site_parameters():
    entry = ZOO["radon"]
    args, kwargs = entry.data()
    plan = blrppl.NonConjugateVI(entry.model).plan(*args, **kwargs)
    methods = {e.factor: e.method for e in plan.estimators}
    assert methods["mu_alpha"] == methods["beta"] == "exact"
    assert methods["y"] == "mc" and methods["sigma_y"] == "mc"
    edges = plan.graph.factors["y"].edges
    assert edges["sigma_y"].conjugate is False and edges["alpha"].conjugate is True


def normal_normal(y):
    z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y)


def test_quadrature_and_delta_equal_the_exact_site_parameters_on_a_conjugate_factor(rng_key):
    y = jnp.array([0.3, 1.1, 0.8])
    exact = blrppl.ConjugateBayes(normal_normal).run(rng_key, 1, y, progress_bar=False)
    for method in ("quadrature", "delta"):
        result = blrppl.BLR(normal_normal, estimator={"y": method}).run(rng_key, 2, y, progress_bar=False)
        assert result.plan.estimators[-1].method == method
        for a, b in zip(jax.tree.leaves(result.natural_params), jax.tree.leaves(exact.natural_params)):
            np.testing.assert_allclose(a, b, rtol=1e-10)


def test_poisson_regression_with_quadrature_matches_monte_carlo(rng_key):
    entry = ZOO["poisson_regression"]
    args, kwargs = entry.data()
    quad = blrppl.NonConjugateVI(entry.model, estimator="delta", learning_rate=0.5).run(
        rng_key, 60, *args, progress_bar=False, **kwargs
    )
    mc = blrppl.NonConjugateVI(entry.model, estimator="mc", num_samples=32).run(
        rng_key, 400, *args, progress_bar=False, **kwargs
    )
    q_delta, q_mc = quad.posterior["beta"], mc.posterior["beta"]
    sd = np.sqrt(np.diag(np.asarray(q_mc.covariance_matrix)))
    # The delta method (Laplace-style) and Monte Carlo VI agree to a fraction of a posterior sd
    # on a well-identified GLM.
    assert np.all(np.abs(np.asarray(q_delta.mean) - np.asarray(q_mc.mean)) < 0.3 * sd)
    assert np.all(np.isfinite(mc.elbo))


def test_exact_only_engines_still_refuse_non_conjugate_factors(rng_key):
    entry = ZOO["logistic_regression"]
    args, kwargs = entry.data()
    try:
        blrppl.VMP(entry.model).run(rng_key, 2, *args, progress_bar=False, **kwargs)
    except blrppl.ModelError as error:
        assert "NonConjugateVI" in str(error)
    else:
        raise AssertionError("VMP accepted a non-conjugate factor")


def test_laplace_equals_newton_at_a_verified_map(rng_key):
    """Laplace = MAP (gradient ~ 0) with precision = -Hessian of the log joint there."""
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import potential_energy

    entry = ZOO["logistic_regression"]
    args, kwargs = entry.data()
    result = blrppl.Laplace(entry.model).run(rng_key, 40, *args, progress_bar=False, tol=1e-12, **kwargs)
    q = result.posterior["beta"]
    params = {"beta": jnp.asarray(q.mean)}
    flat, unravel = ravel_pytree(params)
    energy = lambda x: potential_energy(entry.model, args, kwargs, unravel(x))  # noqa: E731
    assert np.max(np.abs(jax.grad(energy)(flat))) < 1e-8
    np.testing.assert_allclose(np.linalg.inv(q.covariance_matrix), jax.hessian(energy)(flat), rtol=1e-8)


def test_blocks_keep_correlations_between_sites(rng_key):
    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()
    result = blrppl.NonConjugateVI(entry.model, blocks=[("mu", "tau", "theta_raw")], estimator="delta", learning_rate=0.5).run(
        rng_key, 30, *args, progress_bar=False, **kwargs
    )
    assert set(result.natural_params) == {"mu+tau+theta_raw"}
    assert set(result.posterior) == {"mu", "tau", "theta_raw"}
    draws = result.sample(rng_key, 50)
    assert draws["theta_raw"].shape == (50, 8) and draws["theta"].shape == (50, 8)
    assert np.all(np.asarray(draws["tau"]) > 0)
