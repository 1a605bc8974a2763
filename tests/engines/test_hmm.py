"""Hidden Markov models: a scan chain of Categorical states gets a chain Categorical q.

ConjugateBayes with known parameters is exact forward-backward smoothing (checked
against enumeration of all K^T paths), EM with ``numpyro.param`` parameters is
Baum-Welch (checked step by step against a numpy implementation), and VMP with
Dirichlet transition rows fits the zoo HMM.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from scipy.special import digamma, logsumexp
from scipy.stats import norm

import blrppl
from blrppl.blr import driver

K = 3
INIT = np.array([0.5, 0.3, 0.2])
TRANS = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.25, 0.25, 0.5]])
MU = np.array([-2.0, 0.0, 2.5])
SIGMA = 0.9


def known_hmm(y=None):
    """Known parameters; the initial state is its own site, joined to the scan's states."""
    z0 = numpyro.sample("z0", dist.Categorical(jnp.asarray(INIT)), infer={"enumerate": "parallel"})

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(jnp.asarray(TRANS)[z_prev]), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, z0, y)


def known_hmm_fixed_start(y=None):
    """The scan starts from the constant state 0 (no initial-state site)."""

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(jnp.asarray(TRANS)[z_prev]))
        numpyro.sample("y", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, 0, y)


def enumerate_paths(y, initial_log_probs):
    """Log evidence, marginals and pairwise marginals by brute force over all K^T paths.

    ``initial_log_probs`` is log p(z_0), or None when the chain's first state is
    the first emitting one and comes from the fixed state 0.
    """
    first_emits = initial_log_probs is None
    length = len(y) if first_emits else len(y) + 1
    paths = np.array(list(itertools.product(range(K), repeat=length)))
    log_trans, emission = np.log(TRANS), norm.logpdf(y[:, None], MU, SIGMA)
    if first_emits:
        log_p = log_trans[0, paths[:, 0]]
        emitting = paths
    else:
        log_p = initial_log_probs[paths[:, 0]]
        emitting = paths[:, 1:]
    log_p = log_p + log_trans[paths[:, :-1], paths[:, 1:]].sum(1)
    log_p = log_p + emission[np.arange(len(y)), emitting].sum(1)
    evidence = logsumexp(log_p)
    weights = np.exp(log_p - evidence)
    marginals = np.zeros((length, K))
    pairs = np.zeros((length - 1, K, K))
    for t in range(length):
        np.add.at(marginals[t], paths[:, t], weights)
    for t in range(length - 1):
        np.add.at(pairs[t], (paths[:, t], paths[:, t + 1]), weights)
    return evidence, marginals, pairs


