"""The command line: ``python -m blrppl fit`` on every zoo model, every engine, clean errors."""

import json
import pathlib
import re
import subprocess
import sys

import arviz as az
import numpy as np
import pytest

from blrppl.choosing import ENGINES
from blrppl.cli import main
from models import ZOO

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAMS = {"nile": ["obs_var", "level_var"], "ar1": ["phi", "sigma", "obs_scale"]}


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "blrppl", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_list_names_the_zoo():
    out = run("list")
    assert out.returncode == 0, out.stderr
    assert "gaussian_mixture" in out.stdout and "eight_schools_centered" in out.stdout


def test_the_main_command_fits_the_default_model_and_prints_a_summary():
    out = run("fit", "--steps", "20", "--draws", "200", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "Fitting gaussian_mixture" in out.stdout and "with VMP (chosen from the trace" in out.stdout
    for text in ("mean", "std", "mu[0]", "ELBO after", "Pareto k"):
        assert text in out.stdout, text


@pytest.mark.slow  # 18 models, each traced and compiled: ~3-4 min on 2 idle cores (fits alone ~55%)
def test_every_zoo_model_fits_with_the_default_engine(tmp_path):
    """One process fits the whole zoo (JAX starts once): exit code, parameters, files."""
    out = run("fit", "all", "--steps", "5", "--draws", "100", "--quiet", "--out", str(tmp_path), timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    blocks = re.split(r"^(?=Fitting )", out.stdout, flags=re.M)[1:]
    fitted = {block.split()[1]: block for block in blocks}
    assert set(fitted) == set(ZOO)
    for name, block in fitted.items():
        folder = tmp_path / name
        assert "ELBO after" in block and "Pareto k" in block, name
        for file in ("posterior.nc", "summary.txt", "fit.npz", "elbo.png"):
            assert (folder / file).stat().st_size > 0, (name, file)
        written = re.search(r"^Wrote (.*)\.$", block, flags=re.M).group(1).split(", ")
        assert all(pathlib.Path(p).stat().st_size > 0 for p in written), name
        assert any(p.endswith(("posterior.png", "forest.png", "chains.png")) for p in written), name
        for param in PARAMS.get(name, []):
            assert re.search(rf"^  {param} = ", block, flags=re.M), (name, param)
        if name in PARAMS:
            saved = json.loads((folder / "params.json").read_text())
            assert sorted(saved) == sorted(PARAMS[name])
            idata = az.from_netcdf(str(folder / "posterior.nc"))
            assert sorted(idata.constant_data.data_vars) == sorted(PARAMS[name])
    assert (tmp_path / "gaussian_mixture" / "mixture.png").exists()
    assert (tmp_path / "linear_gaussian_ssm" / "chains.png").exists()  # its sites all exceed the summary's width
    assert "x: 120 entries" in fitted["linear_gaussian_ssm"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_can_be_asked_for(engine, capsys):
    code = main(["fit", "gamma_poisson", "--algorithm", engine, "--steps", "3", "--draws", "50", "--quiet"])
    out, err = capsys.readouterr()
    assert f"with {engine} (--algorithm)" in out
    if engine == "SVI":  # the zoo's Gamma-Poisson draws no minibatches
        assert code == 1 and err.startswith("blrppl: error: gamma_poisson: site ") and "subsample" in err
    else:
        assert code == 0, err
        assert "lam" in out and "ELBO after" in out


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["fit", "gamma_poisson", "--steps", "0"], 2, "expected a positive integer"),
        (["fit", "gamma_poisson", "--algorithm", "NUTS"], 2, "invalid choice: 'NUTS'"),
        (["fit", "no_such_model"], 2, "unknown model 'no_such_model'"),
        (["fit", "gamma_poisson", "--tol", "-1"], 2, "expected a number >= 0"),
        (["fit", "normal_mean_precision", "--algorithm", "ConjugateBayes", "--quiet"], 1, "use blrppl.VMP"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, code, message, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("blrppl: error:", "python -m blrppl fit: error:"))


def test_unknown_model_is_a_clear_error_from_the_shell():
    out = run("fit", "no_such_model")
    assert out.returncode == 2
    assert "unknown model 'no_such_model'" in out.stderr and "Traceback" not in out.stderr
    assert np.char.startswith(out.stderr.strip().splitlines()[-1], "blrppl: error:")
