"""The chain Gaussian's small-block linear algebra equals LAPACK's (unrolled for d <= 4)."""

import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.families import chain_gaussian as cg


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6])
def test_small_block_factorisations_match_numpy(d):
    rng = np.random.default_rng(d)
    a = rng.normal(size=(5, d, d))
    m = a @ np.swapaxes(a, -1, -2) + d * np.eye(d)
    b = rng.normal(size=(5, d, 3))
    chol = cg._cholesky(jnp.asarray(m))
    expected = np.linalg.cholesky(m)
    np.testing.assert_allclose(chol, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cg._cho_solve((chol, True), jnp.asarray(b)), np.linalg.solve(m, b), rtol=1e-10)
    np.testing.assert_allclose(
        cg._solve_lower(chol, jnp.asarray(b), transpose=True),
        np.linalg.solve(np.swapaxes(expected, -1, -2), b),
        rtol=1e-10,
    )
    np.testing.assert_allclose(cg._cholesky_inverse(chol), np.linalg.inv(m), rtol=1e-10, atol=1e-14)


def test_small_block_cholesky_flags_indefinite_blocks():
    m = jnp.array([[[1.0, 2.0], [2.0, 1.0]], [[2.0, 0.5], [0.5, 1.0]]])
    assert cg._positive_definite(m).tolist() == [False, True]
    assert cg._positive_definite(jnp.array([[[-1.0]], [[3.0]]])).tolist() == [False, True]
