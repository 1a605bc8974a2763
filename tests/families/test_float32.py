"""Float32 stability: round trips in a JAX_ENABLE_X64=0 child process (optax style).

The parent session runs in float64 (``tests/conftest.py``); the child never sees
that setting, so nothing toggles ``jax.config`` here.
"""

import json

import pytest

from blrppl.families import FAMILIES

try:
    from tests.float32 import run_in_float32
except ImportError:  # ``tests`` is not a package: pytest put tests/ on sys.path.
    from float32 import run_in_float32

SCRIPT = r"""
import json
import jax
import jax.numpy as jnp
from blrppl.families import get_family

assert not jax.config.jax_enable_x64
f32 = lambda x: jnp.asarray(x, jnp.float32)
cov = f32([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 1.5]])
USUAL = {
    "Normal": dict(loc=f32([0.5, -1.0, 2.0]), scale=f32([0.5, 1.0, 2.0])),
    "DiagonalNormal": dict(loc=f32([[0.5, -1.0, 2.0]] * 2), scale=f32([0.5, 1.0, 2.0])),
    "MultivariateNormal": dict(loc=f32([1.0, -0.5, 0.2]), covariance_matrix=cov),
    "Gamma": dict(concentration=f32([0.5, 2.0, 10.0]), rate=f32([1.0, 0.5, 3.0])),
    "InverseGamma": dict(concentration=f32([3.0, 5.0]), rate=f32([1.0, 2.0])),
    "Beta": dict(
        concentration1=f32([0.5, 2.0, 5.0]), concentration0=f32([1.0, 3.0, 0.8])
    ),
    "Dirichlet": dict(concentration=f32([[1.0, 2.0, 3.0], [0.5, 4.0, 2.0]])),
    "Categorical": dict(probs=f32([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])),
    "Bernoulli": dict(probs=f32([0.2, 0.7])),
    "Wishart": dict(concentration=f32(5.0), scale_matrix=f32([[1.0, 0.3], [0.3, 2.0]])),
}


def rel_err(actual, expected):
    errs = [
        float(jnp.max(jnp.abs(a - e)) / jnp.max(jnp.abs(e)))
        for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected))
    ]
    return max(errs)


out = {}
for name, usual in USUAL.items():
    family = get_family(name)

    @jax.jit  # one program per family: eagerly, every operation compiled one of its own
    def round_trip(usual):
        natural = family.from_usual(**usual)
        mean = family.mean_params(natural)
        back = family.natural_params(mean)
        usual_back = family.to_usual(family.from_usual(**family.to_usual(natural)))
        return natural, mean, back, usual_back, family.to_usual(natural)

    natural, mean, back, usual_back, usual_again = round_trip(usual)
    leaves = jax.tree.leaves((natural, mean, back, usual_back))
    out[name] = {
        "dtypes": sorted({str(leaf.dtype) for leaf in leaves}),
        "natural_round_trip": rel_err(back, natural),
        "usual_round_trip": rel_err(usual_back, usual_again),
    }
print(json.dumps(out))
"""


def test_float32_round_trips_keep_dtype_and_accuracy():
    """One child process for every family (starting JAX there costs seconds)."""
    results = json.loads(run_in_float32(SCRIPT).strip().splitlines()[-1])
    # Chain families have their own test below (longer chains, other checks).
    assert sorted(results) == sorted(n for n in FAMILIES if "Chain" not in n)
    failures = {
        name: result
        for name, result in results.items()
        if result["dtypes"] != ["float32"]
        or result["natural_round_trip"] >= 1e-4
        or result["usual_round_trip"] >= 1e-4
    }
    assert not failures


CHAIN_SCRIPT = r"""
import json
import jax
import jax.numpy as jnp
from blrppl.families import chain_categorical as cc
from blrppl.families import chain_gaussian as cg

assert not jax.config.jax_enable_x64


@jax.jit  # One compile: op-by-op dispatch of the passes costs more than compiling them.
def chains(key):
    k1, k2, k3 = jax.random.split(key, 3)
    natural = cg.from_usual(
        initial_mean=jnp.array([1.0, -0.5]),
        initial_covariance=jnp.eye(2),
        transition_matrices=jnp.broadcast_to(
            jnp.array([[0.9, 0.1], [-0.2, 0.8]]), (199, 2, 2)
        ),
        transition_covariances=jnp.broadcast_to(
            jnp.array([[0.5, 0.1], [0.1, 0.3]]), (199, 2, 2)
        ),
    )
    seq = cg.mean_params(natural)
    pot = cc.ChainCategoricalStats(
        jax.random.normal(k1, (50, 4)), jax.random.normal(k2, (49, 4, 4))
    )
    cmean = cc.mean_params(pot)
    return {
        "natural": natural,
        "seq": seq,
        "par": cg.mean_params(natural, "parallel"),
        "back": cg.natural_params(seq),
        "sample": cg.sample(k3, natural, (2,)),
        "log_normalizer": cg.log_normalizer(natural),
        "pot": pot,
        "cmean": cmean,
        "cback": cc.mean_params(cc.natural_params(cmean)),
        "clog_normalizer": cc.log_normalizer(pot),
    }


def rel(a, b):
    return max(
        float(jnp.max(jnp.abs(x - y)) / jnp.max(jnp.abs(y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


out = chains(jax.random.key(0))
leaves = jax.tree.leaves(out)
print(json.dumps({
    "dtypes": sorted({str(leaf.dtype) for leaf in leaves}),
    "parallel": rel(out["par"], out["seq"]),
    "gaussian_round_trip": rel(out["back"], out["natural"]),
    "categorical_round_trip": rel(out["cback"], out["cmean"]),
    "finite": all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves),
}))
"""


def test_chain_families_in_float32():
    """Dtype preservation and stable passes and round trips on 200 steps."""
    out = json.loads(run_in_float32(CHAIN_SCRIPT).strip().splitlines()[-1])
    assert out["dtypes"] == ["float32"]
    assert out["finite"]
    assert out["parallel"] < 1e-4
    assert out["gaussian_round_trip"] < 1e-3
    assert out["categorical_round_trip"] < 1e-4


def test_run_in_float32_reports_failures():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_in_float32("1 / 0")
