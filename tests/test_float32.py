"""Float32 stability: the same fits in a float32 process stay finite and close."""

import json

import jax
import numpy as np
import pytest

import blrppl
from models import ZOO
from tests.float32 import run_in_float32

SCRIPT = """
import json, jax, numpy as np
import blrppl
from models import ZOO
out = {}
for name in ["normal_mean_precision", "gaussian_mixture", "beta_bernoulli", "linear_regression"]:
    entry = ZOO[name]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(jax.random.key(0), 80, *args, progress_bar=False, **kwargs)
    leaves = jax.tree.leaves(result.natural_params)
    out[name] = {
        "elbo": float(result.elbo[-1]),
        "finite": bool(all(np.all(np.isfinite(np.asarray(x))) for x in leaves) and np.all(np.isfinite(np.asarray(result.elbo)))),
        "dtypes": sorted({str(x.dtype) for x in leaves}),
    }
import jax.numpy as jnp, numpyro, numpyro.distributions as dist
def svi_model(y, m):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("N", y.shape[0], subsample_size=m) as idx:
        numpyro.sample("y", dist.Normal(mu, 0.5), obs=y[idx])
y = jnp.asarray(1.0 + 0.5 * np.random.default_rng(3).normal(size=2000), jnp.float32)
for mode, rate in (("global", lambda t: 1.0 / t), ("local", 1.0)):
    r = blrppl.SVI(svi_model, mode=mode, learning_rate=rate).run(jax.random.key(0), 20, y, 100, progress_bar=False)
    lam = r.natural_params["mu"]
    out["svi_" + mode] = {"loc": float(r.posterior["mu"].loc), "finite": bool(np.isfinite(float(lam.x))), "dtypes": sorted({str(lam.x.dtype)})}
print(json.dumps(out))
"""


def test_vmp_in_float32_is_finite_and_close_to_float64():
    out = json.loads(run_in_float32(SCRIPT).strip().splitlines()[-1])
    for mode in ("global", "local"):
        got = out.pop("svi_" + mode)
        y64 = np.asarray(np.asarray(1.0 + 0.5 * np.random.default_rng(3).normal(size=2000), np.float32), np.float64)
        exact = (y64.sum() / 0.25) / (1 / 100 + 2000 / 0.25)
        assert got["finite"] and got["dtypes"] == ["float32"]
        np.testing.assert_allclose(got["loc"], float(exact), rtol=1e-4)
    for name, got in out.items():
        entry = ZOO[name]
        args, kwargs = entry.data()
        reference = blrppl.VMP(entry.model).run(jax.random.key(0), 80, *args, progress_bar=False, **kwargs)
        assert got["finite"], name
        assert got["dtypes"] == ["float32"], (name, got["dtypes"])
        np.testing.assert_allclose(got["elbo"], float(reference.elbo[-1]), rtol=1e-4, err_msg=name)


NONCONJUGATE_SCRIPT = """
import json, jax, numpy as np
import blrppl
from models import ZOO
out = {}
for name, kw in [("logistic_regression", {}), ("eight_schools_centered", {}), ("poisson_regression", {}),
                 ("eight_schools_noncentered", {"blocks": [("mu", "tau", "theta_raw")]})]:
    entry = ZOO[name]
    args, kwargs = entry.data()
    result = blrppl.NonConjugateVI(entry.model, **kw).run(jax.random.key(0), 400, *args, progress_bar=False, **kwargs)
    leaves = jax.tree.leaves(result.natural_params)
    means = {k: np.asarray(d.mean, np.float64).ravel().tolist() for k, d in result.posterior.items()}
    out[name] = {
        "means": means,
        "finite": bool(all(np.all(np.isfinite(np.asarray(x))) for x in leaves)),
        "dtypes": sorted({str(x.dtype) for x in leaves}),
    }
print(json.dumps(out))
"""


