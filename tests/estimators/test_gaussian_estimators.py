"""Non-conjugate natural-gradient estimators for Gaussian q (Khan & Rue, Eqs. 10-11).

Oracles: conjugate closed forms (quadrature ≡ conjugate message), autodiff
Hessians (delta ≡ Newton), high-order quadrature (Monte Carlo within k standard
errors, dynamax ``mc_std`` style), and ELBO stationarity at the BLR fixed point.
"""

from __future__ import annotations

import functools
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammaln

from blrppl.estimators.delta import delta
from blrppl.estimators.gaussian import (
    natural_gradient,
    positive_definite_step,
    precision,
    precision_is_positive_definite,
)
from blrppl.estimators.monte_carlo import monte_carlo
from blrppl.estimators.quadrature import gauss_hermite
from blrppl.families import mvn
from blrppl.families.mvn import MVNStats
from blrppl.families.normal import NormalStats
from tests.compiles import cheap_jit

NUM_STD = 6.0


# Test inputs and oracles are NumPy or jitted: eager JAX compiles every primitive.


def _mvn_mean(loc, cov):
    loc, cov = np.asarray(loc, float), np.asarray(cov, float)
    return MVNStats(x=loc, xxT=cov + loc[..., :, None] * loc[..., None, :])


def _normal_mean(loc, var):
    loc, var = np.asarray(loc, float), np.asarray(var, float)
    return NormalStats(x=loc, x_sq=var + loc**2)


def _random_cov(rs, dim, scale=0.3):
    a = rs.normal(size=(dim, dim)) * scale
    return a @ a.T + scale * np.eye(dim)


def _logistic(y, eta):
    return y * eta - jnp.logaddexp(0.0, eta)


def _poisson(y, eta):
    return y * eta - jnp.exp(eta) - gammaln(y + 1.0)


def _run(estimator, mean, log_factor, rng_key=None):
    """``estimator.estimate`` under ``jit`` (as the engine calls it; eager is slow)."""
    return cheap_jit(lambda mu: estimator.estimate(rng_key, mu, log_factor))(mean)


def _assert_tree_close(actual, expected, rtol=1e-10, atol=1e-12):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


# 1. Quadrature and the delta method are exact on quadratic log factors.


def test_quadratic_factor_gives_the_conjugate_message_elementwise():
    y = np.array([1.3, -0.4, 2.0])
    var = np.array([0.5, 2.0, 0.1])
    mean = _normal_mean([0.2, 1.0, -0.5], [2.0, 0.3, 1.5])

    def log_factor(x):  # log N(y | x, σ²), per element
        return -0.5 * (y - x) ** 2 / var - 0.5 * jnp.log(2 * jnp.pi * var)

    expected = NormalStats(x=y / var, x_sq=-0.5 / var)
    loc, v = mean.x, mean.x_sq - mean.x**2
    expected_value = np.sum(
        -0.5 * ((y - loc) ** 2 + v) / var - 0.5 * np.log(2 * np.pi * var)
    )
    for estimator in (gauss_hermite(3), gauss_hermite(7)):
        value, nat_grad = _run(estimator, mean, log_factor)
        _assert_tree_close(nat_grad, expected)
        np.testing.assert_allclose(value, expected_value, rtol=1e-10)
    for estimator in (delta(), delta(separable=True)):
        _, nat_grad = _run(estimator, mean, log_factor)
        _assert_tree_close(nat_grad, expected)


def test_quadratic_factor_gives_the_conjugate_message_for_full_blocks():
    # Two independent 2-d blocks, each observed through y_b ~ N(A x_b, R).
    rs = np.random.RandomState(0)
    a_matrix = rs.normal(size=(3, 2))
    noise_cov = _random_cov(rs, 3)
    y = rs.normal(size=(2, 3))
    mean = _mvn_mean(
        rs.normal(size=(2, 2)), np.stack([_random_cov(rs, 2) for _ in range(2)])
    )
    noise_prec = np.linalg.inv(noise_cov)

    def log_factor(x):
        r = y - x @ a_matrix.T
        return -0.5 * jnp.einsum("bi,ij,bj->", r, noise_prec, r)

    info = a_matrix.T @ noise_prec @ a_matrix
    expected = MVNStats(
        x=y @ noise_prec @ a_matrix, xxT=np.broadcast_to(-0.5 * info, (2, 2, 2))
    )
    for estimator in (gauss_hermite(3), delta(), delta(separable=True)):
        _, nat_grad = _run(estimator, mean, log_factor)
        _assert_tree_close(nat_grad, expected)


