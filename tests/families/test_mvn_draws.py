"""Draws from a full Gaussian q: one triangular solve with the draws as columns.

A BNN's 50 x 50 weight matrix has a 2,500-dimensional q; its Monte Carlo site
parameters draw it 16 times a step. Broadcasting the Cholesky factor to one copy per
draw made a (16, 2500, 2500) operand (800 MB) and a batched LAPACK call, on which
jaxlib 0.10 deadlocked (a RuntimeDeadlock after 60 s at N = 1000).
"""

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.families import mvn


def _natural(d, batch=()):
    rng = np.random.default_rng(0)
    a = rng.normal(size=batch + (d, d))
    precision = np.einsum("...ij,...kj->...ik", a, a) + d * np.eye(d)
    loc = rng.normal(size=batch + (d,))
    return mvn.from_usual(jnp.asarray(loc), precision_matrix=jnp.asarray(precision)), loc, precision


def _solves(jaxpr):
    from jax.extend.core import jaxprs_in_params

    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "triangular_solve":
            out.append(tuple(v.aval.shape for v in eqn.invars))
        for sub in jaxprs_in_params(eqn.params):
            out += _solves(sub)
    return out


def test_draws_of_one_block_are_one_unbatched_solve():
    natural, _, _ = _natural(40)
    solves = _solves(jax.make_jaxpr(lambda k: mvn.sample(k, natural, (16,)))(jax.random.key(0)).jaxpr)
    assert ((40, 40), (40, 16)) in solves  # the 16 draws as the columns of one solve
    assert all(len(matrix) == 2 for matrix, _ in solves)  # never a copy of the factor per draw


def test_draws_have_the_q_moments_with_batch_and_sample_shapes():
    natural, loc, precision = _natural(3, batch=(2,))
    draws = jax.jit(lambda k: mvn.sample(k, natural, (400, 50)))(jax.random.key(1))
    assert draws.shape == (400, 50, 2, 3)
    flat = np.asarray(draws).reshape(-1, 2, 3)
    np.testing.assert_allclose(flat.mean(0), loc, atol=0.02)
    for b in range(2):
        np.testing.assert_allclose(np.cov(flat[:, b].T), np.linalg.inv(precision[b]), atol=0.01)
