"""An exact run's ELBO is the log evidence read off A(λ) and each factor's constant.

Where one step is the posterior (λ = Σ_f λ̃_f, every E_q[log f] affine in μ), the step
reports Σ_f c_f + A(λ) - E_q[log h] (:func:`blrppl.blr.elbo.exact_evidence`), not the
generic Σ_f E_q[log f] + H[q] whose inner products cancel. Both must agree.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import special

import blrppl
from blrppl.blr.elbo import elbo_terms
from models import ZOO
from tests.compiles import compilations, compiled_names


def known_variances():
    """The Nile local level with known variances: a chain, A(λ) from its forward pass."""
    args, kwargs = ZOO["nile"].data()
    return args, {**kwargs, "obs_var": 15099.0, "level_var": 1469.1}


@pytest.mark.parametrize(
    "name, engine, fixed_params",
    [
        ("gamma_poisson", blrppl.ConjugateBayes, False),
        ("nile_known_variances", blrppl.ConjugateBayes, False),
        ("multivariate_regression", blrppl.ConjugateBayes, False),
        ("nile", blrppl.EM, True),  # the E-step: terms reading the point estimates are constants
    ],
)
def test_an_exact_steps_elbo_equals_the_generic_elbo(name, engine, fixed_params, rng_key):
    entry = ZOO[name.replace("_known_variances", "")]
    args, kwargs = known_variances() if name.endswith("known_variances") else entry.data()
    fit = engine(entry.model)
    plan = fit.plan(*args, **kwargs)
    algorithm = fit.build(plan, fixed_params=fixed_params)
    assert algorithm.exact and all(e.constant is not None for e in plan.estimators)
    state, info = jax.jit(algorithm.step)(algorithm.init(rng_key, plan.arrays), plan.arrays)
    generic = elbo_terms(rng_key, plan.qs, plan.estimators, state.natural, state.params, plan.arrays)
    np.testing.assert_allclose(info.elbo, generic, rtol=1e-12)


def test_beta_bernoulli_runs_report_the_closed_form_log_evidence(rng_key):
    def model(y=None):
        p = numpyro.sample("p", dist.Beta(2.0, 3.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Bernoulli(p), obs=y)

    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    k, n = y.sum(), y.size
    evidence = special.betaln(2.0 + k, 3.0 + n - k) - special.betaln(2.0, 3.0)
    result = blrppl.ConjugateBayes(model).run(rng_key, 1, y=y, progress_bar=False)
    np.testing.assert_allclose(result.elbo[-1], evidence, rtol=1e-12)


def test_a_factor_reading_two_latents_keeps_the_generic_elbo():
    """E_q[τ (y - μ)²] = E[τ] E[(y - μ)²] is not affine in the joint μ: no constant."""
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    plan = blrppl.VMP(entry.model).plan(*args, **kwargs)
    constants = {e.factor: e.constant for e in plan.estimators}
    assert constants["y"] is None
    assert all(c is not None for f, c in constants.items() if f != "y")


def test_an_exact_run_is_one_compiled_program(rng_key):
    """The start of an exact run (never read by its step) is made inside the loop's program:
    one compilation on the first run, one dispatch per later run."""

    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        with numpyro.plate("n", 7):
            numpyro.sample("y", dist.Normal(mu, 1.5), obs=y)

    engine = blrppl.ConjugateBayes(model)
    plan = engine.plan(y=jnp.arange(7.0))
    with compilations() as messages:
        engine.fit(plan, rng_key, 1, progress_bar=False)
    assert compiled_names(messages) == ["jit(_exact_chunk)"]
