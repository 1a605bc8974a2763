"""Analyses are pytrees: data-derived arrays are leaves, the structure is static.

So a jitted function may take an analysis as an argument (data as arguments,
not compile-time constants): it gives the eager value, and analyses of one
factor on two data sets of the same shapes share one trace.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.symbolic import canonical as C
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.compiled import Analysis, StatTerm, with_index_leaves
from blrppl.symbolic.expectation import VarInfo, expected_value
from blrppl.symbolic.statistics import statistic_name
from blrppl.symbolic.terms import Operand
from tests.compiles import cheap_jit

from ._helpers import gamma, gaussian

_GAUSS = VarInfo("gaussian", (), 0)
_GAMMA = VarInfo("gamma", (), 0)
_BLOCK = VarInfo("gaussian", (3,), 0)


def normal_with_precision(y, per_observation=False):
    """``y ~ Normal(mu, 1 / sqrt(tau))``: the factor summed, or per observation."""

    def log_factor(v):
        lp = C._normal(y, v["mu"], 1.0 / jnp.sqrt(v["tau"]))
        return lp if per_observation else jnp.sum(lp)

    return analyse(log_factor, {"mu": jnp.zeros(()), "tau": jnp.ones(())}, {"mu": _GAUSS, "tau": _GAMMA})


def regression(X, y, scale=0.7):
    """``y ~ Normal(X @ beta, scale)`` with a full-covariance beta."""
    return analyse(lambda v: jnp.sum(C._normal(y, X @ v["beta"], scale)), {"beta": jnp.zeros(3)}, {"beta": _BLOCK})


def _data(seed):
    rs = np.random.RandomState(seed)
    return rs.randn(50), rs.randn(20, 3), rs.randn(20)


_MEAN = {
    "mu": {k: jnp.asarray(v) for k, v in gaussian(np.random.RandomState(1), ()).items()},
    "tau": {k: jnp.asarray(v) for k, v in gamma(np.random.RandomState(2)).items()},
    "beta": {k: jnp.asarray(v) for k, v in gaussian(np.random.RandomState(3), (3,), 0).items()},
}

CASES = {
    "normal_precision": lambda seed: normal_with_precision(_data(seed)[0]),
    "regression": lambda seed: regression(*_data(seed)[1:]),
}


def test_leaves_are_the_data_and_the_structure_is_static():
    analysis = regression(*_data(0)[1:])
    leaves = jax.tree.leaves(analysis)
    assert leaves and all(isinstance(leaf, (float, np.ndarray)) for leaf in leaves)
    operands = [t.operand.array for t in analysis.terms if t.operand is not None]
    assert any(leaf is array for leaf in leaves for array in operands)
    rebuilt = jax.tree.unflatten(jax.tree.structure(analysis), leaves)
    assert isinstance(rebuilt, Analysis) and all(isinstance(t, StatTerm) for t in rebuilt.terms)
    assert [t.reads for t in rebuilt.terms] == [t.reads for t in analysis.terms]
    assert jax.tree.structure(Operand(np.ones(2), (0,))).num_leaves == 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_jit_with_the_analysis_as_argument_equals_eager(case):
    analysis = CASES[case](0)
    eager_value, eager_grads = jax.value_and_grad(lambda m: expected_value(analysis, m))(_MEAN)
    jitted_value, jitted_grads = cheap_jit(jax.value_and_grad(expected_value, argnums=1))(analysis, _MEAN)
    np.testing.assert_allclose(jitted_value, eager_value, rtol=1e-12, atol=1e-12)
    for a, e in zip(jax.tree.leaves(jitted_grads), jax.tree.leaves(eager_grads)):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


def test_jit_of_a_per_observation_analysis_with_a_minibatch():
    analysis = normal_with_precision(_data(0)[0], per_observation=True)
    assert analysis.obs_label is not None and analysis.obs_size == 50
    batch = jnp.array([3, 7, 7, 41])
    eager = expected_value(analysis, _MEAN, batch)
    jitted = cheap_jit(expected_value)(analysis, _MEAN, batch)
    np.testing.assert_allclose(jitted, eager, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_data_sets_of_one_shape_share_one_trace(case):
    first, second = CASES[case](0), CASES[case](1)
    assert jax.tree.structure(first) == jax.tree.structure(second)
    num_traces = 0

    @cheap_jit
    def evaluate(analysis, mean):
        nonlocal num_traces
        num_traces += 1
        return expected_value(analysis, mean)

    values = [evaluate(first, _MEAN), evaluate(second, _MEAN)]
    assert num_traces == 1
    np.testing.assert_allclose(values[0], expected_value(first, _MEAN), rtol=1e-12)
    np.testing.assert_allclose(values[1], expected_value(second, _MEAN), rtol=1e-12)
    assert not np.isclose(values[0], values[1])


def _grouped(groups):
    """``y ~ Normal(alpha[groups], 1)``: the group indices are leaves (data of the compiled fit)."""
    y = np.linspace(-1.0, 1.0, len(groups))
    return with_index_leaves(
        analyse(lambda v: jnp.sum(C._normal(y, v["alpha"][groups], 1.0)), {"alpha": jnp.zeros(3)},
                {"alpha": VarInfo("gaussian", (3,), 1)})
    )


def test_a_rebuilt_analysis_keeps_its_structure_object_while_its_indices_keep_their_shapes():
    # jit flattens its arguments and compares their structure with its cache's at every call:
    # a term rebuilt from a structure (a replanned fit's arrays) hands back that same object.
    analysis = _grouped(np.array([0, 2, 1, 1, 0, 2, 2, 1]))
    leaves, tree = jax.tree.flatten(analysis)
    assert sum(np.shape(leaf) == (8,) and np.asarray(leaf).dtype.kind == "i" for leaf in leaves) == 2
    rebuilt = jax.tree.unflatten(tree, leaves)
    assert jax.tree.structure(rebuilt) == tree
    structure = jax.tree.structure(rebuilt.terms[1]).node_data()[1]
    assert jax.tree.structure(rebuilt.terms[1]).node_data()[1] is structure
    assert jax.tree.structure(analysis.terms[1]).node_data()[1] == structure
    # Index arrays of other shapes or dtypes (a batch of data sets, int32 indices) are another
    # structure: the structure holds their shapes and dtypes.
    batch = jax.tree.map(lambda a: np.stack([a, a]), rebuilt)
    assert "shape=(2, 8)" in str(jax.tree.structure(batch)) and jax.tree.structure(batch) != tree
    narrow = jax.tree.map(lambda a: a.astype(np.int32) if np.asarray(a).dtype.kind == "i" else a, rebuilt)
    assert "int32" in str(jax.tree.structure(narrow)) and jax.tree.structure(narrow) != tree
    again = jax.tree.unflatten(jax.tree.structure(batch), jax.tree.leaves(batch))
    assert jax.tree.structure(again) == jax.tree.structure(batch)
    assert jax.tree.structure(_grouped(np.array([1, 1, 0, 2, 0, 0, 2, 1]))) == tree
    # The structure holds the dtype the device will hold: int64 indices are int32 without x64.
    fresh = _grouped(np.array([0, 2, 1, 1, 0, 2, 2, 1]))
    with jax.enable_x64(True):
        wide = jax.tree.structure(fresh)
    with jax.enable_x64(False):
        narrow = jax.tree.structure(fresh)
    assert "int64" in str(wide) and "int32" not in str(wide) and "int32" in str(narrow) and "int64" not in str(narrow)


def test_statistic_names_come_from_one_table():
    assert statistic_name("gamma", "log", 1) == "log_x"
    assert statistic_name("inverse_gamma", "x", -1) == "inv_x"
    assert statistic_name("wishart", "logdet", 1) == "log_det_x"
    assert statistic_name("bernoulli", "x", 3) == "x"  # x ** 3 = x on {0, 1}
    assert statistic_name("gamma", "x", 0.5) is None
    assert statistic_name("beta", "x", 1) is None