@pytest.mark.slow
def test_nonconjugate_vi_in_float32_is_finite_and_close_to_float64():
    """GLM quadrature, hybrid factors and Monte Carlo blocks stay stable in float32."""
    out = json.loads(run_in_float32(NONCONJUGATE_SCRIPT).strip().splitlines()[-1])
    for name, got in out.items():
        entry = ZOO[name]
        args, kwargs = entry.data()
        kw = {"blocks": [("mu", "tau", "theta_raw")]} if name == "eight_schools_noncentered" else {}
        reference = blrppl.NonConjugateVI(entry.model, **kw).run(jax.random.key(0), 400, *args, progress_bar=False, **kwargs)
        assert got["finite"] and got["dtypes"] == ["float32"], (name, got["dtypes"])
        for site, dist_ in reference.posterior.items():
            sd = np.sqrt(np.asarray(dist_.variance, np.float64)).ravel()
            # Deterministic fits agree to float32 rounding; Monte Carlo blocks to their noise.
            tol = 0.15 if "blocks" in kw else 1e-3
            assert np.all(np.abs(np.asarray(got["means"][site]) - np.asarray(dist_.mean).ravel()) <= tol * sd), (name, site)


TOL_SCRIPT = """
import json, jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
import blrppl
from models import ZOO


def quickstart(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", 50):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


out = {}
y = 1.5 + 0.8 * jax.random.normal(jax.random.key(1), (50,))
r = blrppl.VMP(quickstart).run(jax.random.key(0), 100, y=y, tol=1e-6, progress_bar=False)
out["quickstart"] = [len(r.elbo), bool(r.converged), float(r.posterior["mu"].mean), float(r.posterior["tau"].mean)]
entry = ZOO["gaussian_mixture"]
args, kwargs = entry.data()
r = blrppl.VMP(entry.model).run(jax.random.key(0), 2000, *args, tol=1e-6, progress_bar=False, num_restarts=1, **kwargs)
out["mixture"] = [len(r.elbo), bool(r.converged), float(r.elbo[-1])]
print(json.dumps(out))
"""


def test_tol_stops_float32_runs_with_float64_answers():
    """Convergence is relative to the ELBO's scale, so float32 rounding does not keep runs going."""
    out = json.loads(run_in_float32(TOL_SCRIPT).strip().splitlines()[-1])
    steps, converged, mu, tau = out["quickstart"]
    assert converged and steps < 100
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def quickstart(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
        with numpyro.plate("N", 50):
            numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)

    y = np.asarray(np.asarray(1.5 + 0.8 * jax.random.normal(jax.random.key(1), (50,), jnp.float32)), np.float64)
    ref = blrppl.VMP(quickstart).run(jax.random.key(0), 100, y=jnp.asarray(y), tol=1e-12, progress_bar=False)
    np.testing.assert_allclose([mu, tau], [float(ref.posterior["mu"].mean), float(ref.posterior["tau"].mean)], rtol=1e-4)
    steps, converged, elbo = out["mixture"]
    assert converged and steps < 2000
    entry = ZOO["gaussian_mixture"]
    args, kwargs = entry.data()
    ref = blrppl.VMP(entry.model).run(jax.random.key(0), 2000, *args, tol=1e-12, progress_bar=False, num_restarts=1, **kwargs)
    np.testing.assert_allclose(elbo, float(ref.elbo[-1]), rtol=1e-4)


BROAD_SCRIPT = """
import json, jax, numpy as np
import blrppl
from tests.robust_models import CASES
out = {}
for name in ["poisson_s100", "logistic_s100", "scalar_poisson"]:
    model, data, sites = CASES[name]
    args, kwargs = data()
    args = jax.tree.map(lambda a: np.asarray(a, np.float32) if np.asarray(a).dtype == np.float64 else a, args)
    kwargs = jax.tree.map(lambda a: np.asarray(a, np.float32) if np.asarray(a).dtype == np.float64 else a, kwargs)
    r = blrppl.NonConjugateVI(model).run(jax.random.key(0), 300, *args, progress_bar=False, tol=1e-6, **kwargs)
    out[name] = {s: [np.asarray(r.posterior[s].mean).tolist(), np.asarray(r.posterior[s].variance).tolist()] for s in sites}
print(json.dumps(out))
"""