def test_one_blr_step_with_quadrature_is_exact_bayes():
    # y ~ N(z, 0.5²) x3, z ~ N(0, 1): ρ = 1 lands on the exact posterior.
    y = np.array([0.3, 1.1, 0.8])
    prior = NormalStats(x=np.array(0.0), x_sq=np.array(-0.5))
    mean = _normal_mean(0.0, 1.0)
    _, g = _run(gauss_hermite(3), mean, lambda z: jnp.sum(-0.5 * (y - z) ** 2 / 0.25))
    posterior = jax.tree.map(np.add, prior, g)
    prec = 1.0 + 3 / 0.25
    np.testing.assert_allclose(-2 * posterior.x_sq, prec, rtol=1e-12)
    np.testing.assert_allclose(posterior.x / prec, y.sum() / 0.25 / prec, rtol=1e-12)


# 2. The delta method is Newton's method.


def test_delta_equals_newton_for_a_diagonal_q():
    rs = np.random.RandomState(1)
    design = rs.normal(size=(7, 3))
    y = rs.binomial(1, 0.5, size=7).astype(float)
    mean = _normal_mean(rs.normal(size=3), np.full(3, 0.4))

    def log_factor(beta):  # not separable in beta's elements
        return jnp.sum(_logistic(y, design @ beta)) - 0.1 * jnp.sum(beta**4)

    m = mean.x
    g, h = cheap_jit(
        lambda x: (jax.grad(log_factor)(x), jnp.diag(jax.hessian(log_factor)(x)))
    )(m)
    value, nat_grad = _run(delta(), mean, log_factor)
    _assert_tree_close(nat_grad, NormalStats(x=g - h * m, x_sq=h / 2))
    # E_q of log f's quadratic expansion at m: log f(m) + tr(H S) / 2 (the diagonal of H here)
    np.testing.assert_allclose(value, cheap_jit(log_factor)(m) + 0.5 * np.sum(h * 0.4), rtol=1e-12)
    first_order, _ = _run(delta(second_order=False), mean, log_factor)  # a Newton start's value
    np.testing.assert_allclose(first_order, cheap_jit(log_factor)(m), rtol=1e-12)


@pytest.mark.parametrize("separable", [False, True])
def test_delta_equals_newton_for_full_blocks(separable):
    rs = np.random.RandomState(2)
    weights = rs.normal(size=(2, 3))
    mean = _mvn_mean(
        rs.normal(size=(2, 3)), np.stack([_random_cov(rs, 3) for _ in range(2)])
    )

    def block_log_factor(x, w):
        return -jnp.logaddexp(0.0, x @ w) * jnp.sum(x**2) - jnp.sum(jnp.cosh(x))

    def log_factor(x):  # a sum over the two blocks: separable across blocks
        return jnp.sum(jax.vmap(block_log_factor)(x, weights))

    @cheap_jit
    def newton(m, w):  # per block, by autodiff
        h = jax.hessian(block_log_factor)(m, w)
        return MVNStats(jax.grad(block_log_factor)(m, w) - h @ m, h / 2)

    expected = jax.tree.map(
        lambda *b: np.stack(b), *[newton(mean.x[b], weights[b]) for b in range(2)]
    )
    _, nat_grad = _run(delta(separable=separable), mean, log_factor)
    _assert_tree_close(nat_grad, expected)


# 3. Monte Carlo agrees with high-order quadrature within k standard errors.

Case = namedtuple("Case", ["name", "mean", "log_factor", "reference", "separable"])


def _logistic_block_case():
    rs = np.random.RandomState(3)
    design = rs.normal(size=(6, 2))
    y = rs.binomial(1, 0.5, size=6).astype(float)
    mean = _mvn_mean([0.5, -0.3], _random_cov(rs, 2, 0.5))

    def log_factor(beta):
        return jnp.sum(_logistic(y, design @ beta))

    return Case(
        "logistic-mvn2",
        mean,
        log_factor,
        lambda: _run(gauss_hermite(30), mean, log_factor),
        False,
    )


def _poisson_diagonal_case():
    y = np.array([0.0, 3.0, 1.0, 7.0])
    mean = _normal_mean([0.1, 0.8, -0.5, 1.9], [0.3, 0.2, 0.5, 0.05])

    def log_factor(x):  # elementwise Poisson, log link
        return _poisson(y, x)

    return Case(
        "poisson-diag",
        mean,
        log_factor,
        lambda: _run(gauss_hermite(40), mean, log_factor),
        True,
    )


