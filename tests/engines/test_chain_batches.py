"""Many sequences side by side, Python-loop chains and in-scan starts.

A chain q over N independent sequences (a plate around or inside the scan,
states of shape (N,) or (N, 1) per step, a plate of random walks), with
unequal lengths padded and masked, checked against references written here
in numpy float64: forward-backward per sequence, Baum-Welch over all
sequences, a scalar Kalman filter and RTS smoother per sequence, and scipy's
maximisation of the Kalman log likelihood.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.optimize
from numpyro import handlers
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from scipy.special import logsumexp
from scipy.stats import norm

import blrppl
from blrppl.blr import driver
from models import local_level_in_scan, nile

NUM_SEQUENCES, MAX_LENGTH = 20, 50
INIT = np.array([0.6, 0.3, 0.1])
TRANS = np.array([[0.85, 0.1, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]])
MU = np.array([-2.0, 0.0, 2.0])
SIGMA = 0.8
K = len(INIT)


def hmm_data(unequal):
    """(y, mask, lengths): y (T, N) time-major, NaN past each end; mask marks observed entries."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(20, MAX_LENGTH + 1, NUM_SEQUENCES) if unequal else np.full(NUM_SEQUENCES, MAX_LENGTH)
    y = np.full((MAX_LENGTH, NUM_SEQUENCES), np.nan)
    for n, length in enumerate(lengths):
        z = rng.choice(K, p=INIT)
        for t in range(length):
            if t:
                z = rng.choice(K, p=TRANS[z])
            y[t, n] = MU[z] + SIGMA * rng.normal()
    mask = np.arange(MAX_LENGTH)[:, None] < lengths[None, :]
    return y, mask, lengths


# -- references (numpy) ----------------------------------------------------------


def forward_backward(init, trans, log_emission):
    """One sequence, states 0..L-1 all emitting: (marginals, pair marginals, log evidence)."""
    length = log_emission.shape[0]
    log_alpha, log_beta = np.zeros((length, K)), np.zeros((length, K))
    log_alpha[0] = np.log(init) + log_emission[0]
    for t in range(1, length):
        log_alpha[t] = log_emission[t] + logsumexp(log_alpha[t - 1][:, None] + np.log(trans), axis=0)
    for t in range(length - 2, -1, -1):
        log_beta[t] = logsumexp(np.log(trans) + (log_emission[t + 1] + log_beta[t + 1])[None], axis=1)
    evidence = logsumexp(log_alpha[-1])
    marginals = np.exp(log_alpha + log_beta - evidence)
    pairs = np.exp(
        log_alpha[:-1, :, None] + np.log(trans) + (log_emission[1:] + log_beta[1:])[:, None, :] - evidence
    )
    return marginals, pairs, evidence


def per_sequence(y, lengths, init, trans, mu, sigma):
    """Forward-backward on each sequence cut to its length."""
    return [
        forward_backward(init, trans, norm.logpdf(y[:length, n, None], mu, sigma))
        for n, length in enumerate(lengths)
    ]


def baum_welch(y, lengths, init, trans, mu, sigma, steps):
    """Hand-written Baum-Welch over all sequences (each cut to its length); parameters per step."""
    history = []
    for _ in range(steps):
        fits = per_sequence(y, lengths, init, trans, mu, sigma)
        init = np.mean([m[0] for m, _, _ in fits], axis=0)
        counts = sum(p.sum(0) for _, p, _ in fits)
        trans = counts / counts.sum(1, keepdims=True)
        weights = np.concatenate([m for m, _, _ in fits])
        values = np.concatenate([y[:length, n] for n, length in enumerate(lengths)])
        mu = (weights * values[:, None]).sum(0) / weights.sum(0)
        sigma = np.sqrt((weights * (values[:, None] - mu) ** 2).sum() / len(values))
        history.append((init, trans, mu, sigma))
    return history


# -- models ------------------------------------------------------------------------


