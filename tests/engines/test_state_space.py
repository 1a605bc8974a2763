"""Gaussian state-space models: the chain Gaussian q makes the BLR a Kalman smoother.

References, all in numpy float64: a textbook Kalman filter and RTS smoother
(Durbin & Koopman 2012, Ch. 4), dense Gaussian conditioning over every state at
once, and scipy's maximisation of the Kalman log likelihood.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
import scipy.optimize
from scipy.stats import multivariate_normal

import blrppl
from models import linear_gaussian_ssm, local_linear_trend, nile

# Durbin & Koopman (2012), Sec. 2.10: the diffuse maximum-likelihood estimates of
# the Nile local level (statsmodels' UnobservedComponents('local level') gets the
# same; statsmodels is not a test dependency).
PUBLISHED_OBS_VAR, PUBLISHED_LEVEL_VAR = 15099.0, 1469.1

Y = np.asarray(nile.FLOW, dtype=float)


# -- references ------------------------------------------------------------------


def kalman_smoother(m0, p0, trans, noise, obs, obs_noise, y, observed):
    """Kalman filter + RTS smoother over states s_0..s_{n-1} (numpy, textbook form).

    s_0 ~ N(m0, p0), s_t = F s_{t-1} + N(0, Q), y_t = H s_t + N(0, R) where observed[t].
    Returns smoothed means (n, d), covariances (n, d, d) and log p(observed y).
    """
    n, d = len(observed), len(m0)
    m_pred, p_pred = np.zeros((n, d)), np.zeros((n, d, d))
    m_filt, p_filt = np.zeros((n, d)), np.zeros((n, d, d))
    m, p, loglik = np.asarray(m0, float), np.asarray(p0, float), 0.0
    for t in range(n):
        if t > 0:
            m, p = trans @ m, trans @ p @ trans.T + noise
        m_pred[t], p_pred[t] = m, p
        if observed[t]:
            s = obs @ p @ obs.T + obs_noise
            v = y[t] - obs @ m
            loglik += multivariate_normal(np.zeros(len(v)), s).logpdf(v)
            gain = p @ obs.T @ np.linalg.inv(s)
            m, p = m + gain @ v, p - gain @ s @ gain.T
        m_filt[t], p_filt[t] = m, p
    m_s, p_s = m_filt.copy(), p_filt.copy()
    for t in range(n - 2, -1, -1):
        g = p_filt[t] @ trans.T @ np.linalg.inv(p_pred[t + 1])
        m_s[t] = m_filt[t] + g @ (m_s[t + 1] - m_pred[t + 1])
        p_s[t] = p_filt[t] + g @ (p_s[t + 1] - p_pred[t + 1]) @ g.T
    return m_s, p_s, loglik


def dense_posterior(m0, p0, trans, noise, obs, obs_noise, y, observed):
    """The same posterior by conditioning one dense (n d)-dimensional Gaussian."""
    n, d = len(observed), len(m0)
    prec = np.zeros((n * d, n * d))
    lin = np.zeros(n * d)
    blk = lambda t: slice(t * d, (t + 1) * d)  # noqa: E731
    p0_inv = np.linalg.inv(p0)
    prec[blk(0), blk(0)] += p0_inv
    lin[blk(0)] += p0_inv @ m0
    q_inv = np.linalg.inv(noise)
    for t in range(1, n):
        prec[blk(t), blk(t)] += q_inv
        prec[blk(t - 1), blk(t - 1)] += trans.T @ q_inv @ trans
        prec[blk(t), blk(t - 1)] -= q_inv @ trans
        prec[blk(t - 1), blk(t)] -= trans.T @ q_inv
    prior_cov = np.linalg.inv(prec)
    prior_mean = prior_cov @ lin
    rows = [t for t in range(n) if observed[t]]
    design = np.zeros((len(rows) * obs.shape[0], n * d))
    for i, t in enumerate(rows):
        design[i * obs.shape[0] : (i + 1) * obs.shape[0], blk(t)] = obs
    y_obs = np.concatenate([np.atleast_1d(y[t]) for t in rows])
    r_big = np.kron(np.eye(len(rows)), obs_noise)
    evidence = multivariate_normal(design @ prior_mean, design @ prior_cov @ design.T + r_big).logpdf(y_obs)
    post_prec = prec + design.T @ np.linalg.solve(r_big, design)
    cov = np.linalg.inv(post_prec)
    mean = cov @ (lin + design.T @ np.linalg.solve(r_big, y_obs))
    covs = np.stack([cov[blk(t), blk(t)] for t in range(n)])
    return mean.reshape(n, d), covs, evidence


def nile_system(obs_var, level_var, mask=None):
    """The Nile model as (m0, P0, F, Q, H, R, y, observed) over level_0..level_100."""
    observed = np.concatenate([[False], np.ones(100, bool) if mask is None else mask])
    one = np.ones((1, 1))
    y = np.concatenate([[np.nan], Y])[:, None]
    return (
        np.array([nile.INITIAL_MEAN]),
        nile.INITIAL_SD**2 * one,
        one,
        level_var * one,
        one,
        obs_var * one,
        y,
        observed,
    )


def nile_loglik(obs_var, level_var):
    """log p(y) of the Nile model as written (scalar Kalman filter, plain floats)."""
    m, p, loglik = nile.INITIAL_MEAN, nile.INITIAL_SD**2, 0.0
    for y_t in Y:
        p = p + level_var
        f = p + obs_var
        loglik -= 0.5 * (np.log(2.0 * np.pi * f) + (y_t - m) ** 2 / f)
        m, p = m + p / f * (y_t - m), p * obs_var / f
    return loglik


@pytest.fixture(scope="module")
def nile_mle():
    """The model's exact MLE: the Kalman log likelihood maximised by scipy."""
    result = scipy.optimize.minimize(
        lambda u: -nile_loglik(*np.exp(u)),
        np.log([10000.0, 1000.0]),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000},
    )
    assert result.success
    return np.exp(result.x)