def _logistic_diagonal_case():
    # A mean-field q over a coupled (non-separable) factor; the reference is the
    # full-block quadrature with diagonal Σ, converted to diag(E[H]) in both terms.
    rs = np.random.RandomState(4)
    design = rs.normal(size=(6, 2))
    y = rs.binomial(1, 0.5, size=6).astype(float)
    loc, var = np.array([0.4, -0.6]), np.array([0.6, 0.3])
    mean = _normal_mean(loc, var)

    def log_factor(beta):
        return jnp.sum(_logistic(y, design @ beta))

    def reference():
        value, full = _run(gauss_hermite(30), _mvn_mean(loc, np.diag(var)), log_factor)
        hessian = 2 * np.asarray(full.xxT)
        grad = full.x + hessian @ loc
        return value, natural_gradient(mean, grad, np.diag(hessian))

    return Case("logistic-diag", mean, log_factor, reference, False)


def _cached(case):
    return case._replace(reference=functools.cache(case.reference))


MC_CASES = [
    _cached(c())
    for c in (_logistic_block_case, _poisson_diagonal_case, _logistic_diagonal_case)
]


MC_OPTIONS = [(h, False) for h in ("reparam", "hvp", "first_order")] + [
    ("first_order", True)
]


@pytest.mark.parametrize(
    "hessian, antithetic",
    MC_OPTIONS,
    ids=[h + ("-antithetic" if a else "") for h, a in MC_OPTIONS],
)
@pytest.mark.parametrize("case", MC_CASES, ids=lambda c: c.name)
def test_monte_carlo_within_six_standard_errors(rng_key, case, hessian, antithetic):
    estimator = monte_carlo(
        20, hessian, antithetic=antithetic, separable=case.separable
    )
    keys = jax.random.split(rng_key, 300)
    values, grads = cheap_jit(
        jax.vmap(lambda k: estimator.estimate(k, case.mean, case.log_factor))
    )(keys)
    ref_value, ref_grad = case.reference()
    for estimates, exact in [(values, ref_value)] + list(zip(grads, ref_grad)):
        estimates = np.asarray(estimates)
        standard_error = np.std(estimates, axis=0) / np.sqrt(len(estimates))
        error = np.abs(np.mean(estimates, axis=0) - np.asarray(exact))
        assert np.all(error <= NUM_STD * standard_error + 1e-10), (
            error,
            standard_error,
        )


def _two_block_problem():
    """log f(a, b) = Σ ℓ(y, a + X b): a scalar Normal a and a 2-d MVN b, mean-field."""
    rs = np.random.RandomState(10)
    design = rs.normal(size=(8, 2))
    y = rs.binomial(1, 0.5, size=8).astype(float)
    mean = {
        "a": _normal_mean(0.3, 0.4),
        "b": _mvn_mean([0.5, -0.2], _random_cov(rs, 2, 0.5)),
    }

    def log_factor(values):
        return jnp.sum(_logistic(y, values["a"] + design @ values["b"]))

    # Reference: quadrature on the joint 3-d Gaussian (block-diagonal covariance),
    # then each block's natural gradient from its own blocks of E[g] and E[H].
    loc = np.concatenate([[mean["a"].x], mean["b"].x])
    cov = np.zeros((3, 3))
    cov[0, 0] = mean["a"].x_sq - mean["a"].x ** 2
    cov[1:, 1:] = mean["b"].xxT - np.outer(mean["b"].x, mean["b"].x)
    value, joint = _run(
        gauss_hermite(16),
        _mvn_mean(loc, cov),
        lambda x: log_factor({"a": x[0], "b": x[1:]}),
    )
    hessian = 2 * np.asarray(joint.xxT)
    grad = np.asarray(joint.x) + hessian @ loc
    reference = {
        "a": natural_gradient(mean["a"], grad[0], hessian[0, 0]),
        "b": natural_gradient(mean["b"], grad[1:], hessian[1:, 1:]),
    }
    return mean, log_factor, (value, reference)


