"""The oscillation damping of cubature fits (:mod:`blrppl.blr.damping`) on linear fixed-point maps."""

import jax
import jax.numpy as jnp
import numpy as np

import blrppl
from blrppl.blr import damping
from models import gp


def _iterate(matrix, offset, steps, damped):
    """x <- x + rho (F(x) - x) with F(x) = A x + b; returns the iterates and the rates taken."""
    x = {"v": jnp.zeros(matrix.shape[0])}
    state = damping.init(x)
    xs, rates = [], []
    for _ in range(steps):
        rate = state.next if damped else jnp.ones(())
        new = {"v": x["v"] + rate * (matrix @ x["v"] + offset - x["v"])}
        state = damping.observe(state, x, new, rate)
        x = new
        xs.append(np.asarray(x["v"]))
        rates.append(float(rate))
    return np.array(xs), np.array(rates)


def _linear_map(eigenvalues):
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(len(eigenvalues),) * 2))
    matrix = jnp.asarray(q @ np.diag(eigenvalues) @ q.T)
    offset = jnp.asarray(np.linspace(-1.0, 2.0, len(eigenvalues)))
    fixed = np.linalg.solve(np.eye(len(eigenvalues)) - np.asarray(matrix), np.asarray(offset))
    return matrix, offset, fixed


def test_an_oscillating_iteration_is_damped_to_the_same_fixed_point_in_fewer_steps():
    matrix, offset, fixed = _linear_map([-0.8, 0.2, 0.05])
    plain, _ = _iterate(matrix, offset, 40, damped=False)
    damped, rates = _iterate(matrix, offset, 40, damped=True)
    error = lambda xs: np.max(np.abs(xs - fixed), axis=1)  # noqa: E731
    assert error(damped)[-1] < 1e-12  # the fixed point is F's own
    steps = lambda xs: int(np.argmax(error(xs) < 1e-8))  # noqa: E731
    assert error(plain)[-1] > 1e-5  # |e| = 0.8 at rho = 1: slow, oscillating
    assert steps(damped) <= 15
    # The rate settles near 1 / (1 - e) = 1 / 1.8 for the dominant eigenvalue -0.8.
    assert abs(rates[5] - 1.0 / 1.8) < 0.05
    assert rates[0] == rates[1] == 1.0  # no estimate before two steps


def test_a_monotone_iteration_keeps_rate_one():
    matrix, offset, _ = _linear_map([0.6, 0.3, 0.1])
    plain, _ = _iterate(matrix, offset, 20, damped=False)
    damped, rates = _iterate(matrix, offset, 20, damped=True)
    assert np.all(rates == 1.0)
    np.testing.assert_array_equal(plain, damped)


def test_non_finite_parameters_do_not_poison_the_estimate():
    state = damping.init({"v": jnp.zeros(2)})
    old = {"v": jnp.array([-jnp.inf, 1.0])}
    state = damping.observe(state, old, {"v": jnp.array([-jnp.inf, 2.0])}, jnp.ones(()))
    state = damping.observe(state, {"v": jnp.array([-jnp.inf, 2.0])}, {"v": jnp.array([-jnp.inf, 1.5])}, jnp.ones(()))
    assert np.isfinite(float(state.next)) and 0.0 < float(state.next) <= 1.0


def test_a_gaussian_process_fit_is_damped_to_the_same_fixed_point_in_fewer_steps():
    """numpyro's GP example: at ρ = 1 the hyperparameters' steps circle their fixed point (the ELBO
    rises and falls); ``learning_rate="auto"`` damps them: half the steps, the same q."""
    args, kwargs = gp.data(25)

    def fit(rate):
        engine = blrppl.NonConjugateVI(gp.model, learning_rate=rate)
        return engine.run(jax.random.key(0), 100, *args, progress_bar=False, tol=1e-6, **kwargs)

    damped, plain = fit("auto"), fit(1.0)
    assert damped.state.damping is not None and plain.state.damping is None
    assert np.any(np.diff(np.asarray(plain.elbo)) < 0)
    assert np.all(np.diff(np.asarray(damped.elbo)) > 0)
    assert damped.converged and len(damped.elbo) <= 0.6 * len(plain.elbo)
    for site in ("kernel_var", "kernel_noise", "kernel_length"):
        q, p = damped.posterior[site], plain.posterior[site]
        assert abs(float(q._loc - p._loc)) < 2e-3 * float(p._scale), site
        assert abs(float(q._scale / p._scale) - 1.0) < 2e-3, site