def test_conjugate_bayes_is_forward_backward_smoothing(rng_key):
    y = 2.0 * np.random.default_rng(0).normal(size=6)
    result = blrppl.ConjugateBayes(known_hmm).run(rng_key, 2, y=jnp.asarray(y), progress_bar=False)
    assert result.plan.qs["z"].family.name == "TiedChainCategorical"  # one transition matrix: the tied family
    evidence, marginals, pairs = enumerate_paths(y, np.log(INIT))
    q = result.posterior["z"]
    np.testing.assert_allclose(q.marginals, marginals, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(q.pair_marginals, pairs, rtol=1e-10, atol=1e-14)
    # The exact posterior's ELBO is the log evidence; the second step is a no-op.
    np.testing.assert_allclose(result.elbo, evidence, rtol=1e-12)
    draws = result.sample(rng_key, 4000)
    assert draws["z"].shape == (4000, 6) and draws["z0"].shape == (4000,)  # the model's sites
    paths = np.concatenate([np.asarray(draws["z0"])[:, None], np.asarray(draws["z"])], 1)
    frequencies = np.stack([np.mean(paths == k, 0) for k in range(K)], -1)
    assert np.max(np.abs(frequencies - marginals)) < 0.04  # 4000 draws: sd <= 0.008


def test_a_constant_initial_carry_starts_the_chain(rng_key):
    y = 2.0 * np.random.default_rng(1).normal(size=6)
    result = blrppl.ConjugateBayes(known_hmm_fixed_start).run(rng_key, 1, y=jnp.asarray(y), progress_bar=False)
    evidence, marginals, pairs = enumerate_paths(y, None)
    q = result.posterior["z"]
    np.testing.assert_allclose(q.marginals, marginals, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(q.pair_marginals, pairs, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(result.elbo[-1], evidence, rtol=1e-12)


def known_hmm_first_observed(y=None):
    """The zoo's layout with the initial state's own observation before the scan."""
    z0 = numpyro.sample("z0", dist.Categorical(jnp.asarray(INIT)))
    numpyro.sample("y0", dist.Normal(jnp.asarray(MU)[z0], SIGMA), obs=y[0])

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(jnp.asarray(TRANS)[z_prev]))
        numpyro.sample("y", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, z0, y[1:])


def test_the_initial_state_may_emit_before_the_scan(rng_key):
    y = 2.0 * np.random.default_rng(2).normal(size=6)
    result = blrppl.ConjugateBayes(known_hmm_first_observed).run(
        rng_key, 1, y=jnp.asarray(y), num_restarts=1, progress_bar=False
    )
    paths = np.array(list(itertools.product(range(K), repeat=len(y))))
    log_p = np.log(INIT)[paths[:, 0]] + np.log(TRANS)[paths[:, :-1], paths[:, 1:]].sum(1)
    log_p = log_p + norm.logpdf(y[None, :], MU[paths], SIGMA).sum(1)
    evidence = logsumexp(log_p)
    weights = np.exp(log_p - evidence)
    marginals = np.stack([np.bincount(paths[:, t], weights, minlength=K) for t in range(len(y))])
    np.testing.assert_allclose(result.posterior["z"].marginals, marginals, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(result.elbo[-1], evidence, rtol=1e-12)


# --------------------------------------------------------------------- EM


def em_hmm(y=None):
    init = numpyro.param("init", jnp.array([0.6, 0.4]), constraint=constraints.simplex)
    trans = numpyro.param("trans", jnp.array([[0.7, 0.3], [0.4, 0.6]]), constraint=constraints.simplex)
    mu = numpyro.param("mu", jnp.array([-0.5, 0.5]))
    sigma = numpyro.param("sigma", 1.5, constraint=constraints.positive)
    z0 = numpyro.sample("z0", dist.Categorical(init))

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(mu[z], sigma), obs=y_t)
        return z, None

    scan(transition, z0, y)


def forward_backward(init, trans, log_emission):
    """States 0..T, emissions for states 1..T: (gamma, xi, log likelihood)."""
    length, k = log_emission.shape[0] + 1, len(init)
    unary = np.vstack([np.log(init), log_emission])
    log_alpha, log_beta = np.zeros((length, k)), np.zeros((length, k))
    log_alpha[0] = unary[0]
    for t in range(1, length):
        log_alpha[t] = unary[t] + logsumexp(log_alpha[t - 1][:, None] + np.log(trans), axis=0)
    for t in range(length - 2, -1, -1):
        log_beta[t] = logsumexp(np.log(trans) + (unary[t + 1] + log_beta[t + 1])[None], axis=1)
    log_likelihood = logsumexp(log_alpha[-1])
    gamma = np.exp(log_alpha + log_beta - log_likelihood)
    xi = np.exp(
        log_alpha[:-1, :, None] + np.log(trans) + (unary[1:] + log_beta[1:])[:, None, :] - log_likelihood
    )
    return gamma, xi, log_likelihood


def expected_complete_log_likelihood(y, gamma, xi, init, trans, mu, sigma):
    emission = norm.logpdf(y[:, None], mu, sigma)
    return gamma[0] @ np.log(init) + np.sum(xi * np.log(trans)) + np.sum(gamma[1:] * emission)


def baum_welch(y, init, trans, mu, sigma, steps):
    """Hand-written Baum-Welch; per step: new parameters and the EM bound after the step."""
    history = []
    for _ in range(steps):
        gamma, xi, log_likelihood = forward_backward(init, trans, norm.logpdf(y[:, None], mu, sigma))
        old = expected_complete_log_likelihood(y, gamma, xi, init, trans, mu, sigma)
        init = gamma[0]
        trans = xi.sum(0) / xi.sum((0, 2))[:, None]
        weights = gamma[1:]
        mu = (weights * y[:, None]).sum(0) / weights.sum(0)
        sigma = np.sqrt((weights * (y[:, None] - mu) ** 2).sum() / len(y))
        # E_q[log p(y, z | new)] + H[q], with H[q] = log p(y | old) - E_q[log p(y, z | old)].
        new = expected_complete_log_likelihood(y, gamma, xi, init, trans, mu, sigma)
        history.append((init, trans, mu, sigma, new + log_likelihood - old))
    return history


def test_em_is_baum_welch_step_by_step(rng_key):
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.normal(-1, 0.7, 10), rng.normal(1.5, 0.7, 8), rng.normal(-1, 0.7, 12)])
    engine = blrppl.EM(em_hmm)
    plan = engine.plan(y=jnp.asarray(y))
    algorithm = engine.build(plan)
    state = driver.init(algorithm, rng_key, plan.arrays)
    step = jax.jit(algorithm.step)
    expected = baum_welch(y, np.array([0.6, 0.4]), np.array([[0.7, 0.3], [0.4, 0.6]]), np.array([-0.5, 0.5]), 1.5, 5)
    for t, (init, trans, mu, sigma, bound) in enumerate(expected):
        state, info = step(state, plan.arrays)
        np.testing.assert_allclose(state.params["init"], init, rtol=1e-8)
        np.testing.assert_allclose(state.params["trans"], trans, rtol=1e-8)
        np.testing.assert_allclose(state.params["mu"], mu, rtol=1e-8)
        np.testing.assert_allclose(state.params["sigma"], sigma, rtol=1e-8)
        np.testing.assert_allclose(info.elbo, bound, rtol=1e-10)