@pytest.mark.parametrize("hessian", ["reparam", "hvp", "first_order"])
def test_monte_carlo_on_several_blocks(rng_key, hessian):
    mean, log_factor, (ref_value, reference) = _two_block_problem()
    estimator = monte_carlo(20, hessian)
    keys = jax.random.split(rng_key, 300)
    values, grads = cheap_jit(
        jax.vmap(lambda k: estimator.estimate(k, mean, log_factor))
    )(keys)
    pairs = [(values, ref_value)] + list(
        zip(jax.tree.leaves(grads), jax.tree.leaves(reference))
    )
    for estimates, exact in pairs:
        estimates = np.asarray(estimates)
        standard_error = np.std(estimates, axis=0) / np.sqrt(len(estimates))
        error = np.abs(np.mean(estimates, axis=0) - np.asarray(exact))
        assert np.all(error <= NUM_STD * standard_error + 1e-10), (
            error,
            standard_error,
        )


@pytest.mark.parametrize("joint", [True, False], ids=["one-joint-pass", "per-block"])
def test_delta_on_several_blocks_is_blockwise_newton(joint, monkeypatch):
    import blrppl.estimators.delta as delta_module

    if not joint:  # blocks past the joint pass's size take one Hessian pass each
        monkeypatch.setattr(delta_module, "JOINT_HESSIAN_MAX_SIZE", 0)
    mean, log_factor, _ = _two_block_problem()
    loc = {"a": mean["a"].x, "b": mean["b"].x}

    @cheap_jit
    def newton(loc):
        grad = jax.grad(log_factor)(loc)
        h_a = jax.hessian(lambda a: log_factor({"a": a, "b": loc["b"]}))(loc["a"])
        h_b = jax.hessian(lambda b: log_factor({"a": loc["a"], "b": b}))(loc["b"])
        return {
            "a": NormalStats(grad["a"] - h_a * loc["a"], h_a / 2),
            "b": MVNStats(grad["b"] - h_b @ loc["b"], h_b / 2),
        }

    _, nat_grad = _run(delta(), mean, log_factor)
    _assert_tree_close(nat_grad, newton(loc))
    with pytest.raises(TypeError, match="one Gaussian block"):
        gauss_hermite(3).estimate(None, mean, log_factor)


def test_monte_carlo_reparam_is_exact_for_a_quadratic_hessian(rng_key):
    # Constant Hessian: E[H] has no noise; with antithetic pairs neither has E[g].
    mean = _normal_mean([0.2, 1.0], [2.0, 0.3])
    y, var = np.array([1.3, -0.4]), np.array([0.5, 2.0])
    _, nat_grad = _run(
        monte_carlo(4, antithetic=True),
        mean,
        lambda x: -0.5 * (y - x) ** 2 / var,
        rng_key,
    )
    _assert_tree_close(nat_grad, NormalStats(x=y / var, x_sq=-0.5 / var))


def test_monte_carlo_rejects_bad_options():
    with pytest.raises(ValueError, match="hessian"):
        monte_carlo(10, "exact")
    with pytest.raises(ValueError, match="even"):
        monte_carlo(5, antithetic=True)
    with pytest.raises(ValueError, match="num_samples"):
        monte_carlo(0)


# 4. Argument checks.


def test_gauss_hermite_refuses_large_full_blocks():
    mean = _mvn_mean(np.zeros(4), np.eye(4))
    with pytest.raises(ValueError, match="dimension 4"):
        gauss_hermite(5).estimate(None, mean, jnp.sum)
    with pytest.raises(ValueError, match="num_points"):
        gauss_hermite(0)


# 5. The BLR fixed point is a stationary point of the ELBO.


def test_blr_fixed_point_is_elbo_stationary():
    rs = np.random.RandomState(7)
    dim, num_obs = 2, 50
    design = rs.normal(size=(num_obs, dim))
    y = rs.binomial(1, 1 / (1 + np.exp(-design @ np.array([1.0, -1.5])))).astype(float)
    prior = MVNStats(x=np.zeros(dim), xxT=-0.5 * np.eye(dim))

    def log_factor(beta):
        return jnp.sum(_logistic(y, design @ beta))

    estimator = gauss_hermite(20)

    def target(natural):
        _, g = estimator.estimate(None, mvn.mean_params(natural), log_factor)
        return jax.tree.map(jnp.add, prior, g)  # λ₀ + ĝ (Khan & Rue, Eq. 58)

    @cheap_jit
    def run(natural):
        def body(_, lam):
            return positive_definite_step(lam, target(lam), 0.5)

        return jax.lax.fori_loop(0, 80, body, natural)

    natural = run(prior)
    assert bool(cheap_jit(precision_is_positive_definite)(natural))
    _assert_tree_close(cheap_jit(target)(natural), natural, rtol=1e-10, atol=1e-10)

    tril = np.tril_indices(dim)

    def elbo(loc, chol_entries):
        chol = jnp.zeros((dim, dim)).at[tril].set(chol_entries)
        cov = chol @ chol.T
        mean = MVNStats(x=loc, xxT=cov + jnp.outer(loc, loc))
        expected, _ = gauss_hermite(30).estimate(None, mean, log_factor)
        expected_prior = -0.5 * (jnp.trace(cov) + loc @ loc) - 0.5 * dim * jnp.log(
            2 * jnp.pi
        )
        entropy = 0.5 * dim * (1 + jnp.log(2 * jnp.pi)) + jnp.sum(
            jnp.log(jnp.abs(jnp.diag(chol)))
        )
        return expected + expected_prior + entropy

    cov = np.linalg.inv(-2 * np.asarray(natural.xxT))
    loc = cov @ np.asarray(natural.x)
    chol = np.linalg.cholesky(cov)
    grads = cheap_jit(jax.grad(elbo, argnums=(0, 1)))(loc, chol[tril])
    for g in grads:
        np.testing.assert_allclose(g, 0.0, atol=1e-9)
    assert np.linalg.norm(loc) > 0.5  # A data-driven optimum, far from the prior's.


