"""``python -m blrppl``: fit a model of the zoo and print an ArviZ summary.

    python -m blrppl list
    python -m blrppl fit [MODEL] [--algorithm NAME] [--steps N] [--restarts C] [--out DIR]

The zoo lives in the repository's ``models/`` package (deliberately not
installed into site-packages, where a top-level ``models`` would collide with
other packages); run the command from the repository root, or point
``BLRPPL_MODELS`` at the folder that holds ``models/``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
import warnings
from typing import Optional, Sequence

DEFAULT_MODEL = "gaussian_mixture"
MAX_SUMMARY_SIZE = 50
ALGORITHMS = ("VMP", "ConjugateBayes", "EM", "BLR")


def load_zoo():
    """Import the repository's ``models`` package (see the module docstring)."""
    root = os.environ.get("BLRPPL_MODELS")
    candidates = [pathlib.Path(root)] if root else []
    candidates += [pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parents[1]]
    for folder in candidates:
        if (folder / "models" / "__init__.py").exists():
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
            return importlib.import_module("models").ZOO
    raise SystemExit("blrppl: cannot find the models/ zoo; run from the repository root or set BLRPPL_MODELS.")


def _fit(args: argparse.Namespace) -> int:
    import jax

    import blrppl

    zoo = load_zoo()
    if args.model not in zoo:
        raise SystemExit(f"blrppl: unknown model {args.model!r}; `python -m blrppl list` lists the zoo.")
    entry = zoo[args.model]
    model_args, model_kwargs = entry.data()
    engine = getattr(blrppl, args.algorithm)(entry.model)
    print(f"Fitting {entry.name} ({entry.description}) with {args.algorithm}, up to {args.steps} steps.")
    result = engine.run(
        jax.random.key(args.seed),
        args.steps,
        *model_args,
        progress_bar=not args.quiet,
        tol=args.tol,
        num_restarts=args.restarts,
        **model_kwargs,
    )
    idata = result.to_arviz(jax.random.key(args.seed + 1), num_samples=args.draws)
    shown = [v for v in idata.posterior.data_vars if idata.posterior[v].size // args.draws <= MAX_SUMMARY_SIZE]
    hidden = sorted(set(idata.posterior.data_vars) - set(shown))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az

        summary = az.summary(idata, var_names=shown, kind="stats" if args.restarts == 1 else "all")
    print(summary.to_string())
    if hidden:
        print(f"(not shown, more than {MAX_SUMMARY_SIZE} entries each: {', '.join(hidden)}; see the netCDF file)")
    print(f"ELBO after {len(result.elbo)} steps: {float(result.elbo[-1]):.6f}")
    if result.restarts is not None:
        finals = ", ".join(f"{float(fit.elbo[-1]):.6g}" for fit in map(result.restart, range(result.num_restarts)))
        print(f"Restarts (one ArviZ chain each; best {result.restarts.best}): final ELBOs {finals}")
    diagnostic = result.pareto_k(jax.random.key(args.seed + 2), num_samples=args.draws)
    print(
        f"{diagnostic} (PSIS of q against the model, {args.draws} draws; "
        "k < 0.5 good, < 0.7 ok, >= 0.7 q misses the posterior)"
    )
    if args.out:
        _write_outputs(result, idata, pathlib.Path(args.out))
    return 0


def _write_outputs(result, idata, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    idata.to_netcdf(str(out / "posterior.nc"))
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(1, len(result.elbo) + 1), result.elbo)
    ax.set_xlabel("step")
    ax.set_ylabel("ELBO")
    fig.tight_layout()
    fig.savefig(out / "elbo.png", dpi=100)
    plt.close(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az

        axes = az.plot_posterior(idata)
    import numpy as np

    np.ravel(axes)[0].figure.savefig(out / "posterior.png", dpi=80)
    plt.close("all")
    print(f"Wrote {out / 'posterior.nc'}, {out / 'elbo.png'} and {out / 'posterior.png'}.")


def _list(args: argparse.Namespace) -> int:
    del args
    for name, entry in load_zoo().items():
        print(f"{name:28s} {entry.description}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m blrppl``."""
    parser = argparse.ArgumentParser(prog="python -m blrppl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    fit = commands.add_parser("fit", help="fit a zoo model on its bundled data")
    fit.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    fit.add_argument("--algorithm", default="VMP", choices=ALGORITHMS)
    fit.add_argument("--steps", type=int, default=200)
    fit.add_argument("--tol", type=float, default=1e-4, help="stop when the ELBO changes by less")
    fit.add_argument("--draws", type=int, default=1000)
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--restarts", type=int, default=1, help="fit from this many starts (ArviZ chains)")
    fit.add_argument("--out", default=None)
    fit.add_argument("--quiet", action="store_true")
    commands.add_parser("list", help="list the zoo")
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list(args)
    if args.command is None:
        args = parser.parse_args(["fit", *(argv or [])])
    return _fit(args)
