"""The opt-in persistent compilation cache: a second process reads what the first compiled."""

import os
import subprocess
import sys

import pytest

FIT = """
import jax, numpy as np, blrppl
from models import ZOO
entry = ZOO["normal_mean_precision"]
args, kwargs = entry.data()
blrppl.VMP(entry.model).run(jax.random.key(0), 20, *args, progress_bar=False, **kwargs)
"""


def _fit_in_a_fresh_process(cache, tmp_path, hash_seed="0"):
    env = {**os.environ, "BLRPPL_COMPILATION_CACHE": str(cache), "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": hash_seed}
    subprocess.run([sys.executable, "-c", FIT], check=True, env=env, cwd=os.getcwd(), timeout=300)


@pytest.mark.slow  # compilation-bound, a few subprocess or long Monte Carlo fits
def test_the_environment_variable_turns_on_a_cache_that_a_second_process_reuses(tmp_path):
    cache = tmp_path / "cache"
    _fit_in_a_fresh_process(cache, tmp_path)
    entries = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert entries, "the first process stored no compiled program"
    # Another string hashing (as any new process has): numpyro gathers a distribution's pytree
    # fields in a set, so a program taking the prior had its arguments in another order (and
    # another cache key) about every other time, before compilation_cache.stable_distribution_pytrees.
    _fit_in_a_fresh_process(cache, tmp_path, hash_seed="1")
    again = sorted(p.name for p in cache.rglob("*") if p.is_file())
    # Same model, data shapes and options: every program was found, none added
    # (JAX keeps an access-time file beside each entry; the entries are the same).
    assert [e for e in again if not e.endswith("-atime")] == [e for e in entries if not e.endswith("-atime")]