# 6. The positive-definite safeguard.

_step = cheap_jit(positive_definite_step, static_argnames="only_if_needed")
_valid = cheap_jit(precision_is_positive_definite)


def _plain_step(natural, target, rho):
    return jax.tree.map(
        lambda a, b: (1 - rho) * np.asarray(a) + rho * np.asarray(b), natural, target
    )


def test_safeguard_keeps_diagonal_precisions_positive():
    natural = NormalStats(
        x=np.array([0.3, -1.0, 2.0]), x_sq=np.array([-0.5, -2.0, -0.1])
    )
    target = NormalStats(x=np.array([1.0, 0.5, -3.0]), x_sq=np.array([0.4, -1.0, 3.0]))
    for rho in (0.1, 0.5, 1.0):
        new = _step(natural, target, rho)
        assert np.all(_valid(new))
    assert not np.all(_valid(_plain_step(natural, target, 1.0)))


def test_safeguard_keeps_full_precisions_positive_definite():
    rs = np.random.RandomState(8)
    covs = np.stack([_random_cov(rs, 3) for _ in range(2)])
    loc = rs.normal(size=(2, 3))
    natural = MVNStats(
        x=np.linalg.solve(covs, loc[..., None])[..., 0], xxT=-0.5 * np.linalg.inv(covs)
    )
    q, _ = np.linalg.qr(rs.normal(size=(3, 3)))
    indefinite = q @ np.diag([2.0, -3.0, 0.5]) @ q.T
    target = MVNStats(x=rs.normal(size=(2, 3)), xxT=-0.5 * np.stack([indefinite] * 2))
    assert not np.any(_valid(target))
    for rho in (0.2, 0.7, 1.0):
        new = _step(natural, target, rho)
        assert np.all(_valid(new))
        np.testing.assert_allclose(new.xxT, np.swapaxes(new.xxT, -1, -2), atol=1e-12)
    assert not np.any(_valid(_plain_step(natural, target, 1.0)))


def test_safeguard_is_the_plain_step_to_second_order():
    rs = np.random.RandomState(9)
    s_old, s_target = (
        np.linalg.inv(_random_cov(rs, 3)),
        np.linalg.inv(_random_cov(rs, 3)),
    )
    natural = MVNStats(x=rs.normal(size=3), xxT=-0.5 * s_old)
    target = MVNStats(x=rs.normal(size=3), xxT=-0.5 * s_target)
    np.testing.assert_allclose(precision(natural), s_old, rtol=1e-12)
    gap = s_target - s_old
    loc = np.linalg.solve(s_old, natural.x)
    curvature = 0.5 * gap @ np.linalg.solve(s_old, gap)  # c / ρ², c = (ρ²/2) G S⁻¹ G
    for rho in (1e-2, 1e-3):
        new = _step(natural, target, rho)
        plain = _plain_step(natural, target, rho)
        diff = jax.tree.map(lambda a, b, r=rho: (np.asarray(a) - b) / r**2, new, plain)
        _assert_tree_close(
            diff,
            MVNStats(x=curvature @ loc, xxT=-0.5 * curvature),
            rtol=1e-5,
            atol=1e-7,
        )
    # With only_if_needed the (valid) plain step is taken as it is.
    _assert_tree_close(
        _step(natural, target, 0.5, only_if_needed=True),
        _plain_step(natural, target, 0.5),
    )


