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


def test_deterministic_mean_field_steps_take_rate_one_damped_to_the_same_fixed_point():
    """Non-centred eight schools (Gauss-Hermite, mean-field): ``learning_rate="auto"`` takes ρ = 1
    with the guard and the damping, and reaches the fixed point of ρ = 0.2 (the default before)
    in a fraction of its steps."""
    from models import ZOO

    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()

    def fit(rate, tol):
        engine = blrppl.NonConjugateVI(entry.model, learning_rate=rate)
        return engine.run(jax.random.key(0), 2000, *args, progress_bar=False, tol=tol, **kwargs)

    auto, slow = fit("auto", 1e-10), fit(0.2, 1e-13)
    assert auto.state.damping is not None and slow.state.damping is None
    assert {"quadrature"} <= set(auto.estimators.values()) and "mc" not in set(auto.estimators.values())
    assert auto.converged and 4 * len(auto.elbo) < len(slow.elbo)
    assert np.all(np.diff(np.asarray(auto.elbo)) >= 0)
    # Undamped, ρ = 1 circles the fixed point: its ELBO falls on many steps and it does not converge.
    undamped = blrppl.NonConjugateVI(entry.model, learning_rate=1.0).run(
        jax.random.key(0), 200, *args, progress_bar=False, tol=1e-10, **kwargs
    )
    assert not undamped.converged and np.sum(np.diff(np.asarray(undamped.elbo)) < 0) > 50
    for site, q in slow.posterior.items():
        p = auto.posterior[site]
        sd = np.sqrt(np.asarray(q.variance))
        np.testing.assert_allclose(np.asarray(p.mean), np.asarray(q.mean), atol=1e-4 * float(np.max(sd)), err_msg=site)
        np.testing.assert_allclose(np.sqrt(np.asarray(p.variance)), sd, rtol=1e-4, err_msg=site)


def test_local_mode_keeps_its_damped_rate_where_the_damping_does_not_run():
    """Eq. 60 (local mode) is not damped: its ``"auto"`` rate stays 0.2 outside the cubature, since an
    undamped ρ = 1 circles non-centred eight schools' mean-field optimum without converging."""
    from models import ZOO

    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()
    local = blrppl.NonConjugateVI(entry.model, mode="local").run(
        jax.random.key(0), 300, *args, progress_bar=False, tol=1e-8, **kwargs
    )
    assert local.state.damping is None and local.converged
    assert np.all(np.diff(np.asarray(local.elbo)) >= 0)
