"""Missing data: masked observations (NaN or any value there) equal deleting them.

``.mask(m)`` drops the masked log densities; numpyro's ``obs_mask=`` makes the
missing entries a latent site, which blrppl integrates out (it informs no
other variable and leaves the ELBO alone). Both must give the posterior, and
the ELBO, of the fit without those observations, whatever the masked entries
hold (NaN included), in every engine.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from models import nile

RNG = np.random.default_rng(0)
X = RNG.normal(size=(30, 2))
Y = X @ np.array([1.0, -2.0]) + 0.5 * RNG.normal(size=30)
MISSING = RNG.random(30) < 0.3


def regression(X, y=None, mask=None, obs_mask=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", X.shape[0]):
        d = dist.Normal(X @ beta, 1.0 / jnp.sqrt(tau))
        numpyro.sample("y", d if mask is None else d.mask(mask), obs=y, obs_mask=obs_mask)


def assert_same(a, b, sites, rtol=1e-8):
    for site in sites:
        np.testing.assert_allclose(a.posterior[site].mean, b.posterior[site].mean, rtol=rtol, atol=1e-10)
        np.testing.assert_allclose(a.posterior[site].variance, b.posterior[site].variance, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(a.elbo[-1], b.elbo[-1], rtol=rtol)


@pytest.mark.parametrize("how", ["mask", "obs_mask"])
@pytest.mark.parametrize("engine", [blrppl.VMP, blrppl.NonConjugateVI])
def test_masked_regression_equals_deletion(how, engine, rng_key):
    y = np.where(MISSING, np.nan, Y)
    deleted = engine(regression).run(rng_key, 200, X[~MISSING], y=Y[~MISSING], progress_bar=False, tol=1e-12)
    masked = engine(regression).run(rng_key, 200, X, y=y, progress_bar=False, tol=1e-12, **{how: ~MISSING})
    assert_same(masked, deleted, ["beta", "tau"])


def test_masked_local_level_is_the_smoother_without_those_observations():
    """A Kalman smoother skips masked time points: the chain's posterior is dense conditioning on the rest."""
    y = np.asarray(nile.FLOW[:40], float)
    keep = np.ones(40, bool)
    keep[[5, 6, 20]] = False
    fit = blrppl.ConjugateBayes(nile.model).run(
        jax.random.key(0), 1, y=jnp.asarray(np.where(keep, y, np.nan)), mask=jnp.asarray(keep),
        obs_var=15099.0, level_var=1469.1, progress_bar=False,
    )
    # Dense conditioning: states x_0..x_40 a random walk from x_0 ~ N(1000, 1000^2);
    # y_t ~ N(x_t, obs_var) for the kept t = 1..40.
    steps = np.arange(41)
    cov = nile.INITIAL_SD**2 + 1469.1 * np.minimum.outer(steps, steps)
    obs = 1 + np.flatnonzero(keep)
    gain = cov[:, obs] @ np.linalg.inv(cov[np.ix_(obs, obs)] + 15099.0 * np.eye(len(obs)))
    mean = nile.INITIAL_MEAN + gain @ (y[keep] - nile.INITIAL_MEAN)
    np.testing.assert_allclose(np.asarray(fit.posterior["level"].mean), mean, rtol=1e-8)


def mixture(y=None, mask=None, obs_mask=None):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(3)))
    with numpyro.plate("K", 3):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(weights))
        d = dist.Normal(mu[z], 1.0 / jnp.sqrt(tau[z]))
        numpyro.sample("y", d if mask is None else d.mask(mask), obs=y, obs_mask=obs_mask)


@pytest.mark.parametrize("how", ["mask", "obs_mask"])
def test_masked_mixture_equals_deletion(how, rng_key):
    """The assignments of masked rows are integrated out (blrppl.blr.orphans), not fitted by mean-field."""
    from models import gaussian_mixture

    _, kwargs = gaussian_mixture.data()
    y = np.asarray(kwargs["y"])
    keep = np.arange(len(y)) % 4 != 0
    engine = blrppl.VMP(mixture)
    deleted = engine.run(rng_key, 500, y=y[keep], progress_bar=False, tol=1e-12, num_restarts=1)
    masked = engine.run(
        rng_key, 500, y=np.where(keep, y, np.nan), progress_bar=False, tol=1e-12, num_restarts=1, **{how: keep}
    )
    assert set(masked.plan.orphans) == {"z"}
    order = np.argsort(np.asarray(masked.posterior["mu"].mean))  # the same optimum, perhaps relabelled
    reference = np.argsort(np.asarray(deleted.posterior["mu"].mean))
    for site in ("mu", "tau"):
        np.testing.assert_allclose(
            np.asarray(masked.posterior[site].mean)[order], np.asarray(deleted.posterior[site].mean)[reference], rtol=1e-7
        )
    np.testing.assert_allclose(masked.elbo[-1], deleted.elbo[-1], rtol=1e-9)
    # A masked row's assignment is the prior given q(weights): exp(E[log w]) normalised.
    probs = np.asarray(masked.posterior["z"].probs)[~keep]
    np.testing.assert_allclose(probs, np.broadcast_to(probs[0], probs.shape), rtol=1e-10)