# -------------------------------------------------------------------- VMP


@pytest.fixture(scope="module")
def zoo_fit():
    from models import ZOO

    entry = ZOO["hmm"]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(jax.random.key(0), 40, *args, progress_bar=False, **kwargs)
    return result, np.asarray(kwargs["y"])


def test_vmp_on_the_zoo_hmm_recovers_the_regimes(zoo_fit):
    result, y = zoo_fit
    elbo = np.asarray(result.elbo)
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:]))  # coordinate ascent
    assert abs(elbo[-1] - elbo[-2]) < 1e-8
    post = result.posterior
    # The data: a sticky two-state chain (stay probability 0.85), means -2 and 2, sd 0.5.
    low = int(np.argmin(post["mu"].mean))
    order = [low, 1 - low]
    np.testing.assert_allclose(post["mu"].mean[np.array(order)], [-2.0, 2.0], atol=0.25)
    assert np.all(np.diag(post["trans"].mean) > 0.7)
    assert np.all(post["tau"].mean > 1.5)  # noise sd near 0.5: precision near 4
    states = np.asarray(post["z"].marginals[1:, 1 - low] > 0.5).astype(int)
    truth = (y > 0).astype(int)  # regimes are well separated in this sequence
    assert np.mean(states == truth) > 0.95


def test_vmp_site_parameters_are_exact(zoo_fit):
    """q(z)'s pairwise potentials are E[log trans] (Dirichlet rows), its unary ones the
    expected emission log densities: the exact conjugate site parameters."""
    result, y = zoo_fit
    natural = result.natural_params["z"]
    alpha = np.asarray(result.posterior["trans"].concentration)
    expected_log_trans = digamma(alpha) - digamma(alpha.sum(-1, keepdims=True))
    assert result.plan.qs["z"].family.name == "TiedChainCategorical"  # one pair potential for every step
    np.testing.assert_allclose(natural.transitions, expected_log_trans, rtol=1e-10)
    np.testing.assert_allclose(natural.one_hot[0], np.log(0.5), rtol=1e-12)
    # Converged, so the emission messages at the final q(mu), q(tau) are the ones used.
    q_mu, q_tau = result.posterior["mu"], result.posterior["tau"]
    m, v = np.asarray(q_mu.mean), np.asarray(q_mu.variance)
    a, b = np.asarray(q_tau.concentration), np.asarray(q_tau.rate)
    emission = 0.5 * (digamma(a) - np.log(b)) - 0.5 * np.log(2 * np.pi)
    emission = emission - 0.5 * (a / b) * (y[:, None] ** 2 - 2 * y[:, None] * m + m**2 + v)
    np.testing.assert_allclose(natural.one_hot[1:], emission, rtol=1e-6)


