"""Every example runs (with few steps), so none can rot."""

import pathlib
import runpy
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path), "--steps", "5"])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()