@pytest.mark.slow  # compilation-bound, a few subprocess or long Monte Carlo fits
def test_broad_priors_in_float32_land_on_the_posterior():
    """Coefficient priors Normal(0, 100) and the scalar Poisson, in a float32 process: within
    0.1 NUTS sd and 20% of NUTS's sd, as in float64 (tests/engines/test_robustness.py)."""
    from tests.engines.test_robustness import references

    out = json.loads(run_in_float32(BROAD_SCRIPT, timeout=300).strip().splitlines()[-1])
    refs = references()
    for name, sites in out.items():
        for site, (mean, variance) in sites.items():
            ref_mean, ref_sd = np.asarray(refs[name]["mean"][site]), np.asarray(refs[name]["sd"][site])
            assert np.all(np.abs(np.asarray(mean) - ref_mean) / ref_sd < 0.1), (name, site)
            assert np.all(np.abs(np.sqrt(variance) / ref_sd - 1.0) < 0.2), (name, site)


DAMPED_SCRIPT = """
import json, jax, numpy as np
import blrppl
from models import ZOO
entry = ZOO["stochastic_volatility"]
args, kwargs = entry.data()
r = blrppl.NonConjugateVI(entry.model).run(jax.random.key(0), 500, *args, progress_bar=False, tol=1e-6, **kwargs)
print(json.dumps([len(r.elbo), bool(r.converged), np.asarray(r.posterior["h"].mean).tolist()]))
"""


def test_damped_rate_one_steps_settle_in_float32():
    """At ρ = 1 a float32 q at its fixed point jitters by rounding and its ELBO with it (undamped:
    500 steps without converging on the stochastic volatility model); the damping halves ρ after
    a step that did not raise the ELBO, so the run settles and stops with float64's answer."""
    steps, converged, means = json.loads(run_in_float32(DAMPED_SCRIPT).strip().splitlines()[-1])
    assert converged and steps < 60
    entry = ZOO["stochastic_volatility"]
    args, kwargs = entry.data()
    ref = blrppl.NonConjugateVI(entry.model).run(jax.random.key(0), 500, *args, progress_bar=False, tol=1e-10, **kwargs)
    sd = np.sqrt(np.asarray(ref.posterior["h"].variance))
    assert np.all(np.abs(np.asarray(means) - np.asarray(ref.posterior["h"].mean)) <= 0.01 * sd)


def test_new_group_indices_in_float32_share_the_program_and_the_batch():
    """Index arrays that are data (``a[g]``) are int64 in a host plan and int32 on the device
    without x64: one structure either way (a batch mixing both failed to stack)."""
    out = run_in_float32(
        """
import jax, numpy as np, numpyro, numpyro.distributions as dist, blrppl
def model(g, num_groups, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([num_groups]).to_event(1))
    with numpyro.plate("n", len(g)):
        numpyro.sample("y", dist.Normal(mu + a[g], 0.7), obs=y)
rng = np.random.default_rng(1)
gs = rng.integers(0, 5, (4, 40)); ys = (rng.normal(size=(4, 40)) + 0.3 * gs).astype(np.float32)
key = jax.random.PRNGKey(0)
engine = blrppl.ConjugateBayes(model)
engine.run(key, 10, gs[0], 5, y=ys[0], progress_bar=False)
second = engine.run(key, 10, gs[1], 5, y=ys[1], progress_bar=False)
fresh = blrppl.ConjugateBayes(model).run(key, 10, gs[1], 5, y=ys[1], progress_bar=False)
batch = engine.run_batched(key, 10, gs, 5, y=ys)
print(second.posterior["a"].mean.dtype, float(np.max(np.abs(second.posterior["a"].mean - fresh.posterior["a"].mean))),
      float(np.max(np.abs(batch[1].posterior["a"].mean - second.posterior["a"].mean))), bool(batch.failed.any()))
"""
    )
    dtype, second_error, batch_error, failed = out.split()
    assert dtype == "float32" and failed == "False"
    assert float(second_error) <= 1e-6 and float(batch_error) <= 1e-6
