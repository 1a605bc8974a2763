"""EM's E-step is exact jointly: its bound is the log likelihood, its estimate the MLE.

Eight schools with ``tau`` a ``numpyro.param``: mean-field over (mu, theta)
would leave the bound below the likelihood and bias tau; the joint Gaussian
block makes the E-step exact. On the original data the MLE is tau = 0, on the
boundary of the support: the result flags it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import scipy.optimize as so
import scipy.stats as ss

import blrppl

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(y=None):
    tau = numpyro.param("tau", 5.0, constraint=dist.constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("J", 8):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, SIGMA), obs=y)


def log_likelihood(tau, y):
    """log p(y | tau) in closed form: y ~ N(0, diag(sigma^2 + tau^2) + 25 11^T)."""
    return ss.multivariate_normal(np.zeros(8), np.diag(SIGMA**2 + tau**2) + 25.0).logpdf(y)


def test_bound_is_the_log_likelihood_and_tau_the_mle_when_it_is_interior(rng_key):
    y = 3.0 * Y  # the marginal likelihood then peaks away from 0
    best = so.minimize_scalar(lambda t: -log_likelihood(t, y), bounds=(1e-6, 300.0), method="bounded", options={"xatol": 1e-10})
    assert best.x > 10.0
    result = blrppl.EM(eight_schools).run(rng_key, 500, y=jnp.asarray(y), progress_bar=False, tol=1e-13)
    assert result.converged
    tau = float(result.params["tau"])
    np.testing.assert_allclose(tau, best.x, rtol=1e-4)
    np.testing.assert_allclose(result.elbo[-1], log_likelihood(tau, y), rtol=1e-8)
    assert result.flags == ()
    assert set(result.estimators.values()) == {"exact"} and "mu+theta" in result.plan.qs


def test_a_boundary_mle_is_flagged(rng_key):
    result = blrppl.EM(eight_schools).run(rng_key, 200, y=jnp.asarray(Y), progress_bar=False, tol=1e-13)
    assert len(result.flags) == 1 and "'tau'" in result.flags[0] and "boundary" in result.flags[0]


def test_the_boundary_check_is_one_compiled_call_of_exact_e_steps(rng_key):
    """With tau fixed, q on the joint (mu, theta) block is the exact posterior after one E-step,
    so the check's E-steps stop there; its trials run in one program, compiled once."""
    from tests.compiles import compilations, compiled_names

    engine = blrppl.EM(eight_schools)
    with compilations() as first:
        result = engine.run(rng_key, 200, y=jnp.asarray(Y), progress_bar=False, tol=1e-13)
    assert compiled_names(first).count("jit(bounds)") == 1
    assert engine.build(result.plan, fixed_params=True).exact and not engine.build(result.plan).exact
    with compilations() as second:
        again = engine.run(rng_key, 200, y=jnp.asarray(Y + 1.0), progress_bar=False, tol=1e-13)
    assert second == [] and len(again.flags) == 1 and "'tau'" in again.flags[0]
