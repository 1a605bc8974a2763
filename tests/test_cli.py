"""The main command: ``python -m blrppl fit`` and ``list`` from the repository root."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "blrppl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_list_names_the_zoo():
    out = run("list")
    assert out.returncode == 0, out.stderr
    assert "gaussian_mixture" in out.stdout and "eight_schools_centered" in out.stdout


def test_fit_prints_a_summary_and_writes_files(tmp_path):
    out = run("fit", "normal_mean_precision", "--steps", "20", "--draws", "200", "--quiet", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "mean" in out.stdout and "ELBO after" in out.stdout and "Pareto k" in out.stdout
    for name in ("posterior.nc", "elbo.png", "posterior.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_unknown_model_is_a_clear_error():
    out = run("fit", "no_such_model")
    assert out.returncode != 0
    assert "unknown model 'no_such_model'" in out.stderr
