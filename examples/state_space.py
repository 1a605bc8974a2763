"""State-space models: the Nile river flow, EM for the noise variances, then the Kalman smoother.

The local level model (``models/nile.py``) is written with ``scan``; blrppl
gives its level chain a chain Gaussian q (block-tridiagonal precision), so

* ``EM`` (Khan & Rue, Sec. 5.2) alternates the exact E-step, a Kalman/RTS
  smoother, with Newton M-steps for the two ``numpyro.param`` variances, and
  converges to their maximum-likelihood estimates;
* ``ConjugateBayes`` with those variances is one BLR step with rho = 1
  (Sec. 5.1): the Kalman smoother;
* ``numpyro.infer.Predictive`` with ``engine.guide(result)`` forecasts past
  the last observation.

The script prints the estimates and saves a PNG of the data, the smoothed
level with a 90% band and a ten-year forecast.

    python examples/state_space.py [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import jax
import numpy as np
import numpyro

import blrppl
from blrppl.cli import load_zoo

Z90 = 1.6448536269514722  # the 95% point of N(0, 1): mean +- Z90 sd is a 90% band
HORIZON = 10


def main(steps: int = 500, out: str | None = None) -> pathlib.Path:
    # Float64, as statsmodels: the flows are ~1000 with variances ~1e4, and in
    # float32 the raw second moments E[x_t x_s] that EM's bound is built from
    # lose the last few digits of the likelihood, so EM stalls short of the MLE.
    jax.config.update("jax_enable_x64", True)
    load_zoo()  # puts the repository's models/ package on the path
    from models import nile

    y = nile.data()[1]["y"]
    years = np.asarray(nile.YEARS)

    # 1. EM: maximum-likelihood noise variances (the E-step is the exact smoother).
    em = blrppl.EM(nile.model)
    fit = em.run(jax.random.key(0), steps, y=y, tol=1e-9, progress_bar=False)
    obs_var, level_var = float(fit.params["obs_var"]), float(fit.params["level_var"])
    print(f"EM: {len(fit.elbo)} steps, log likelihood {float(fit.elbo[-1]):.4f}")
    print(f"  MLE observation variance {obs_var:.1f}, level variance {level_var:.1f}")
    print("  (Durbin & Koopman 2012, diffuse start: 15099 and 1469.1)")

    # 2. The Kalman smoother at those variances: ConjugateBayes, one step.
    smoother = blrppl.ConjugateBayes(nile.model)
    result = smoother.run(jax.random.key(1), 1, y=y, obs_var=obs_var, level_var=level_var, progress_bar=False)
    q = result.posterior["level"]  # the start level_0, then one level per year
    mean, sd = np.asarray(q.mean)[1:], np.sqrt(np.asarray(q.variance))[1:]
    print(f"  smoothed level 1871: {mean[0]:.1f} +- {sd[0]:.1f}, 1970: {mean[-1]:.1f} +- {sd[-1]:.1f}")

    # 3. A forecast past 1970 through NumPyro's Predictive with the fitted guide.
    predictive = numpyro.infer.Predictive(nile.model, guide=smoother.guide(result), num_samples=4000)
    draws = predictive(jax.random.key(2), y=y, obs_var=obs_var, level_var=level_var, future=HORIZON)
    future = np.asarray(draws["y_future"])
    lo, hi = np.quantile(future, [0.05, 0.95], axis=0)
    print(f"  forecast 1971: {future[:, 0].mean():.1f}, 90% interval [{lo[0]:.0f}, {hi[0]:.0f}]")

    folder = pathlib.Path(out) if out else pathlib.Path(tempfile.mkdtemp(prefix="blrppl_state_space_"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nile.png"
    _plot(path, years, np.asarray(y), mean, sd, future)
    print(f"  figure: {path}")
    return path


def _plot(path, years, y, mean, sd, future):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ahead = years[-1] + np.arange(1, future.shape[1] + 1)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(years, y, "o", ms=3, color="0.3", label="annual flow")
    ax.plot(years, mean, color="C0", label="smoothed level")
    ax.fill_between(years, mean - Z90 * sd, mean + Z90 * sd, color="C0", alpha=0.25, label="90% band")
    lo, hi = np.quantile(future, [0.05, 0.95], axis=0)
    ax.plot(ahead, future.mean(0), color="C1", label="forecast (90% band)")
    ax.fill_between(ahead, lo, hi, color="C1", alpha=0.25)
    ax.set(xlabel="year", ylabel="flow (10^8 m^3)", title="Nile at Aswan: local level, EM + Kalman smoother")
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="maximum EM steps")
    parser.add_argument("--out", default=None, help="folder for nile.png (default: a new temporary folder)")
    cli = parser.parse_args()
    main(cli.steps, cli.out)
