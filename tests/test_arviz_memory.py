"""to_arviz at large N: peak memory measured in a fresh process (``VmHWM``), float32 as users run.

N = 1e7 without the pointwise log likelihood stays within twice the fit's
memory; N = 1e6 with it (computed in chunks of draws, thinned to 100 draws)
stays within 2 GB for the whole process.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import json, resource, sys
import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
import blrppl
from blrppl.arviz_io import import_arviz

def model(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)

def peak_mb():
    # VmHWM: this process image's peak RSS. ru_maxrss would carry over the
    # parent's peak across exec (Linux keeps it), i.e. pytest's own memory.
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024.0
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

n, thinning = int(float(sys.argv[1])), int(sys.argv[2])
import_arviz(); import xarray  # the libraries count as the baseline, not as to_arviz's memory
y = jnp.asarray(np.random.default_rng(0).normal(1.5, 0.8, n).astype(np.float32))
base = peak_mb()
result = blrppl.VMP(model).run(jax.random.key(0), 20, y=y, progress_bar=False, tol=1e-6)
fit = peak_mb()
if thinning:
    idata = result.to_arviz(jax.random.key(1), 1000, log_likelihood_thinning=thinning)
    shape = idata.log_likelihood["y"].shape
else:
    idata = result.to_arviz(jax.random.key(1), 1000, log_likelihood=False)
    shape = None
print(json.dumps(dict(base=base, fit=fit, arviz=peak_mb(), log_likelihood=shape, groups=list(idata.groups()))))
"""


def probe(n: float, thinning: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(n), str(thinning)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={"JAX_ENABLE_X64": "0", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fit of 1e7 observations in a fresh process: ~15-30 s
def test_without_log_likelihood_ten_million_observations_stay_within_twice_the_fit():
    m = probe(1e7, 0)
    assert "log_likelihood" not in m["groups"] and "observed_data" in m["groups"]
    assert m["arviz"] <= 2.0 * m["fit"], m
    assert m["arviz"] - m["fit"] <= m["fit"] - m["base"], m  # to_arviz adds less than the fit took


@pytest.mark.slow  # a fit of 1e6 observations and 1e8 log densities in a fresh process: ~15-30 s
def test_chunked_thinned_log_likelihood_of_a_million_observations_within_2_gb():
    m = probe(1e6, 10)
    assert m["log_likelihood"] == [1, 100, 1_000_000]
    assert m["arviz"] <= 2048, m