@pytest.fixture(scope="module")
def nile_em():
    return blrppl.EM(nile.model).run(jax.random.key(0), 1000, y=jnp.asarray(Y), tol=1e-12, progress_bar=False)


# -- exact smoothing ---------------------------------------------------------------------


def _nile_smoother(family):
    return blrppl.ConjugateBayes(nile.model, families={"level": family}).run(
        jax.random.key(0),
        1,
        y=jnp.asarray(Y),
        obs_var=PUBLISHED_OBS_VAR,
        level_var=PUBLISHED_LEVEL_VAR,
        progress_bar=False,
    )


@pytest.fixture(scope="module")
def nile_cb():
    return _nile_smoother("ChainGaussian")


def test_conjugate_bayes_on_nile_is_the_kalman_smoother(nile_cb):
    result = nile_cb
    assert result.plan.qs["level"].family.name == "ScalarChainGaussian"
    means, covs, loglik = kalman_smoother(*nile_system(PUBLISHED_OBS_VAR, PUBLISHED_LEVEL_VAR))
    q = result.posterior["level"]  # level_0 (the start) then level_1..level_100
    np.testing.assert_allclose(q.mean, means[:, 0], rtol=1e-8)
    np.testing.assert_allclose(q.variance, covs[:, 0, 0], rtol=1e-8)
    # The exact posterior's ELBO is the log evidence, the Kalman likelihood.
    np.testing.assert_allclose(result.elbo, [loglik], rtol=1e-10)
    np.testing.assert_allclose(loglik, nile_loglik(PUBLISHED_OBS_VAR, PUBLISHED_LEVEL_VAR), rtol=1e-12)


def test_sequential_and_parallel_smoothers_agree_in_the_engine(nile_cb):
    parallel = _nile_smoother("ChainGaussianParallel")
    assert parallel.plan.qs["level"].family.name == "ScalarChainGaussianParallel"
    seq, par = nile_cb.posterior["level"], parallel.posterior["level"]
    np.testing.assert_allclose(par.mean, seq.mean, rtol=1e-11)
    np.testing.assert_allclose(par.variance, seq.variance, rtol=1e-11)
    np.testing.assert_allclose(parallel.elbo, nile_cb.elbo, rtol=1e-12)


