"""A full-covariance Gaussian mixture: mu[z] and Lambda[z] with a quadratic form.

Regression test: a Poly reused in two contractions (the quadratic form
diff^T Lambda diff) once had a summed label collide with an output label, so
only the diagonal of Lambda was read.
"""

import jax.numpy as jnp
import numpy as np

from blrppl.symbolic import canonical
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value

K, D, N = 2, 2, 4


def test_mvn_mixture_reads_the_whole_precision_matrix():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(N, D))

    def log_factor(v):
        return jnp.sum(canonical._mvn(y, v["mu"][v["z"]], precision_matrix=v["lam"][v["z"]]))

    infos = {
        "mu": VarInfo("gaussian", (K, D), 1),
        "lam": VarInfo("wishart", (K, D, D), 1),
        "z": VarInfo("categorical", (N,), 1, K),
    }
    examples = {"mu": jnp.zeros((K, D)), "lam": jnp.broadcast_to(jnp.eye(D), (K, D, D)), "z": jnp.zeros(N, int)}
    analysis = analyse(log_factor, examples, infos)
    m = rng.normal(size=(K, D))
    cov = np.stack([np.array([[0.3, 0.1], [0.1, 0.2]]), np.array([[0.5, -0.2], [-0.2, 0.4]])])
    e_lam = np.array([[[2.0, 0.9], [0.9, 1.0]], [[1.0, -0.5], [-0.5, 3.0]]])
    e_logdet = np.array([0.3, 0.5])
    r = rng.dirichlet(np.ones(K), N)
    mean = {
        "mu": {"x": m, "xx": cov + np.einsum("ki,kj->kij", m, m)},
        "lam": {"x": e_lam, "log_det_x": e_logdet},
        "z": {"one_hot": r},
    }
    expected = 0.0
    for n in range(N):
        for k in range(K):
            diff = y[n] - m[k]
            quad = diff @ e_lam[k] @ diff + np.trace(e_lam[k] @ cov[k])
            expected += r[n, k] * (-D / 2 * np.log(2 * np.pi) + 0.5 * e_logdet[k] - 0.5 * quad)
    np.testing.assert_allclose(expected_value(analysis, mean), expected, rtol=1e-12)


def test_large_categorical_plate_reads_every_observation():
    """Regression: numpy 2.4's unravel_index returned wrong coordinates past 8192
    for (N, 1) views, so responsibilities of later observations were misread."""
    import jax

    num, k = 10_000, 3
    infos = {"w": VarInfo("dirichlet", (k,), 0), "z": VarInfo("categorical", (num,), 1, k)}
    analysis = analyse(
        lambda v: jnp.sum(canonical._categorical_probs(v["z"], v["w"])),
        {"w": jnp.ones(k) / k, "z": jnp.zeros(num, int)},
        infos,
    )
    r = np.random.default_rng(1).dirichlet(np.ones(k), num)
    mean = {"w": {"log_x": np.zeros(k)}, "z": {"one_hot": r}}
    grads = jax.grad(lambda m: expected_value(analysis, m))(mean)
    np.testing.assert_allclose(grads["w"]["log_x"], r.sum(0), rtol=1e-12)


def test_unravel_gives_the_int64_coordinates_of_the_reference_formula_for_any_positions():
    from blrppl.symbolic.terms import unravel

    rng = np.random.default_rng(2)
    shape = (5, 3, 7)
    base = rng.integers(-2, 120, size=(400, 2, 3))
    inside = rng.integers(0, 105, size=(300, 4))  # every position in the shape: a table's lookups
    cases = [
        inside,
        inside.astype(np.uint16)[::2],
        base.astype(np.int32),
        base.astype(np.int64),
        base.astype(np.int64)[:, :1, ::2],  # a strided view
        np.asarray(rng.integers(0, 2**40, size=50), np.int64),  # past int32: the int64 division
        np.asarray(rng.integers(2**31, 2**32 - 1, size=50), np.uint32),  # unsigned past int32
        np.zeros((0, 4), np.int32),
    ]
    for flat in cases:
        expected = []
        rest = np.array(flat, dtype=np.int64)
        for size in reversed(shape):
            rest, coord = np.divmod(rest, size)
            expected.append(coord)
        for got, want in zip(unravel(flat, shape), reversed(expected)):
            assert got.dtype == np.int64 and got.shape == flat.shape
            np.testing.assert_array_equal(got, want)
