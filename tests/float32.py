"""Run a snippet of Python in a float32 JAX process (optax's dtype tests, isolated).

The test session enables x64 once (``tests/conftest.py``); float32 behaviour is
checked in a child process with ``JAX_ENABLE_X64=0`` so that no test toggles
``jax.config`` in the parent.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_in_float32(code: str, timeout: float = 120.0) -> str:
    """Run ``code`` in ``sys.executable -c`` with ``JAX_ENABLE_X64=0``; return stdout.

    The repository root is put first on ``PYTHONPATH`` so ``import blrppl`` works.

    Raises:
        RuntimeError: if the child exits non-zero; the message holds its stderr.
    """
    env = dict(os.environ)
    env["JAX_ENABLE_X64"] = "0"
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"float32 subprocess exited with code {proc.returncode}:\n{proc.stderr}"
        )
    return proc.stdout