def hmm_parameters(known):
    """Known (init, trans, mu, sigma), or numpyro.param sites for EM."""
    if known:
        return tuple(jnp.asarray(a) for a in (INIT, TRANS, MU, SIGMA))
    init = numpyro.param("init", jnp.ones(K) / K, constraint=constraints.simplex)
    trans = numpyro.param("trans", jnp.full((K, K), 0.1) + 0.7 * jnp.eye(K), constraint=constraints.simplex)
    mu = numpyro.param("mu", jnp.array([-1.0, 0.5, 1.0]))
    sigma = numpyro.param("sigma", 1.5, constraint=constraints.positive)
    return init, trans, mu, sigma


def hmm_plate_outside(y, mask, known=True):
    """The initial states and their observations in a plate before the scan (the zoo's layout)."""
    init, trans, mu, sigma = hmm_parameters(known)
    num = y.shape[1]
    with numpyro.plate("sequences", num):
        z0 = numpyro.sample("z0", dist.Categorical(init))
        numpyro.sample("y0", dist.Normal(mu[z0], sigma).mask(mask[0]), obs=y[0])

    def transition(z_prev, inputs):
        y_t, m_t = inputs
        with numpyro.plate("sequences", num):
            z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
            numpyro.sample("y", dist.Normal(mu[z], sigma).mask(m_t), obs=y_t)
        return z, None

    scan(transition, z0, (y[1:], mask[1:]))


def hmm_plate_inside(y, mask, known=True):
    """numpyro's hmm_enum layout: a constant (N, 1) carry, the plate at dim -2, whole steps masked."""
    init, trans, mu, sigma = hmm_parameters(known)
    num = y.shape[1]

    def transition(z_prev, inputs):
        t, y_t, m_t = inputs
        with numpyro.plate("sequences", num, dim=-2), handlers.mask(mask=m_t[:, None]):
            z = numpyro.sample("z", dist.Categorical(jnp.where(t == 0, init, trans[z_prev])))
            numpyro.sample("y", dist.Normal(mu[z], sigma), obs=y_t[:, None])
        return z, None

    scan(transition, jnp.zeros((num, 1), int), (jnp.arange(y.shape[0]), y, mask))


def hmm_loop(y, mask, known=True):
    """hmm_plate_outside written as a Python loop, one site per step."""
    init, trans, mu, sigma = hmm_parameters(known)
    with numpyro.plate("sequences", y.shape[1]):
        z = numpyro.sample("z_0", dist.Categorical(init))
        numpyro.sample("y_0", dist.Normal(mu[z], sigma).mask(mask[0]), obs=y[0])
        for t in range(1, y.shape[0]):
            z = numpyro.sample(f"z_{t}", dist.Categorical(trans[z]))
            numpyro.sample(f"y_{t}", dist.Normal(mu[z], sigma).mask(mask[t]), obs=y[t])


def hmm_markov(y, mask, known=True):
    """The same loop over numpyro.contrib.funsor.markov (needs funsor)."""
    from numpyro.contrib.funsor import markov

    init, trans, mu, sigma = hmm_parameters(known)
    with numpyro.plate("sequences", y.shape[1]):
        z = None
        for t in markov(range(y.shape[0])):
            z = numpyro.sample(f"z_{t}", dist.Categorical(init if z is None else trans[z]))
            numpyro.sample(f"y_{t}", dist.Normal(mu[z], sigma).mask(mask[t]), obs=y[t])


def _marginals(result):
    """q(z_nt = k) as (N, T, K) from the chain variable (whatever its name and batch axes)."""
    (name,) = [v for v, q in result.plan.qs.items() if q.family.chain]
    return np.asarray(result.posterior[name].marginals).reshape(NUM_SEQUENCES, MAX_LENGTH, K)


# -- HMMs over many sequences ----------------------------------------------------------


LAYOUTS = {"plate outside the scan": hmm_plate_outside, "plate inside the scan": hmm_plate_inside}


def exact_fit(engine, y, mask):
    """One exact step; restarts would only compile a second, random-start program."""
    return engine.run(jax.random.key(0), 1, jnp.asarray(y), jnp.asarray(mask), num_restarts=1, progress_bar=False)


