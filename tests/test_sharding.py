"""Data-parallel fits: the plate axis sharded over forced host devices gives the one-device answer.

The fits run in a subprocess (``tests/sharding_check.py``) because the device
count must be set (XLA_FLAGS) before jax starts, and this process already
started it. Each case compares natural parameters on 2 and 4 devices with the
unsharded fit (float64, 1e-10), checks that the plan's per-observation arrays
are split along the plate axis, and that the compiled step has no all-gather
(data never collected onto one device) but all-reduces (the sums over
observations, Eq. 58).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

import blrppl

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_cases(*cases, devices="2,4"):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SHARD_DEVICES=devices, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "sharding_check.py"), *cases],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def assert_data_parallel(result, collectives=True):
    for k, diff in result["diff"].items():
        assert diff < 1e-10, (result["case"], k, diff)
    for k, specs in result["row_shardings"].items():
        assert specs == ["P('data',)"], (result["case"], k, specs)
    assert result["all_gather"] == [], result["all_gather"]
    if collectives:
        assert result["all_reduce"] > 0
        assert any("P('data',)" in s for s in result["input_shardings"])


def test_shard_splits_the_plate_axis_and_replicates_the_rest():
    X, y, prior = np.ones((8, 3)), np.zeros(8), np.ones(3)
    Xs, ys, ps, m = blrppl.shard((X, y, prior, 5))
    assert Xs.sharding.spec == jax.sharding.PartitionSpec("data") and ys.sharding.spec[0] == "data"
    assert ps.sharding.spec == jax.sharding.PartitionSpec() and m == 5
    np.testing.assert_array_equal(np.asarray(Xs), X)


def test_conjugate_model_on_four_devices_equals_one():
    (result,) = run_cases("conjugate", devices="4")
    assert_data_parallel(result, collectives=False)  # the conjugate step reads pre-contracted sums


def test_glm_and_svi_on_two_and_four_devices_equal_one():
    for result in run_cases("glm", "svi"):
        assert_data_parallel(result)
