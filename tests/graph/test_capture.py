"""Constructor capture: what a traced model's distributions hold, and what building them costs."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.distributions.distribution import validation_enabled

from blrppl.graph.capture import capturing_constructors, constructor_call
from tests.compiles import compilations, compiled_names


def batch_of_precisions(n, d, seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, d, d))
    return jnp.asarray(a @ np.swapaxes(a, -1, -2) + d * np.eye(d)), jnp.asarray(rng.normal(size=(n, d)))


@pytest.mark.parametrize("argument", ["precision_matrix", "covariance_matrix", "scale_tril"])
def test_a_concrete_mvn_is_built_by_one_program_and_equals_numpyros(argument):
    matrix, loc = batch_of_precisions(7, 3, seed=len(argument))
    if argument == "scale_tril":
        matrix = jnp.linalg.cholesky(matrix)
    expected = dist.MultivariateNormal(loc, **{argument: matrix})
    with compilations() as compiled, capturing_constructors():
        built = dist.MultivariateNormal(loc, **{argument: matrix})
    # At most one compiled program (none per operation of numpyro's factorisation; none at all
    # where numpy computes it, blrppl.host_ops: batched triangular solves it leaves to XLA).
    assert compiled_names(compiled) in ([], ["jit(evaluate)"]), compiled_names(compiled)
    assert type(built) is dist.MultivariateNormal
    np.testing.assert_allclose(built.scale_tril, expected.scale_tril, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(built.loc, expected.loc)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 3)))
    np.testing.assert_allclose(built.log_prob(x), expected.log_prob(x), rtol=1e-12)
    call = constructor_call(built)  # the arguments as the model wrote them
    assert call.captured and call.arguments[argument] is matrix


def test_an_invalid_matrix_is_refused_as_numpyro_refuses_it():
    matrix, loc = batch_of_precisions(4, 2, seed=1)
    with validation_enabled(True), capturing_constructors(), pytest.raises(ValueError, match="MultivariateNormal"):
        dist.MultivariateNormal(loc, precision_matrix=-matrix)


def test_an_mvn_inside_a_trace_is_built_there():
    matrix, loc = batch_of_precisions(3, 2, seed=2)

    def log_density(m):
        with capturing_constructors():
            return dist.MultivariateNormal(m, precision_matrix=matrix).log_prob(jnp.zeros(2)).sum()

    value, grad = jax.value_and_grad(log_density)(loc)
    expected = dist.MultivariateNormal(loc, precision_matrix=matrix).log_prob(jnp.zeros(2)).sum()
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    assert grad.shape == loc.shape
