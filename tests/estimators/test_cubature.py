"""The one-Cholesky value, gradient and Hessian of a Gaussian likelihood against autodiff."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.estimators.cubature import mvn_value_grad_hessian
from tests.compiles import cheap_jit


def _moments(x, num_params):
    """K(u) (a squared-exponential kernel plus noise) and m(u) (a line whose slope and level are
    parameters), with every parameter entering K and the first two entering m too."""

    def moments(u):
        var, noise, length = jnp.exp(u[0]), jnp.exp(u[1]), jnp.exp(u[-1]) if num_params > 2 else 0.7
        k = var * jnp.exp(-0.5 * ((x[:, None] - x[None]) / length) ** 2) + (noise + 1e-6) * jnp.eye(x.shape[0])
        return k, u[0] * x + jnp.sin(u[1])

    return moments


@pytest.mark.parametrize("num_params", [2, 3])
def test_value_gradient_and_hessian_equal_autodiff(num_params):
    rng = np.random.default_rng(0)
    x = jnp.asarray(np.linspace(-1.0, 1.0, 30))
    y = jnp.asarray(rng.normal(size=30))
    moments = _moments(x, num_params)
    u = jnp.asarray([0.2, -1.3, -0.4][:num_params])

    def log_density(u):
        cov, loc = moments(u)
        return jax.scipy.stats.multivariate_normal.logpdf(y, loc, cov)

    value, grad, hessian = cheap_jit(mvn_value_grad_hessian(moments, y))(u)
    expected = cheap_jit(lambda u: (log_density(u), jax.grad(log_density)(u), jax.hessian(log_density)(u)))(u)
    np.testing.assert_allclose(value, expected[0], rtol=1e-12)
    np.testing.assert_allclose(grad, expected[1], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(hessian, expected[2], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(hessian, hessian.T)


def test_the_delta_rule_reads_the_mean_alone_whatever_the_covariance():
    # Laplace's guard evaluates log f at q's mean with no spread (Σ = 0): the one node is the
    # mean itself, never mean + 0 @ chol(Σ), whose Cholesky of a zero matrix is NaN.
    from blrppl.estimators.cubature import cubature
    from blrppl.families.mvn import MVNStats

    def log_f(u):
        return -0.5 * jnp.sum((u - 1.0) ** 2) + jnp.sin(u[0])

    m = jnp.asarray([0.3, -0.2])
    for spread, second_order in ((jnp.zeros((2, 2)), True), (0.5 * jnp.eye(2), False)):
        mean = MVNStats(x=m, xxT=spread + jnp.outer(m, m))
        value, _ = cubature(at_mean=True, second_order=second_order).estimate(None, mean, log_f)
        np.testing.assert_allclose(value, log_f(m), rtol=1e-12)