def test_vmp_draws_joint_chains(zoo_fit, rng_key):
    result, _ = zoo_fit
    draws = result.sample(rng_key, 5)
    assert draws["z"].shape == (5, 60) and draws["z0"].shape == (5,)
    assert draws["trans"].shape == (5, 2, 2) and draws["mu"].shape == (5, 2)
    assert jnp.issubdtype(draws["z"].dtype, jnp.integer)


# ------------------------------------------------- other ways of writing it


def markov_loop_hmm(y):
    """known_hmm written one site per step (a plain Python loop)."""
    z = numpyro.sample("z_0", dist.Categorical(jnp.asarray(INIT)))
    for t in range(len(y)):
        z = numpyro.sample(f"z_{t + 1}", dist.Categorical(jnp.asarray(TRANS)[z]))
        numpyro.sample(f"y_{t}", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y[t])


def test_a_chain_written_as_a_python_loop_is_one_chain(rng_key):
    y = 2.0 * np.random.default_rng(0).normal(size=6)
    loop = blrppl.ConjugateBayes(markov_loop_hmm).run(rng_key, 1, jnp.asarray(y), num_restarts=1, progress_bar=False)
    chain = loop.graph.variables["z_0"].chain
    assert chain.kind == "markov" and chain.sites == tuple(f"z_{t}" for t in range(7))
    # The scan form (known_hmm) on these data is checked against the same enumeration above.
    evidence, marginals, pairs = enumerate_paths(y, np.log(INIT))
    np.testing.assert_allclose(loop.posterior["z_0"].marginals, marginals, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(loop.posterior["z_0"].pair_marginals, pairs, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(loop.elbo[-1], evidence, rtol=1e-12)
    draws = loop.sample(rng_key, 3)
    assert draws["z_0"].shape == (3,) and draws["z_3"].shape == (3,)  # shaped like the model's sites
    # The emissions are one factor; ArviZ still gets one observed site per step.
    assert loop.graph.factors["y_0"].sites == tuple(f"y_{t}" for t in range(6))
    idata = loop.to_arviz()
    assert sorted(idata.observed_data.data_vars) == sorted(idata.log_likelihood.data_vars) == [f"y_{t}" for t in range(6)]
    np.testing.assert_allclose(idata.observed_data["y_4"], y[4])


def several_sequences(y=None):
    with numpyro.plate("sequences", 3):
        z0 = numpyro.sample("z0", dist.Categorical(jnp.asarray(INIT)))

    def transition(z_prev, y_t):
        with numpyro.plate("sequences", 3):
            z = numpyro.sample("z", dist.Categorical(jnp.asarray(TRANS)[z_prev]))
            numpyro.sample("y", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, z0, y)


def test_side_by_side_chains_are_independent_sequences(rng_key):
    y = 2.0 * np.random.default_rng(2).normal(size=(5, 3))  # (time, sequence)
    result = blrppl.ConjugateBayes(several_sequences).run(rng_key, 1, y=jnp.asarray(y), num_restarts=1, progress_bar=False)
    q = result.plan.qs["z"]
    assert q.shape == (3, 6) and q.num_batch == 1
    total = 0.0
    for n in range(3):
        evidence, marginals, pairs = enumerate_paths(y[:, n], np.log(INIT))
        np.testing.assert_allclose(result.posterior["z"].marginals[n], marginals, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(result.posterior["z"].pair_marginals[n], pairs, rtol=1e-10, atol=1e-14)
        total += evidence
    np.testing.assert_allclose(result.elbo[-1], total, rtol=1e-12)
    draws = result.sample(rng_key, 2)
    # Shaped like the model's sites: the scan's z (time first, then sequences) and the initial z0.
    assert draws["z"].shape == (2, 5, 3) and draws["z0"].shape == (2, 3)


def left_to_right(y=None):
    trans = jnp.array([[0.9, 0.1], [0.0, 1.0]])  # an exact zero: log 0 = -inf
    z0 = numpyro.sample("z0", dist.Categorical(jnp.array([0.5, 0.5])))

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(jnp.array([-1.0, 1.0])[z], 1.0), obs=y_t)
        return z, None

    scan(transition, z0, y)


def test_zero_transition_probabilities_are_a_model_error(rng_key):
    with pytest.raises(blrppl.ModelError, match="site 'z'.*zero probability.*tiny probability"):
        blrppl.ConjugateBayes(left_to_right).run(rng_key, 1, y=jnp.zeros(4), progress_bar=False)
