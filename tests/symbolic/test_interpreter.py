"""The symbolic interpreter's dispatch: calls are entered, unknown primitives are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive

from blrppl.graph.jaxpr import PRIMITIVES
from blrppl.symbolic import canonical as C
from blrppl.symbolic import categorical, rules
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value
from blrppl.symbolic.terms import NonConjugate

_Y = np.array([0.3, -1.2, 0.7])
_INFOS = {"a": VarInfo("gaussian", (), 0)}
_EXAMPLES = {"a": jnp.zeros(())}
_MEAN = {"a": {"x": jnp.asarray(0.4), "xx": jnp.asarray(0.9)}}

foo_p = Primitive("foo")
foo_p.def_impl(lambda x: x)
foo_p.def_abstract_eval(lambda x: x)


def _analyse(location):
    return analyse(lambda v: jnp.sum(C._normal(_Y, location(v["a"]), 1.0)), _EXAMPLES, _INFOS)


def test_every_rule_is_a_primitive_of_the_shared_table():
    assert set(rules.RULES) | set(categorical.RULES) <= set(PRIMITIVES)


@pytest.mark.parametrize(
    "name, location",
    [
        ("foo", foo_p.bind),
        ("sin", jnp.sin),
        ("while", lambda a: jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2.0), (0, a))[1]),
    ],
)
def test_an_unsupported_primitive_is_named_in_the_reason(name, location):
    with pytest.raises(NonConjugate) as info:
        _analyse(location)
    assert info.value.var == "a"
    assert f"primitive {name!r}" in info.value.reason
    assert "not supported by the symbolic interpreter" in info.value.reason


@pytest.mark.parametrize(
    "wrap",
    [jax.jit, jax.checkpoint, lambda f: jax.jit(jax.jit(f))],
    ids=["jit", "checkpoint", "nested_jit"],
)
def test_calls_are_entered(wrap):
    plain = expected_value(_analyse(lambda a: 2.0 * a - 1.0), _MEAN)
    wrapped = expected_value(_analyse(wrap(lambda a: 2.0 * a - 1.0)), _MEAN)
    np.testing.assert_allclose(wrapped, plain, rtol=1e-12)


def test_reading_every_row_in_order_is_the_data_itself():
    """X[arange(N)] (a minibatch model analysed on all rows) is not copied; other gathers are evaluated."""
    from blrppl.symbolic.interpret import Interpreter
    from blrppl.symbolic.terms import Labels

    X = np.arange(12.0).reshape(6, 2)
    closed = jax.make_jaxpr(lambda x, i: x[i])(X, np.arange(6))
    for idx, copied in ((np.arange(6), False), (np.arange(6)[::-1], True), (np.array([0, 1, 2, 3, 4, 4]), True)):
        (out,) = Interpreter(Labels(), {}).run(closed, [X, idx])
        np.testing.assert_array_equal(out, X[idx])
        assert np.shares_memory(out, X) is not copied
