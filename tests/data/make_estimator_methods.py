"""Write ``estimator_methods.json``: how each zoo model's factors get their site parameters.

The golden table of the canary test (``tests/test_canary.py``). Regenerate it
only after checking that a change of method is intended::

    python -m tests.data.make_estimator_methods
"""

from __future__ import annotations

import json
import os

import jax

import blrppl
from models import ZOO

PATH = os.path.join(os.path.dirname(__file__), "estimator_methods.json")


def methods(name: str) -> dict:
    """The engine that fits the zoo model (VMP where exact, else NonConjugateVI) and its methods."""
    entry = ZOO[name]
    args, kwargs = entry.data()
    for engine in (blrppl.VMP, blrppl.NonConjugateVI):
        try:
            plan = engine(entry.model).plan(*args, **kwargs)
        except blrppl.ModelError:
            continue
        return {"engine": engine.__name__, "methods": {e.factor: e.method.label for e in plan.estimators}}
    raise RuntimeError(f"no engine fits {name}")


def main() -> None:
    jax.config.update("jax_enable_x64", True)
    table = {name: methods(name) for name in ZOO}
    with open(PATH, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
