"""Stationary discrete chains get the tied chain Categorical q (blrppl.blr.tying).

Where every factor pairs a chain's neighbouring states through one transition matrix,
the plan gives the chain the tied family: the same fit as the untied family (which
``families={"z": "ChainCategorical"}`` still selects), with no (T-1, K, K) array in the
step. Transition matrices that differ between steps keep the untied family, also when a
refit on new data of the same shapes brings them (the plan's guard).
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from scipy.special import logsumexp
from scipy.stats import norm

import blrppl
from models import ZOO

K = 3
INIT = np.array([0.5, 0.3, 0.2])
TRANS = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.25, 0.25, 0.5]])
MU = np.array([-2.0, 0.0, 2.5])
SIGMA = 0.9


def _no_pair_per_step(jaxpr, shape) -> bool:
    """No value of ``shape`` anywhere in ``jaxpr`` (nested jaxprs included)."""
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
        if any(getattr(v.aval, "shape", None) == shape for v in eqn.outvars):
            return False
        if not all(_no_pair_per_step(sub, shape) for sub in jaxprs_in_params(eqn.params)):
            return False
    return True


def test_a_stationary_hmm_is_tied_and_fits_as_the_untied_one(rng_key):
    """VMP on the zoo HMM (Dirichlet transition rows): the tied q's ELBO trace, marginals and
    per-step pairwise marginals equal the untied family's, run for run."""
    args, kwargs = ZOO["hmm"].data()
    options = dict(progress_bar=False, tol=1e-10, num_restarts=1)
    tied = blrppl.VMP(ZOO["hmm"].model).run(rng_key, 100, *args, **options, **kwargs)
    untied = blrppl.VMP(ZOO["hmm"].model, families={"z": "ChainCategorical"}).run(rng_key, 100, *args, **options, **kwargs)
    assert tied.plan.qs["z"].family.name == "TiedChainCategorical"
    assert untied.plan.qs["z"].family.name == "ChainCategorical"
    np.testing.assert_allclose(tied.elbo, untied.elbo, rtol=1e-11)
    np.testing.assert_allclose(tied.posterior["z"].marginals, untied.posterior["z"].marginals, atol=1e-10)
    np.testing.assert_allclose(tied.posterior["z"].pair_marginals, untied.posterior["z"].pair_marginals, atol=1e-10)
    assert tied.flags == untied.flags == ()


