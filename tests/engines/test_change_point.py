"""A change point: a categorical latent compared with time in a factor conjugate given its value.

tau ~ Categorical(uniform over T),  l1, l2 ~ Gamma(2, 1),
y_t ~ Poisson(l1 if t < tau else l2):
the factor of y is not conjugate in tau (a comparison with a random value) but is
Gamma-Poisson in l1 and l2 once tau is held, so its expectation is an exact sum
over tau's T values (:mod:`blrppl.estimators.conditional_enumeration`). The
reference is the mean-field optimum by closed-form coordinate ascent (CAVI).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.special import digamma, logsumexp

import blrppl

T = 30
A0, B0 = 2.0, 1.0


def model(y=None):
    l1 = numpyro.sample("l1", dist.Gamma(A0, B0))
    l2 = numpyro.sample("l2", dist.Gamma(A0, B0))
    tau = numpyro.sample("tau", dist.Categorical(logits=jnp.zeros(T)))
    rate = jnp.where(jnp.arange(T) < tau, l1, l2)
    with numpyro.plate("t", T):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def data(seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.poisson(1.5, 17), rng.poisson(4.0, T - 17)]).astype(float)


def mean_field_optimum(y, iterations=500):
    """CAVI: q(l_j) = Gamma(A0 + Σ r_jt y_t, B0 + Σ r_jt) with r_1t = q(tau > t), r_2t = 1 - r_1t;
    log q(tau = k) = Σ_{t<k} (y_t E log l1 - E l1) + Σ_{t>=k} (y_t E log l2 - E l2) + const."""
    probs = np.full(T, 1.0 / T)
    before = np.tril(np.ones((T, T)), -1)  # before[k, t] = 1 if t < k
    for _ in range(iterations):
        r1 = probs @ before  # q(tau > t)
        a1, b1 = A0 + r1 @ y, B0 + r1.sum()
        a2, b2 = A0 + (1.0 - r1) @ y, B0 + (1.0 - r1).sum()
        e1 = y * (digamma(a1) - np.log(b1)) - a1 / b1
        e2 = y * (digamma(a2) - np.log(b2)) - a2 / b2
        logits = before @ e1 + (1.0 - before) @ e2
        probs = np.exp(logits - logsumexp(logits))
    return (a1, b1), (a2, b2), probs


@pytest.mark.parametrize("engine, steps", [(blrppl.VMP, 300), (blrppl.NonConjugateVI, 1500)])
def test_a_change_point_reaches_the_mean_field_optimum_exactly(rng_key, engine, steps):
    y = data()
    result = engine(model).run(rng_key, steps, y=jnp.asarray(y), progress_bar=False)  # every step: at the optimum
    assert result.flags == ()
    assert {e.factor: e.method.label for e in result.plan.estimators}["y"] == "exact+enumeration"
    (a1, b1), (a2, b2), probs = mean_field_optimum(y)
    q = result.posterior
    np.testing.assert_allclose([q["l1"].concentration, q["l1"].rate], [a1, b1], rtol=1e-10)
    np.testing.assert_allclose([q["l2"].concentration, q["l2"].rate], [a2, b2], rtol=1e-10)
    np.testing.assert_allclose(q["tau"].probs, probs, atol=1e-10)


def test_choose_fits_a_change_point_by_message_passing(rng_key):
    y = jnp.asarray(data(1))
    choice = blrppl.choose(model, y=y)
    assert choice.name == "VMP" and choice.plan is not None
    second = choice.engine.run(rng_key, 100, y=jnp.asarray(data(2)), progress_bar=False, tol=1e-10)
    assert second.converged  # new data planned on the host (no compiled replanner for this factor)


def switch(y=None):
    s = numpyro.sample("s", dist.Bernoulli(0.5))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    prec = numpyro.sample("prec", dist.Gamma(2.0, 2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(jnp.where(s > 0, mu, 0.0), 1.0 / jnp.sqrt(prec)), obs=y)


def switch_optimum(y, iterations=500):
    """CAVI for the switch: q(s), q(mu) = N(m, v), q(prec) = Gamma(a, b)."""
    n, p, m, v, a, b = len(y), 0.5, 0.0, 25.0, 2.0, 2.0
    for _ in range(iterations):
        e_prec = a / b
        v = 1.0 / (1.0 / 25.0 + p * n * e_prec)
        m = v * p * e_prec * y.sum()
        on = np.sum((y - m) ** 2 + v)  # E (y - mu)^2
        off = np.sum(y**2)
        a, b = 2.0 + n / 2.0, 2.0 + 0.5 * (p * on + (1.0 - p) * off)
        log_odds = -0.5 * (a / b) * (on - off)
        p = 1.0 / (1.0 + np.exp(-log_odds))
    return p, m, v, a, b


@pytest.mark.parametrize("engine", [blrppl.VMP, blrppl.NonConjugateVI])
def test_a_switch_is_updated_after_what_it_switches(rng_key, engine):
    # s first, from mu's prior spread (sd 5), made s = 1 hopeless: every restart settled at
    # s = 0 (ELBO -46.2, unflagged). The continuous neighbours first, then s: the optimum (-36.7).
    y = np.random.default_rng(0).normal(1.2, 1.0, 25)
    result = engine(switch).run(rng_key, 300, y=jnp.asarray(y), progress_bar=False)
    p, m, v, a, b = switch_optimum(y)
    q = result.posterior
    np.testing.assert_allclose(q["s"].probs, p, atol=1e-8)
    np.testing.assert_allclose([q["mu"].loc, q["mu"].scale**2], [m, v], rtol=1e-8)
    np.testing.assert_allclose([q["prec"].concentration, q["prec"].rate], [a, b], rtol=1e-8)


def test_a_discrete_uniform_prior_says_how_to_write_it():
    def uniform_change_point(y=None):
        tau = numpyro.sample("tau", dist.DiscreteUniform(1, T))
        l1 = numpyro.sample("l1", dist.Gamma(A0, B0))
        with numpyro.plate("t", T):
            numpyro.sample("y", dist.Poisson(jnp.where(jnp.arange(T) < tau, l1, 1.0)), obs=y)

    with pytest.raises(blrppl.ModelError, match="site 'tau': DiscreteUniform priors are not implemented.*Categorical"):
        blrppl.VMP(uniform_change_point).plan(y=jnp.asarray(data()))
