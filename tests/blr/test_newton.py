"""Damped Newton candidates on a concave objective in natural parameters."""

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr.newton import newton_candidate, symmetric


def test_one_newton_step_solves_a_quadratic_and_keeps_matrices_symmetric():
    target = {"x": jnp.array([1.0, -2.0]), "m": jnp.array([[2.0, 0.5], [0.5, 3.0]])}

    def objective(nat):  # concave, maximised at the (symmetric) target
        return -jnp.sum((nat["x"] - target["x"]) ** 2) - jnp.sum((nat["m"] - target["m"]) ** 2)

    start = {"x": jnp.zeros(2), "m": jnp.array([[1.0, 0.0], [2.0, 1.0]])}
    natural, value = newton_candidate(objective, start)
    np.testing.assert_allclose(natural["x"], target["x"], atol=1e-6)
    np.testing.assert_allclose(natural["m"], target["m"], atol=1e-6)
    np.testing.assert_allclose(natural["m"], natural["m"].T)
    assert abs(float(value)) < 1e-10


def test_candidates_that_are_not_finite_lose():
    def objective(nat):  # -inf outside x > 0: the undamped step lands there
        x = nat["x"]
        return jnp.where(x[0] > 0, jnp.log(jnp.abs(x[0])) - x[0], -jnp.inf)

    natural, value = newton_candidate(objective, {"x": jnp.array([3.0])})
    assert np.isfinite(float(value)) and float(natural["x"][0]) > 0


def test_symmetric_touches_square_matrices_only():
    tree = symmetric({"v": jnp.arange(3.0), "m": jnp.array([[0.0, 2.0], [0.0, 0.0]]), "r": jnp.ones((2, 3))})
    np.testing.assert_allclose(tree["m"], [[0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(tree["r"], np.ones((2, 3)))