def em_hmm(y):
    init = numpyro.param("init", jnp.asarray(INIT), constraint=constraints.simplex)
    trans = numpyro.param("trans", jnp.asarray(TRANS), constraint=constraints.simplex)
    mu = numpyro.param("mu", jnp.asarray(MU))
    z0 = numpyro.sample("z0", dist.Categorical(init))

    def transition(z_prev, y_t):
        z = numpyro.sample("z", dist.Categorical(trans[z_prev]))
        numpyro.sample("y", dist.Normal(mu[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, z0, y)


def test_the_tied_em_step_builds_no_array_per_step_pair(rng_key):
    """Baum-Welch by EM: the tied step's program holds no (T-1, K, K) or (T, K, K) value (the
    untied one's does), and both take the same steps."""
    y = jnp.asarray(np.random.default_rng(0).normal(size=40) * 2.0)
    fits = {}
    for name, families in (("tied", None), ("untied", {"z": "ChainCategorical"})):
        engine = blrppl.EM(em_hmm, families=families)
        plan = engine.plan(y)
        algorithm = engine.build(plan)
        state = jax.jit(algorithm.init)(rng_key, plan.arrays)
        jaxpr = jax.make_jaxpr(algorithm.step)(state, plan.arrays).jaxpr
        fits[name] = (plan, all(_no_pair_per_step(jaxpr, (n, K, K)) for n in (40, 41)))
        fits[name] += (engine.run(rng_key, 10, y, progress_bar=False, num_restarts=1),)
    assert fits["tied"][0].qs["z"].family.name == "TiedChainCategorical" and fits["tied"][1]
    assert fits["untied"][0].qs["z"].family.name == "ChainCategorical" and not fits["untied"][1]
    np.testing.assert_allclose(fits["tied"][2].elbo, fits["untied"][2].elbo, rtol=1e-11)
    for name in ("trans", "mu"):
        np.testing.assert_allclose(fits["tied"][2].params[name], fits["untied"][2].params[name], rtol=1e-9)


def step_transitions_hmm(trans_seq, y):
    """Known parameters, a transition matrix per step given as data."""
    z0 = numpyro.sample("z0", dist.Categorical(jnp.asarray(INIT)))

    def transition(z_prev, inputs):
        trans_t, y_t = inputs
        z = numpyro.sample("z", dist.Categorical(trans_t[z_prev]))
        numpyro.sample("y", dist.Normal(jnp.asarray(MU)[z], SIGMA), obs=y_t)
        return z, None

    scan(transition, z0, (trans_seq, y))


def _evidence(trans_seq, y):
    """log p(y) by the forward algorithm in numpy."""
    log_alpha = np.log(INIT)
    for trans_t, y_t in zip(trans_seq, y):
        log_alpha = logsumexp(log_alpha[:, None] + np.log(trans_t), axis=0) + norm.logpdf(y_t, MU, SIGMA)
    return logsumexp(log_alpha)


def test_transitions_that_differ_between_steps_keep_the_untied_family_on_a_refit_too(rng_key):
    """Data-given transition matrices: equal at every step, the chain is tied; a refit of the same
    engine on matrices that differ between steps (same shapes) is planned untied, not read
    through the first plan's tie; both ELBOs are the exact log evidence."""
    rng = np.random.default_rng(3)
    y = 2.0 * rng.normal(size=12)
    same = np.broadcast_to(TRANS, (12, K, K))
    varying = rng.dirichlet(np.ones(K), size=(12, K))
    engine = blrppl.ConjugateBayes(step_transitions_hmm)
    first = engine.run(rng_key, 1, jnp.asarray(same), jnp.asarray(y), progress_bar=False)
    second = engine.run(rng_key, 1, jnp.asarray(varying), jnp.asarray(y), progress_bar=False)
    assert first.plan.qs["z"].family.name == "TiedChainCategorical"
    assert second.plan.qs["z"].family.name == "ChainCategorical"
    np.testing.assert_allclose(first.elbo[-1], _evidence(same, y), rtol=1e-12)
    np.testing.assert_allclose(second.elbo[-1], _evidence(varying, y), rtol=1e-12)


def factorial_hmm(y):
    """Two chains from a constant initial carry (the scan's first step reads ``trans[0]``), one
    emission of both."""
    with numpyro.plate("K", 2):
        tx = numpyro.sample("tx", dist.Dirichlet(jnp.ones(2)))
        tw = numpyro.sample("tw", dist.Dirichlet(jnp.ones(2)))
        mx = numpyro.sample("mx", dist.Normal(0.0, 5.0))
        mw = numpyro.sample("mw", dist.Normal(0.0, 5.0))

    def step(carry, y_t):
        x_prev, w_prev = carry
        x = numpyro.sample("x", dist.Categorical(tx[x_prev]))
        w = numpyro.sample("w", dist.Categorical(tw[w_prev]))
        numpyro.sample("y", dist.Normal(mx[x] + mw[w], 0.5), obs=y_t)
        return (x, w), None

    scan(step, (0, 0), y)


def test_chains_from_a_constant_initial_carry_are_tied(rng_key):
    """The first step's row of the transition matrix, read at the constant carry and masked out of
    the pair reads, does not untie the chains; a factorial HMM's two chains fit as untied ones."""
    y = jnp.asarray(np.random.default_rng(0).normal(size=40) + np.repeat([0.0, 3.0, 1.0, 4.0] * 4, 4)[:40])
    options = dict(progress_bar=False, num_restarts=1)
    tied = blrppl.VMP(factorial_hmm).run(rng_key, 40, y, **options)
    untied = blrppl.VMP(factorial_hmm, families={"x": "ChainCategorical", "w": "ChainCategorical"}).run(
        rng_key, 40, y, **options
    )
    assert {tied.plan.qs[v].family.name for v in "xw"} == {"TiedChainCategorical"}
    assert {untied.plan.qs[v].family.name for v in "xw"} == {"ChainCategorical"}
    np.testing.assert_allclose(tied.elbo, untied.elbo, rtol=1e-11)
    np.testing.assert_allclose(tied.posterior["x"].marginals, untied.posterior["x"].marginals, atol=1e-9)
