"""Small-block linear algebra of the chain Gaussian equals LAPACK (unrolled, d <= 4)."""

import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.families.chain_gaussian import linalg


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6])
def test_small_block_factorisations_match_numpy(d):
    rng = np.random.default_rng(d)
    a = rng.normal(size=(5, d, d))
    m = a @ np.swapaxes(a, -1, -2) + d * np.eye(d)
    b = rng.normal(size=(5, d, 3))
    chol = linalg.cholesky(jnp.asarray(m))
    expected = np.linalg.cholesky(m)
    np.testing.assert_allclose(chol, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        linalg.cholesky_solve(chol, jnp.asarray(b)), np.linalg.solve(m, b), rtol=1e-10
    )
    np.testing.assert_allclose(
        linalg.solve_lower_triangular(chol, jnp.asarray(b)),
        np.linalg.solve(expected, b),
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        linalg.solve_lower_triangular(chol, jnp.asarray(b), transpose=True),
        np.linalg.solve(np.swapaxes(expected, -1, -2), b),
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        linalg.inverse_from_cholesky(chol), np.linalg.inv(m), rtol=1e-10, atol=1e-14
    )


def test_small_block_cholesky_flags_indefinite_blocks():
    m = jnp.array([[[1.0, 2.0], [2.0, 1.0]], [[2.0, 0.5], [0.5, 1.0]]])
    assert linalg.is_positive_definite(m).tolist() == [False, True]
    scalars = jnp.array([[[-1.0]], [[3.0]]])
    assert linalg.is_positive_definite(scalars).tolist() == [False, True]
