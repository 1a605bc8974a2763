"""The command line: ``python -m blrppl fit`` on every zoo model, every engine, clean errors.

Compilation dominates these tests, so the zoo runs once, in one process, with
few steps and draws; the rest call :func:`blrppl.cli.main` in-process on a
tiny model.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import arviz as az
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

from blrppl import cli
from blrppl.choosing import ENGINES
from models import ZOO, ZooModel

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAMS = {"nile": ["obs_var", "level_var"], "ar1": ["phi", "sigma", "obs_scale"]}
#: Cheaper compilation for a smoke test of the command line (the fits take a few steps).
FAST_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run(*args, timeout=300):
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + FAST_XLA).strip())
    return subprocess.run(
        [sys.executable, "-m", "blrppl", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.slow  # every zoo model traced and compiled once: ~3 min of one core, so two halves for two workers
@pytest.mark.parametrize("half", [0, 1])
def test_every_zoo_model_fits_with_the_default_engine(half, tmp_path):
    """``python -m blrppl fit A B ...``: exit code, engine, parameters, summary and files of each model."""
    names = sorted(ZOO)[half::2]
    out = run("fit", *names, "--steps", "2", "--draws", "50", "--quiet", "--out", str(tmp_path), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    blocks = re.split(r"^(?=Fitting )", out.stdout, flags=re.M)[1:]
    fitted = {block.split()[1]: block for block in blocks}
    assert sorted(fitted) == names
    for name, block in fitted.items():
        folder = tmp_path / name
        assert "(chosen from the trace: " in block.splitlines()[0], name
        assert "ELBO after" in block and "Pareto k" in block, name
        assert re.search(r"^ +mean +std +median", block, flags=re.M) or " entries of shape " in block, name
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
    expected_files = {
        "gaussian_mixture": "mixture.png",
        "linear_gaussian_ssm": "chains.png",
        "nile": "chains.png",
        "hmm": "chains.png",
        "stochastic_volatility": "chains.png",
        "radon": "forest.png",
    }
    for name, file in expected_files.items():
        if name in fitted:
            assert (tmp_path / name / file).exists(), (name, file)
    if "gaussian_mixture" in fitted:
        assert "Restarts: final ELBOs" in fitted["gaussian_mixture"]  # discrete latents: restarts by default
    if "linear_gaussian_ssm" in fitted:
        assert "x: 120 entries" in fitted["linear_gaussian_ssm"]  # a chain condensed to one line


def normal_mean(*, y=None):
    """A Normal mean with known noise: every engine fits it, and it compiles in a moment."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


TINY = {"normal_mean": ZooModel("normal_mean", normal_mean, lambda: ((), {"y": jnp.linspace(0.0, 2.0, 8)}), "tiny")}


@pytest.fixture
def tiny_zoo(monkeypatch):
    monkeypatch.setattr(cli, "load_zoo", lambda: TINY)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_can_be_asked_for(engine, tiny_zoo, capsys):
    code = cli.main(["fit", "normal_mean", "--algorithm", engine, "--steps", "2", "--draws", "20", "--quiet"])
    out, err = capsys.readouterr()
    assert f"with {engine} (--algorithm)" in out
    if engine == "SVI":  # the model draws no minibatches
        assert code == 1 and err.startswith("blrppl: error: normal_mean: site ") and "subsample" in err
    else:
        assert code == 0, err
        assert re.search(r"^ +mu +-?\d", out, flags=re.M) and "ELBO after" in out and "Pareto k" in out


def test_the_default_is_the_default_model_with_the_chosen_engine(monkeypatch, capsys):
    fitted = []
    monkeypatch.setattr(cli, "_fit_one", lambda name, entry, args, out: fitted.append((name, args)))
    assert cli.main([]) == 0 and cli.main(["--steps", "7"]) == 0  # ``python -m blrppl`` means ``fit``
    assert [name for name, _ in fitted] == [cli.DEFAULT_MODEL] * 2
    args = fitted[1][1]
    assert args.algorithm == cli.AUTO and args.steps == 7 and args.restarts is None  # the library's restarts
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "gaussian_mixture" in out and "eight_schools_centered" in out


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
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("blrppl: error:", "python -m blrppl fit: error:"))


def test_unknown_model_is_a_clear_error_from_the_shell():
    out = run("fit", "no_such_model")
    assert out.returncode == 2
    assert "unknown model 'no_such_model'" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("blrppl: error:")


def test_fit_turns_the_compilation_cache_on_unless_told_not_to(monkeypatch, tiny_zoo, capsys):
    import blrppl.compilation_cache

    calls = []
    monkeypatch.setattr(cli, "CACHE_BY_DEFAULT", True)
    monkeypatch.setattr(blrppl.compilation_cache, "enable_compilation_cache", lambda *a, **k: calls.append(a))
    assert cli.main(["fit", "normal_mean", "--steps", "2", "--no-plots", "--quiet", "--no-cache", "--draws", "10"]) == 0
    assert calls == []
    assert cli.main(["fit", "normal_mean", "--steps", "2", "--no-plots", "--quiet", "--draws", "10"]) == 0
    assert len(calls) == 1