def test_masked_observations_are_dropped_and_the_gaps_filled(rng_key):
    mask = np.ones(100, bool)
    mask[[5, 70, 99]] = False
    mask[29:49] = False  # 1900-1919 missing
    y = np.where(mask, Y, np.nan)  # masked entries may be NaN
    result = blrppl.ConjugateBayes(nile.model, families={"level": "ChainGaussianParallel"}).run(
        rng_key,
        1,
        y=jnp.asarray(y),
        mask=jnp.asarray(mask),
        obs_var=PUBLISHED_OBS_VAR,
        level_var=PUBLISHED_LEVEL_VAR,
        progress_bar=False,
    )
    means, covs, evidence = dense_posterior(*nile_system(PUBLISHED_OBS_VAR, PUBLISHED_LEVEL_VAR, mask))
    q = result.posterior["level"]
    np.testing.assert_allclose(q.mean, means[:, 0], rtol=1e-8)
    np.testing.assert_allclose(q.variance, covs[:, 0, 0], rtol=1e-8)
    np.testing.assert_allclose(result.elbo, [evidence], rtol=1e-10)
    gap = np.asarray(q.variance[30:50])  # chain index = year index + 1
    assert gap.max() > 3 * np.asarray(q.variance[10:20]).max()  # uncertainty grows in the gap


def _llt_system(y):
    kw = {"level_scale": 0.3, "slope_scale": 0.05, "obs_scale": 1.0, "init_loc": (0.0, 0.0), "init_scale": (10.0, 1.0)}
    system = (
        np.asarray(kw["init_loc"]),
        np.diag(np.square(kw["init_scale"])),
        np.asarray(local_linear_trend.TRANSITION),
        np.diag([kw["level_scale"] ** 2, kw["slope_scale"] ** 2]),
        np.array([[1.0, 0.0]]),
        np.array([[kw["obs_scale"] ** 2]]),
        np.concatenate([[np.nan], y])[:, None],
        np.arange(len(y) + 1) > 0,  # state_0 has no observation
    )
    return "state", system


def _lgssm_system(y):
    system = (
        np.zeros(2),
        0.2 * np.eye(2),  # x_1 ~ N(A x_0, Q) with x_0 = 0
        np.asarray(linear_gaussian_ssm.TRANSITION),
        0.2 * np.eye(2),
        np.asarray(linear_gaussian_ssm.OBSERVATION),
        0.25 * np.eye(3),
        y,
        np.ones(len(y), bool),
    )
    return "x", system


@pytest.mark.parametrize(
    "module, system, family",
    [
        (local_linear_trend, _llt_system, "ChainGaussian"),
        # The associative scan of 2 x 2 blocks takes XLA ~10 s to compile on a CPU.
        pytest.param(local_linear_trend, _llt_system, "ChainGaussianParallel", marks=pytest.mark.slow),
        (linear_gaussian_ssm, _lgssm_system, "ChainGaussian"),
    ],
    ids=["scan-sequential", "scan-parallel", "gaussian_state_space-sequential"],
)
def test_vector_state_smoother_equals_dense_conditioning(module, system, family, rng_key):
    """d = 2 states, as a ``scan`` chain and as ``dist.GaussianStateSpace``; both passes."""
    args, kwargs = module.data()
    site, reference = system(np.asarray(kwargs["y"]))
    result = blrppl.ConjugateBayes(module.model, families={site: family}).run(
        rng_key, 1, *args, progress_bar=False, **kwargs
    )
    assert result.plan.qs[site].family.name == family
    means, covs, evidence = dense_posterior(*reference)
    q = result.posterior[site]
    assert q.mean.shape == means.shape
    np.testing.assert_allclose(q.mean, means, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(q.marginal_covariance, covs, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(result.elbo, [evidence], rtol=1e-10)
    k_means, _, _ = kalman_smoother(*reference)
    np.testing.assert_allclose(k_means, means, rtol=1e-8, atol=1e-10)  # the two references agree


# -- EM and VB for the noise variances ------------------------------------------


def test_em_on_nile_reaches_the_maximum_likelihood_variances(nile_em, nile_mle):
    obs_var, level_var = float(nile_em.params["obs_var"]), float(nile_em.params["level_var"])
    # The MLE of the model as written (broad N(1000, 1000^2) start), found by scipy.
    np.testing.assert_allclose([obs_var, level_var], nile_mle, rtol=0.01)
    # The broad start approximates the diffuse initialisation of the published MLE.
    np.testing.assert_allclose([obs_var, level_var], [PUBLISHED_OBS_VAR, PUBLISHED_LEVEL_VAR], rtol=0.02)
    # EM's lower bound never decreases and ends at the log likelihood (Khan & Rue, Sec. 5.2).
    elbo = np.asarray(nile_em.elbo)
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:]))
    np.testing.assert_allclose(elbo[-1], nile_loglik(obs_var, level_var), rtol=1e-9)  # the bound at the last E-step
    assert nile_loglik(*nile_mle) - elbo[-1] < 1e-6


