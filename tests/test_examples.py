"""Every example runs (with few steps), so none can rot."""

import pathlib
import runpy
import sys

import pytest

# state_space.py has its own test below (it also writes a figure).
EXAMPLES = sorted(p for p in (pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py") if p.stem != "state_space")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path), "--steps", "5"])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()


def test_state_space_example_writes_the_nile_figure(tmp_path, monkeypatch, capsys):
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "state_space.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--steps", "5", "--out", str(tmp_path)])
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert "MLE observation variance" in out and "level variance" in out
    assert (tmp_path / "nile.png").stat().st_size > 0