@pytest.fixture(scope="module")
def hmm_fits():
    """ConjugateBayes per layout, on equal and unequal lengths: one engine (one compilation) per layout."""
    fits = {}
    for layout, model in LAYOUTS.items():
        engine = blrppl.ConjugateBayes(model)
        for unequal in (False, True):
            fits[layout, unequal] = exact_fit(engine, *hmm_data(unequal)[:2])
    return fits


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("unequal", [False, True], ids=["equal lengths", "unequal lengths"])
def test_conjugate_bayes_is_forward_backward_per_sequence(layout, unequal, hmm_fits):
    y, mask, lengths = hmm_data(unequal)
    result = hmm_fits[layout, unequal]
    if layout == "plate outside the scan":
        padding = 0.0  # the states past each end continue the chain unobserved
    else:
        padding = (MAX_LENGTH * NUM_SEQUENCES - lengths.sum()) * np.log(K)  # masked steps: uniform, log K each
    q = result.plan.qs["z"]
    assert q.family.name in ("ChainCategorical", "TiedChainCategorical") and q.batch_shape[0] == NUM_SEQUENCES
    marginals = _marginals(result)
    references = per_sequence(y, lengths, INIT, TRANS, MU, SIGMA)
    pairs = np.asarray(result.posterior["z"].pair_marginals).reshape(NUM_SEQUENCES, MAX_LENGTH - 1, K, K)
    for n, (m, p, _) in enumerate(references):
        np.testing.assert_allclose(marginals[n, : lengths[n]], m, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(pairs[n, : lengths[n] - 1], p, rtol=1e-8, atol=1e-12)
    evidence = sum(e for _, _, e in references)
    np.testing.assert_allclose(result.elbo[-1], evidence + padding, rtol=1e-10)


@pytest.mark.slow
def test_em_is_baum_welch_over_all_sequences(rng_key):
    y, mask, lengths = hmm_data(unequal=True)
    engine = blrppl.EM(hmm_plate_inside)
    plan = engine.plan(jnp.asarray(y), jnp.asarray(mask), known=False)
    algorithm = engine.build(plan)
    state = driver.init(algorithm, rng_key, plan.arrays)
    step = jax.jit(algorithm.step)
    start = (np.ones(K) / K, np.full((K, K), 0.1) + 0.7 * np.eye(K), np.array([-1.0, 0.5, 1.0]), 1.5)
    for init, trans, mu, sigma in baum_welch(y, lengths, *start, steps=4):
        state, _ = step(state, plan.arrays)
        np.testing.assert_allclose(state.params["init"], init, rtol=1e-8)
        np.testing.assert_allclose(state.params["trans"], trans, rtol=1e-8)
        np.testing.assert_allclose(state.params["mu"], mu, rtol=1e-8)
        np.testing.assert_allclose(state.params["sigma"], sigma, rtol=1e-8)


LOOP_LENGTH = MAX_LENGTH  # the loop's steps are one factor per kind: it costs what the scan costs


def loop_data():
    """hmm_data's 20 sequences of unequal lengths (up to 50 steps), NaN past each end."""
    y, mask, lengths = hmm_data(unequal=True)
    return np.where(mask, y, np.nan), mask, lengths


@pytest.fixture(scope="module")
def loop_reference():
    """The scan form (plate outside) on loop_data."""
    return exact_fit(blrppl.ConjugateBayes(hmm_plate_outside), *loop_data()[:2])


@pytest.mark.slow
@pytest.mark.parametrize("model", [hmm_loop, hmm_markov], ids=["python loop", "numpyro markov"])
def test_a_loop_chain_equals_the_scan_form(model, loop_reference):
    if model is hmm_markov:
        pytest.importorskip("funsor")
    y, mask, lengths = loop_data()
    result = exact_fit(blrppl.ConjugateBayes(model), y, mask)
    chain = result.graph.variables["z_0"].chain
    assert chain.kind == "markov" and chain.length == LOOP_LENGTH and chain.batch_shape == (NUM_SEQUENCES,)
    marginals = np.asarray(result.posterior["z_0"].marginals).reshape(NUM_SEQUENCES, LOOP_LENGTH, K)
    reference = np.asarray(loop_reference.posterior["z"].marginals).reshape(NUM_SEQUENCES, LOOP_LENGTH, K)
    np.testing.assert_allclose(marginals, reference, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(result.elbo[-1], loop_reference.elbo[-1], rtol=1e-12)
    # ... and both are forward-backward per sequence.
    for n, (m, _, _) in enumerate(per_sequence(y, lengths, INIT, TRANS, MU, SIGMA)):
        np.testing.assert_allclose(marginals[n, : lengths[n]], m, rtol=1e-8, atol=1e-12)


# -- batches of local levels -------------------------------------------------------


LEVEL_SD, OBS_SD, START_SD = 0.6, 0.9, 3.0
NUM_SERIES, SERIES_LENGTH = 5, 40


def series_data():
    """(y, mask, lengths): y (N, T), zero past each end (a mask inside to_event needs numbers)."""
    rng = np.random.default_rng(6)
    lengths = rng.integers(SERIES_LENGTH // 2, SERIES_LENGTH + 1, NUM_SERIES)
    level = START_SD * rng.normal(size=(NUM_SERIES, 1)) + np.cumsum(LEVEL_SD * rng.normal(size=(NUM_SERIES, SERIES_LENGTH)), 1)
    y = level + OBS_SD * rng.normal(size=level.shape)
    mask = np.arange(SERIES_LENGTH)[None, :] < lengths[:, None]
    return np.where(mask, y, 0.0), mask, lengths


def kalman_smoother(y, first_mean, first_var, level_var, obs_var, observed=None):
    """Scalar local level, x_1 ~ N(first_mean, first_var), y where observed: (means, variances, log p(y))."""
    n = len(y)
    m_pred, p_pred, m_filt, p_filt = (np.zeros(n) for _ in range(4))
    m, p, loglik = first_mean, first_var, 0.0
    for t in range(n):
        if t:
            p = p + level_var
        m_pred[t], p_pred[t] = m, p
        if observed is None or observed[t]:
            f = p + obs_var
            loglik -= 0.5 * (np.log(2 * np.pi * f) + (y[t] - m) ** 2 / f)
            m, p = m + p / f * (y[t] - m), p * obs_var / f
        m_filt[t], p_filt[t] = m, p
    means, variances = m_filt.copy(), p_filt.copy()
    for t in range(n - 2, -1, -1):
        gain = p_filt[t] / p_pred[t + 1]
        means[t] = m_filt[t] + gain * (means[t + 1] - m_pred[t + 1])
        variances[t] = p_filt[t] + gain**2 * (variances[t + 1] - p_pred[t + 1])
    return means, variances, loglik


def walks_in_a_plate(y, mask):
    """A plate of GaussianRandomWalks (sequences before time)."""
    with numpyro.plate("series", y.shape[0]):
        level = numpyro.sample("level", dist.GaussianRandomWalk(LEVEL_SD, num_steps=y.shape[1]))  # x_1 ~ N(0, LEVEL_SD^2)
        numpyro.sample("y", dist.Normal(level, OBS_SD).mask(mask).to_event(1), obs=y)


def levels_in_a_scan(y, mask):
    """The same as a scan with the plate inside the body (time before sequences), initial state before it."""
    with numpyro.plate("series", y.shape[0]):
        first = numpyro.sample("level_0", dist.Normal(0.0, START_SD))
        numpyro.sample("y_0", dist.Normal(first, OBS_SD).mask(mask[:, 0]), obs=y[:, 0])

    def transition(prev, inputs):
        y_t, m_t = inputs
        with numpyro.plate("series", y.shape[0]):
            level = numpyro.sample("level", dist.Normal(prev, LEVEL_SD))
            numpyro.sample("y", dist.Normal(level, OBS_SD).mask(m_t), obs=y_t)
        return level, None

    scan(transition, first, (y[:, 1:].T, mask[:, 1:].T))


def levels_in_a_loop(y, mask):
    """levels_in_a_scan as a Python loop."""
    with numpyro.plate("series", y.shape[0]):
        level = numpyro.sample("level_0", dist.Normal(0.0, START_SD))
        numpyro.sample("y_0", dist.Normal(level, OBS_SD).mask(mask[:, 0]), obs=y[:, 0])
        for t in range(1, y.shape[1]):
            level = numpyro.sample(f"level_{t}", dist.Normal(level, LEVEL_SD))
            numpyro.sample(f"y_{t}", dist.Normal(level, OBS_SD).mask(mask[:, t]), obs=y[:, t])


@pytest.mark.slow
@pytest.mark.parametrize("model", [walks_in_a_plate, levels_in_a_scan, levels_in_a_loop])
def test_batch_of_local_levels_is_a_kalman_smoother_per_series(model, rng_key):
    y, mask, lengths = series_data()
    result = blrppl.ConjugateBayes(model).run(rng_key, 1, jnp.asarray(y), jnp.asarray(mask), progress_bar=False)
    (name,) = result.plan.qs
    q = result.plan.qs[name]
    assert q.family.name == "ScalarChainGaussian" and q.shape == (NUM_SERIES, SERIES_LENGTH)
    first_var = LEVEL_SD**2 if model is walks_in_a_plate else START_SD**2
    posterior = result.posterior[name]
    evidence = 0.0
    for n in range(NUM_SERIES):
        means, variances, loglik = kalman_smoother(y[n], 0.0, first_var, LEVEL_SD**2, OBS_SD**2, mask[n])
        np.testing.assert_allclose(posterior.mean[n], means, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(posterior.variance[n], variances, rtol=1e-8)
        evidence += loglik
    np.testing.assert_allclose(result.elbo[-1], evidence, rtol=1e-10)
    assert lengths.min() < SERIES_LENGTH  # unequal lengths: the levels past each end are forecasts


# -- the initial state inside the scan -----------------------------------------------------


Y_NILE = np.asarray(nile.FLOW, dtype=float)


def in_scan_loglik(obs_var, level_var):
    return kalman_smoother(Y_NILE, nile.INITIAL_MEAN, nile.INITIAL_SD**2, level_var, obs_var)[2]


def test_initial_state_inside_the_scan_is_the_kalman_smoother(rng_key):
    obs_var, level_var = 15099.0, 1469.1
    result = blrppl.ConjugateBayes(local_level_in_scan.em_model).run(
        rng_key, 1, y=jnp.asarray(Y_NILE), obs_var=obs_var, level_var=level_var, progress_bar=False
    )
    means, variances, loglik = kalman_smoother(Y_NILE, nile.INITIAL_MEAN, nile.INITIAL_SD**2, level_var, obs_var)
    q = result.posterior["level"]
    np.testing.assert_allclose(q.mean, means, rtol=1e-8)
    np.testing.assert_allclose(q.variance, variances, rtol=1e-8)
    np.testing.assert_allclose(result.elbo[-1], loglik, rtol=1e-10)


@pytest.mark.slow
def test_em_with_the_initial_state_inside_the_scan_reaches_the_mle(rng_key):
    fit = blrppl.EM(local_level_in_scan.em_model).run(rng_key, 1000, y=jnp.asarray(Y_NILE), tol=1e-9, progress_bar=False)
    assert fit.estimators["level"] == "exact"  # the concatenated scale vector is seen through
    mle = scipy.optimize.minimize(
        lambda u: -in_scan_loglik(*np.exp(u)),
        np.log([10000.0, 1000.0]),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000},
    )
    assert mle.success
    obs_var, level_var = np.exp(mle.x)
    np.testing.assert_allclose(fit.params["obs_var"], obs_var, rtol=0.01)
    np.testing.assert_allclose(fit.params["level_var"], level_var, rtol=0.01)
    # At convergence the EM bound is the log likelihood at the estimates.
    np.testing.assert_allclose(fit.elbo[-1], in_scan_loglik(fit.params["obs_var"], fit.params["level_var"]), rtol=1e-8)


def test_a_loop_chain_costs_what_a_scan_costs():
    """A longer loop adds no factors and no analysis terms: its steps are one factor per kind, stacked."""
    from models import hmm_markov

    sizes = {}
    for steps in (4, 41):
        args, kwargs = hmm_markov.data(num_sequences=2, num_steps=steps)
        plan = blrppl.VMP(hmm_markov.model).plan(*args, **kwargs)
        assert plan.graph.variables["z_0"].chain.length == steps + 1
        assert plan.graph.factors["y_0"].sites == tuple(f"y_{t}" for t in range(steps))
        terms = {f: len(a.terms) for f, a in plan.arrays.factors.items() if hasattr(a, "terms")}
        sizes[steps] = (list(plan.graph.factors), terms)
    assert sizes[4] == sizes[41]
    assert sizes[41][0] == ["trans", "mu", "tau", "z_0", "z_1", "y_0"]
