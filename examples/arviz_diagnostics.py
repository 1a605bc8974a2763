"""ArviZ diagnostics of a blrppl fit: LOO, a posterior predictive check, Pareto k, r-hat.

``result.to_arviz`` gives an ``arviz.InferenceData`` (posterior draws from q
with plate names as dims, pointwise log likelihood, observed data, the ELBO
and, when asked, posterior predictive draws), so ArviZ's tools apply as they
are: ``az.summary``, ``az.loo`` (PSIS-LOO), ``az.plot_ppc``. Is q itself
any good? ``result.pareto_k`` runs PSIS on log p(x, y) - log q(x) for draws
from q (Yao et al. 2018: k < 0.5 good, k >= 0.7 q misses the posterior), and
``num_restarts`` fits from several starts at once; those that reach the best
optimum become ArviZ chains, so r-hat checks that they agree.
``result.loo()`` is leave-one-out from the site parameters (no refit, no
importance sampling of the posterior), comparable with ``az.loo``.

    python examples/arviz_diagnostics.py [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import warnings

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import blrppl  # noqa: E402
from blrppl.cli import load_zoo  # noqa: E402


def main(steps: int = 100, out: str | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az

    out_dir = pathlib.Path(out or tempfile.mkdtemp(prefix="blrppl-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    entry = load_zoo()["linear_regression"]
    args, kwargs = entry.data()

    # Four starts in one vmapped run; the result is the best, those at its optimum become chains.
    result = blrppl.VMP(entry.model).run(
        jax.random.key(0), steps, *args, progress_bar=False, tol=1e-8, num_restarts=4, **kwargs
    )
    idata = result.to_arviz(
        jax.random.key(1),
        num_samples=1000,
        posterior_predictive=True,
        dims={"beta": ["covariate"]},
        coords={"covariate": ["x1", "x2", "x3"]},
    )
    print(idata)
    print(az.summary(idata, var_names=["alpha", "beta", "tau"]).to_string())
    result.print_summary()  # NumPyro's table

    # Is q good? PSIS of q against the model.
    print(result.pareto_k(jax.random.key(2)))

    # Leave-one-out predictive accuracy: PSIS on the pointwise log likelihood,
    # and the same from each observation's site parameter (memory perturbation).
    loo = az.loo(idata, pointwise=True)
    print(loo)
    from_sites = result.loo()
    print(f"from site parameters: elpd_loo {from_sites.elpd_loo:.2f} (se {from_sites.se:.2f}), PSIS {loo.elpd_loo:.2f}")
    print(az.compare({"PSIS-LOO": loo, "site parameters": from_sites}).to_string())

    # Posterior predictive check: replicated data sets against the observations.
    az.plot_ppc(idata, num_pp_samples=100)
    plt.savefig(out_dir / "ppc.png", dpi=80)
    az.plot_posterior(idata, var_names=["alpha", "beta", "tau"])
    plt.savefig(out_dir / "posterior.png", dpi=80)
    plt.close("all")

    # Everything saves: the InferenceData as netCDF, the fit itself as plain arrays.
    idata.to_netcdf(str(out_dir / "idata.nc"))
    result.save(out_dir / "fit.npz")
    reloaded = blrppl.VMP(entry.model).load(out_dir / "fit.npz", *args, **kwargs)
    assert float(reloaded.elbo[-1]) == float(result.elbo[-1])
    print(f"wrote ppc.png, posterior.png, idata.nc and fit.npz to {out_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=None, help="folder for the plots and files (default: a temporary one)")
    parsed = parser.parse_args()
    main(parsed.steps, parsed.out)