def test_vmp_with_gamma_precisions_gives_the_vb_posterior(nile_mle, rng_key):
    result = blrppl.VMP(nile.vb_model).run(rng_key, 2000, y=jnp.asarray(Y), tol=1e-10, progress_bar=False)
    elbo = np.asarray(result.elbo)
    assert len(elbo) < 2000
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:]))  # coordinate ascent
    for site, mle in zip(("prec_obs", "prec_level"), nile_mle):
        q = result.posterior[site]
        # Conjugate Gamma update: 100 squared residuals per precision.
        np.testing.assert_allclose(q.concentration, 1e-3 + 100 / 2, rtol=1e-12)
        # With a vague prior, 1 / E[precision] sits at the ML variance.
        np.testing.assert_allclose(q.rate / q.concentration, mle, rtol=0.02)
    # The smoothed levels are those of the Kalman smoother at the VB point.
    point = [float(result.posterior[s].rate / result.posterior[s].concentration) for s in ("prec_obs", "prec_level")]
    means, _, _ = kalman_smoother(*nile_system(*point))
    np.testing.assert_allclose(result.posterior["level"].mean, means[:, 0], rtol=1e-6)


# -- forecasting ----------------------------------------------------------------------


def test_forecast_past_the_data_through_predictive_with_the_guide(nile_em):
    horizon, num_samples = 5, 20000
    engine = blrppl.EM(nile.model)
    predictive = numpyro.infer.Predictive(
        nile.model, guide=engine.guide(nile_em), num_samples=num_samples  # the guide carries the MLEs
    )
    draws = predictive(jax.random.key(1), y=jnp.asarray(Y), future=horizon)
    assert draws["level_future"].shape == (num_samples, horizon)
    assert draws["y_future"].shape == (num_samples, horizon)
    obs_var, level_var = float(nile_em.params["obs_var"]), float(nile_em.params["level_var"])
    means, covs, _ = kalman_smoother(*nile_system(obs_var, level_var))
    # level_{T+h} | y ~ N(m_T, P_T + h q),   y_{T+h} | y ~ N(m_T, P_T + h q + r).
    steps = np.arange(1, horizon + 1)
    for site, extra in (("level_future", 0.0), ("y_future", obs_var)):
        variance = covs[-1, 0, 0] + steps * level_var + extra
        sample = np.asarray(draws[site])
        assert np.all(np.abs(sample.mean(0) - means[-1, 0]) < 5 * np.sqrt(variance / num_samples))
        # The sample variance has relative standard error sqrt(2 / N) = 1%.
        np.testing.assert_allclose(sample.var(0), variance, rtol=0.05)


# -- errors -----------------------------------------------------------------------------


def test_unsupported_chains_raise_model_errors(rng_key):
    import numpyro.distributions as dist

    def not_a_chain(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(blrppl.ModelError, match="site 'mu'.*needs a real latent chain"):
        blrppl.ConjugateBayes(not_a_chain, families={"mu": "ChainGaussianParallel"}).plan(y=1.0)