def test_safeguard_only_where_needed_on_a_mapping():
    natural = {"a": NormalStats(x=np.array([0.3, -1.0]), x_sq=np.array([-0.5, -2.0]))}
    target = {"a": NormalStats(x=np.array([1.0, 0.5]), x_sq=np.array([0.4, -1.0]))}
    new = _step(natural, target, 1.0, only_if_needed=True)
    improved = _step(natural, target, 1.0)
    np.testing.assert_allclose(new["a"].x[1], 0.5)  # the plain (VMP) step where valid
    np.testing.assert_allclose(new["a"].x_sq[0], improved["a"].x_sq[0])
    assert bool(_valid(new))


# 7. jit, vmap and dtypes.


def test_estimators_are_jit_and_vmap_safe(rng_key):
    y = np.array([1.0, 0.0, 1.0])
    mean = _normal_mean([[0.1, 0.2, 0.3], [0.0, -1.0, 1.0]], np.full((2, 3), 0.5))

    def log_factor(x):
        return _logistic(y, x)

    for estimator in (
        delta(separable=True),
        gauss_hermite(8),
        monte_carlo(8, "first_order"),
    ):
        batched = _run(estimator, mean, log_factor, rng_key)[1]

        def row(mu, estimator=estimator):
            return estimator.estimate(rng_key, mu, log_factor)[1]

        rows = cheap_jit(jax.vmap(row))(mean)
        if estimator.method != "mc":  # MC rows see different noise
            _assert_tree_close(batched, rows)
        assert jax.tree.map(np.shape, batched) == jax.tree.map(np.shape, mean)


def test_float32_inputs_stay_float32(rng_key):
    loc, cov = np.array([0.5, -0.3], np.float32), np.eye(2, dtype=np.float32) * 0.5
    mean = MVNStats(x=loc, xxT=cov + np.outer(loc, loc))
    design = np.ones((4, 2), np.float32)
    y = np.array([1.0, 0.0, 1.0, 1.0], np.float32)

    def log_factor(beta):
        return jnp.sum(_logistic(y, design @ beta))

    for estimator in (delta(), gauss_hermite(5), monte_carlo(4, "hvp")):
        value, g = _run(estimator, mean, log_factor, rng_key)
        assert value.dtype == jnp.float32
        assert all(leaf.dtype == jnp.float32 for leaf in g)
    natural = MVNStats(x=np.linalg.solve(cov, loc), xxT=-0.5 * np.linalg.inv(cov))
    assert all(leaf.dtype == jnp.float32 for leaf in _step(natural, natural, 0.5))


def test_the_product_rule_is_exact_for_a_scalar_and_a_plated_variable():
    """E over q(u) q(w_1..w_3) of a u^2 w_i + b u w_i^2 + c w_i (separable in w given u) and its
    gradients in the mean parameters (x = m, x_sq = m^2 + v), exact with 10 nodes per variable."""
    from blrppl.estimators.quadrature import gauss_hermite_product

    a, b, c = 0.7, -1.3, 0.4
    m_u, v_u = 0.3, 0.5
    m_w, v_w = np.array([0.2, -1.0, 1.5]), np.array([0.3, 0.8, 0.1])
    mean = {
        "u": NormalStats(x=jnp.asarray(m_u), x_sq=jnp.asarray(m_u**2 + v_u)),
        "w": NormalStats(x=jnp.asarray(m_w), x_sq=jnp.asarray(m_w**2 + v_w)),
    }

    def log_f(values):
        u, w = values["u"], values["w"]
        return a * u**2 * w + b * u * w**2 + c * w  # per element of w

    value, grads = gauss_hermite_product(10).estimate(None, mean, log_f)
    x_u, s_u, x_w, s_w = m_u, m_u**2 + v_u, m_w, m_w**2 + v_w
    np.testing.assert_allclose(value, a * s_u * x_w.sum() + b * x_u * s_w.sum() + c * x_w.sum(), rtol=1e-12)
    np.testing.assert_allclose(grads["u"].x, b * s_w.sum(), rtol=1e-10)
    np.testing.assert_allclose(grads["u"].x_sq, a * x_w.sum(), rtol=1e-10)
    np.testing.assert_allclose(grads["w"].x, a * s_u + c, rtol=1e-10)
    np.testing.assert_allclose(grads["w"].x_sq, np.full(3, b * x_u), rtol=1e-10, atol=1e-12)
