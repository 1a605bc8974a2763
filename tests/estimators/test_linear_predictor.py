"""GLM linear predictors found in model code, and Gauss-Hermite on them (Khan & Lin 2017)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.estimators.linear_predictor import find_linear_predictor
from blrppl.estimators.quadrature import gauss_hermite
from blrppl.families.mvn import MVNStats
from tests.compiles import cheap_jit

RNG = np.random.default_rng(3)
X = jnp.asarray(RNG.normal(size=(40, 2)))
COUNTS = jnp.asarray(RNG.poisson(2.0, 40).astype(float))
BINARY = jnp.asarray((RNG.random(40) < 0.4).astype(float))


def logistic(z, data=()):
    return dist.Bernoulli(logits=X @ z).log_prob(BINARY)


def poisson_with_intercept(z, data=()):
    return dist.Poisson(jnp.exp(z[0] + X @ z[1:])).log_prob(COUNTS)


def heteroscedastic(z, data=()):
    return dist.Normal(X @ z, jnp.exp(z[0])).log_prob(COUNTS)


def coupled(z, data=()):
    return jnp.full((40,), jnp.sum(X @ z) * 0.01) + X[:, 0] * z[0] ** 2


def logistic_of_data(z, data):
    design, y = data
    return dist.Bernoulli(logits=design @ z).log_prob(y)


def test_the_predictor_and_its_design_are_read_off_the_code():
    found = find_linear_predictor(logistic, jnp.zeros(2))
    np.testing.assert_allclose(found.design, X)
    np.testing.assert_allclose(found.offset, 0.0)
    found = find_linear_predictor(poisson_with_intercept, jnp.zeros(3))
    np.testing.assert_allclose(found.design, np.column_stack([np.ones(40), X]))
    eta = found.design @ jnp.array([0.1, 0.2, -0.3])
    np.testing.assert_allclose(found.log_likelihood(eta), poisson_with_intercept(jnp.array([0.1, 0.2, -0.3])))


def logistic_coupled_by_data(z, data):
    design, y, w = data
    eta = design @ z
    return dist.Bernoulli(logits=eta).log_prob(y) + w * jnp.sum(eta**2)  # every η_m in each term unless w = 0


def test_the_replay_recomputes_the_design_and_rechecks_the_structure_on_new_data():
    zero = jnp.asarray(0.0)
    found = find_linear_predictor(logistic_coupled_by_data, jnp.zeros(2), (X, BINARY, zero))
    assert found is not None  # with w = 0 each term reads its own η_n
    design, offset, ok = cheap_jit(found.replay)((2.0 * X, 1.0 - BINARY, zero))
    np.testing.assert_allclose(design, 2.0 * X, rtol=1e-14)
    np.testing.assert_allclose(offset, 0.0)
    assert bool(ok)
    # w = 0.3: the same code is no longer elementwise in η; the host would refuse it too.
    assert not bool(cheap_jit(found.replay)((X, BINARY, jnp.asarray(0.3)))[2])
    assert find_linear_predictor(logistic_coupled_by_data, jnp.zeros(2), (X, BINARY, jnp.asarray(0.3))) is None
    batch = cheap_jit(jax.vmap(found.replay))((jnp.stack([X, X]), jnp.stack([BINARY, BINARY]), jnp.asarray([0.0, 0.3])))
    assert batch[2].tolist() == [True, False]


def test_the_likelihood_takes_other_data_of_the_same_shapes():
    found = find_linear_predictor(logistic_of_data, jnp.zeros(2), (X, BINARY))
    np.testing.assert_allclose(found.design, X)
    flipped = 1.0 - BINARY
    eta = X @ jnp.array([0.3, -0.2])
    np.testing.assert_allclose(
        cheap_jit(found.log_likelihood)(eta, (X, flipped)), logistic_of_data(jnp.array([0.3, -0.2]), (X, flipped))
    )


@pytest.mark.parametrize("fn", [heteroscedastic, coupled])
def test_no_predictor_when_the_latents_enter_otherwise(fn):
    assert find_linear_predictor(fn, jnp.zeros(2)) is None


def logistic_model(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def test_glm_site_parameters_equal_tensor_quadrature(rng_key):
    """Gauss-Hermite on each η_n (20 nodes) = 2-d tensor Gauss-Hermite on beta (80^2 nodes) to 1e-4."""
    engine = blrppl.NonConjugateVI(logistic_model, estimator="quadrature")
    plan = engine.plan(X, y=BINARY)
    est = {e.factor: e for e in plan.estimators}["y"]
    assert est.method.label == "quadrature"
    cov = jnp.array([[0.3, 0.1], [0.1, 0.5]])
    m = jnp.array([0.4, -0.7])
    mean = MVNStats(x=m, xxT=cov + jnp.outer(m, m))
    value, grads = est.estimate(rng_key, {"beta": mean}, {}, plan.arrays)
    ref_value, ref = gauss_hermite(80, max_dim=2).estimate(None, mean, lambda z: jnp.sum(logistic(z)))
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(grads["beta"].x, ref.x, rtol=1e-4)
    np.testing.assert_allclose(grads["beta"].xxT, ref.xxT, rtol=1e-4, atol=1e-4 * np.abs(ref.xxT).max())


def test_auto_uses_the_predictor_and_converges_deterministically(rng_key):
    result = blrppl.NonConjugateVI(logistic_model, learning_rate=0.5).run(
        rng_key, 80, X, y=BINARY, progress_bar=False
    )
    assert result.estimators == {"beta": "exact", "y": "quadrature"}
    # Deterministic site parameters: the ELBO settles to many digits.
    np.testing.assert_allclose(result.elbo[-1], result.elbo[-2], rtol=1e-10)


def varying_intercepts(group, x, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
    with numpyro.plate("G", 3):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=a[group] + beta * x), obs=y)


def test_several_mean_field_neighbours_share_one_predictor(rng_key):
    """η = a[group] + beta x over two q blocks: quadrature = Monte Carlo (200k draws) within its noise."""
    from blrppl.estimators.monte_carlo import monte_carlo
    from blrppl.families.normal import NormalStats

    group = jnp.asarray(np.arange(40) % 3)
    plan = blrppl.NonConjugateVI(varying_intercepts).plan(group, X[:, 0], y=BINARY)
    est = {e.factor: e for e in plan.estimators}["y"]
    assert est.method.label == "quadrature" and set(est.neighbours) == {"a", "beta"}
    mean = {
        "a": NormalStats(x=jnp.array([0.3, -0.2, 0.5]), x_sq=jnp.array([0.3, -0.2, 0.5]) ** 2 + jnp.array([0.2, 0.4, 0.3])),
        "beta": NormalStats(x=jnp.array(0.7), x_sq=jnp.array(0.7**2 + 0.25)),
    }
    value, grads = est.estimate(rng_key, mean, {}, plan.arrays)

    def log_f(xs):
        return jnp.sum(dist.Bernoulli(logits=xs["a"][group] + xs["beta"] * X[:, 0]).log_prob(BINARY))

    ref_value, ref = monte_carlo(200_000, hessian="reparam", separable=False).estimate(jax.random.key(3), mean, log_f)
    np.testing.assert_allclose(value, ref_value, rtol=2e-3)
    for v in ("a", "beta"):
        np.testing.assert_allclose(grads[v].x, ref[v].x, rtol=3e-2, atol=3e-2)
        np.testing.assert_allclose(grads[v].x_sq, ref[v].x_sq, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("case", ["full block", "mean-field blocks"])
def test_a_newton_start_takes_the_predictors_delta_method_which_differentiating_the_code_gives(rng_key, case):
    """A GLM factor's start estimator is the delta method on its linear predictors (ℓ, ℓ', ℓ''
    at A m + o: one pass over the rows), on the fit's own arrays: the same value and site
    parameters as the delta method by differentiating the model's code twice."""
    from blrppl.estimators.nonconjugate import nonconjugate_estimator
    from blrppl.families.normal import NormalStats

    if case == "full block":
        plan = blrppl.NonConjugateVI(logistic_model).plan(X, y=BINARY)
        m = jnp.array([0.4, -0.7])
        mean = {"beta": MVNStats(x=m, xxT=jnp.array([[0.3, 0.1], [0.1, 0.5]]) + jnp.outer(m, m))}
    else:
        group = jnp.asarray(np.arange(40) % 3)
        plan = blrppl.NonConjugateVI(varying_intercepts).plan(group, X[:, 0], y=BINARY)
        a = jnp.array([0.3, -0.2, 0.5])
        mean = {"a": NormalStats(x=a, x_sq=a**2 + 0.2), "beta": NormalStats(x=jnp.array(0.7), x_sq=jnp.array(0.74))}
    est = {e.factor: e for e in plan.estimators}["y"]
    start = {e.factor: e for e in plan.start_estimators}["y"]
    assert est.method.label == "quadrature" and start.method.label == "delta"
    assert jax.tree.structure(start.arrays) == jax.tree.structure(est.arrays)  # (A, o): the fit's own arrays
    for got, want in zip(jax.tree.leaves(start.arrays), jax.tree.leaves(est.arrays)):
        np.testing.assert_array_equal(got, want)
    examples = {v: jnp.zeros(q.shape) for v, q in plan.qs.items()}
    generic = nonconjugate_estimator(plan.graph, "y", plan.qs, examples, "delta", 1, "start")
    value, grads = start.estimate(rng_key, mean, {}, plan.arrays)
    ref_value, ref = generic.estimate(rng_key, mean, {}, plan.arrays)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    for v in ref:
        for got, want in zip(grads[v], ref[v]):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
