"""Canary: every zoo model's factors keep the estimator methods they had.

An upgrade of jax or numpyro that renames a primitive or an equation
parameter the symbolic layer reads would silently turn an exact factor into
Monte Carlo (or quadrature). The golden table ``data/estimator_methods.json``
(written by ``tests/data/make_estimator_methods.py``) makes that loud.
"""

import json
import os

import pytest

from models import ZOO
from tests.data.make_estimator_methods import methods

with open(os.path.join(os.path.dirname(__file__), "data", "estimator_methods.json")) as f:
    GOLDEN = json.load(f)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_keeps_its_estimator_methods(name):
    assert name in GOLDEN, f"{name} is new in the zoo: add it with tests/data/make_estimator_methods.py"
    assert methods(name) == GOLDEN[name]
