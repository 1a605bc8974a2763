"""The jit-safe Newton solvers behind μ -> λ, on wide parameter grids."""

import math

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma

from blrppl.families import GAMMA, WISHART, GammaStats, WishartStats
from blrppl.families.dirichlet import inverse_digamma, solve_dirichlet
from blrppl.families.gamma import solve_log_minus_digamma
from blrppl.families.wishart import solve_degrees_of_freedom
from tests.compiles import cheap_jit


def test_gamma_shape_solver_on_a_wide_grid():
    a = jnp.logspace(-3, 4, 200)
    solved = cheap_jit(solve_log_minus_digamma)(jnp.log(a) - digamma(a))
    np.testing.assert_allclose(solved, a, rtol=1e-8)


def test_inverse_digamma_on_a_wide_grid():
    x = jnp.logspace(-3, 4, 200)
    np.testing.assert_allclose(cheap_jit(inverse_digamma)(digamma(x)), x, rtol=1e-10)


def test_dirichlet_solver_on_random_concentrations():
    rng = np.random.default_rng(0)
    solve = cheap_jit(solve_dirichlet)
    for k in (2, 3, 10):
        alpha = jnp.asarray(10 ** rng.uniform(-2, 3, size=(500, k)))
        mean_log = digamma(alpha) - digamma(alpha.sum(-1, keepdims=True))
        np.testing.assert_allclose(solve(mean_log), alpha, rtol=1e-7)


def test_wishart_degrees_of_freedom_solver():
    for d in (1, 2, 3, 6):
        n = jnp.logspace(-2, 4, 100) + d - 1
        offsets = jnp.arange(d) / 2
        multidigamma = digamma(n[:, None] / 2 - offsets).sum(-1)
        target = multidigamma + d * math.log(2.0) - d * jnp.log(n)
        solved = cheap_jit(solve_degrees_of_freedom, static_argnums=1)(target, d)
        np.testing.assert_allclose(solved, n, rtol=1e-8)


def test_one_dimensional_wishart_is_a_gamma():
    """W(n, v) on 1 x 1 matrices is Gamma(n/2, rate 1/(2v)); λ and A coincide."""
    log_x, x = jnp.array([0.5, 2.0]), jnp.array([-0.3, -1.7])
    gamma = GammaStats(log_x=log_x, x=x)
    wishart = WishartStats(x=x[:, None, None], log_det_x=log_x)
    np.testing.assert_allclose(
        WISHART.log_normalizer(wishart), GAMMA.log_normalizer(gamma), rtol=1e-12
    )
    mean = WISHART.mean_params(wishart)
    np.testing.assert_allclose(mean.x[:, 0, 0], GAMMA.mean_params(gamma).x, rtol=1e-12)
    np.testing.assert_allclose(
        mean.log_det_x, GAMMA.mean_params(gamma).log_x, rtol=1e-12
    )
