"""``python -m blrppl``: fit models of the zoo, print a summary, write the results.

    python -m blrppl list
    python -m blrppl fit [MODEL ...|all] [--algorithm NAME] [--steps N] [--tol T] [--draws S]
                         [--restarts C] [--seed K] [--out DIR] [--no-plots] [--quiet]

The engine is chosen from the model's trace (:func:`blrppl.choose`) unless
``--algorithm`` names one. For each model the command prints the chosen
engine and why, a summary of the posterior (NumPyro's ``print_summary``
columns, from draws of q), the fitted ``numpyro.param`` values, the ELBO and
whether the run converged, and the Pareto-k diagnostic of q; with ``--out``
it writes ``posterior.nc`` (ArviZ), ``summary.txt`` (what was printed),
``fit.npz`` (``result.save``), ``params.json`` (when the model has
``numpyro.param`` sites) and the figures of :mod:`blrppl.plots`; with
several models, each goes to ``DIR/MODEL/``.

Bad arguments and models an engine cannot fit are reported in one line
(``blrppl: error: ...``), exit status 2 and 1; no traceback.

The zoo lives in the repository's ``models/`` package (deliberately not
installed into site-packages, where a top-level ``models`` would collide with
other packages); run the command from the repository root, or point
``BLRPPL_MODELS`` at the folder that holds ``models/``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys
import threading
import time
import warnings
from typing import Any, Optional, Sequence

DEFAULT_MODEL = "gaussian_mixture"
MAX_SUMMARY_SIZE = 50
AUTO = "auto"
#: Errors a fit reports in one line: the model or the options do not suit the engine.
FIT_ERRORS = (ValueError, FloatingPointError, NotImplementedError)


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
    raise CommandError("cannot find the models/ zoo; run from the repository root or set BLRPPL_MODELS.")


class CommandError(Exception):
    """A bad command line: reported in one line, exit status 2."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _engine(entry: Any, algorithm: str, model_args: tuple, model_kwargs: dict) -> tuple[Any, str, str, Any]:
    """(engine, its name, why, its plan or None) for ``--algorithm``."""
    from blrppl.choosing import ENGINES, choose

    if algorithm == AUTO:
        choice = choose(entry.model, *model_args, **model_kwargs)
        return choice.engine, choice.name, "chosen from the trace: " + "; ".join(choice.reasons), choice.plan
    return ENGINES[algorithm](entry.model), algorithm, "--algorithm", None


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the import where it is used raises it
        pass


def _fit_one(name: str, entry: Any, args: argparse.Namespace, out: Optional[pathlib.Path]) -> None:
    import jax
    import numpy as np

    from blrppl.summary import param_lines, summary_lines

    # ArviZ's import (2-3 s: xarray, scipy) runs beside the fit, which spends most of its time in
    # XLA with Python's lock released; the caller ignores FutureWarnings around this whole call.
    preload = threading.Thread(target=_import_quietly, args=("arviz",), daemon=True)
    preload.start()
    model_args, model_kwargs = entry.data()
    start = time.perf_counter()
    engine, engine_name, why, plan = _engine(entry, args.algorithm, model_args, model_kwargs)
    lines = [f"Fitting {name} ({entry.description}) with {engine_name} ({why}), up to {args.steps} steps."]
    print(lines[0], flush=True)
    options = dict(progress_bar=not args.quiet, tol=args.tol, num_restarts=args.restarts)
    if plan is not None and hasattr(engine, "fit"):
        result = engine.fit(plan, jax.random.key(args.seed), args.steps, **options)
    else:
        result = engine.run(jax.random.key(args.seed), args.steps, *model_args, **options, **model_kwargs)
    if args.algorithm == AUTO:  # a mean-field fit flagged by linear response: fit the coupled latents jointly
        from blrppl.choosing import jointly

        joint = jointly(entry.model, result, *model_args, **model_kwargs)
        if joint is not None:
            lines.append(f"Refitted with {joint.name}: {joint.reasons[0]}.")
            result = joint.engine.fit(joint.plan, jax.random.key(args.seed), args.steps, **options)
    seconds = time.perf_counter() - start
    preload.join()
    idata = result.to_arviz(jax.random.key(args.seed + 1), num_samples=args.draws)
    posterior = {k: np.asarray(v.values).reshape((-1,) + v.shape[2:]) for k, v in idata.posterior.items()}
    lines += summary_lines(posterior, 0.9, MAX_SUMMARY_SIZE)
    if result.params:
        lines.append("Point estimates (numpyro.param):")
        lines += param_lines(result.params)
    lines.append(_convergence(result, seconds))
    lines += [f"Flag: {flag}" for flag in result.flags]
    if result.restarts is not None:
        finals = ", ".join(f"{float(result.restart(c).elbo[-1]):.6g}" for c in range(result.num_restarts))
        chains = idata.posterior.sizes["chain"]
        others = result.num_restarts - chains
        elsewhere = (
            f"; {others} ended at another optimum (an equal ELBO there is an equally good one, such as "
            "the same components relabelled)" if others else ""
        )
        lines.append(
            f"Restarts: final ELBOs {finals}; best {result.restarts.best}; {chains} of {result.num_restarts} "
            f"share the best restart's q (KL < 1 nat) and are the ArviZ chains{elsewhere}"
        )
    diagnostic = result.pareto_k(jax.random.key(args.seed + 2), num_samples=args.draws)
    lines.append(f"{diagnostic} (PSIS of q against the model, {args.draws} draws; README: Pareto k)")
    print("\n".join(lines[1:]), flush=True)
    if out is not None:
        _write_outputs(result, idata, out, lines, args)


def _convergence(result: Any, seconds: float) -> str:
    steps = len(result.elbo)
    text = f"ELBO after {steps} steps: {float(result.elbo[-1]):.6f} ({seconds:.2f} s with tracing and compilation)"
    return f"{text}; {result.converged.reason}"


def _write_outputs(result: Any, idata: Any, out: pathlib.Path, lines: list, args: argparse.Namespace) -> None:
    import jax
    import numpy as np

    from blrppl.plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "posterior.nc", out / "summary.txt", pathlib.Path(result.save(out / "fit.npz"))]
    idata.to_netcdf(str(written[0]))
    written[1].write_text("\n".join(lines) + "\n")
    if result.params:
        params = {k: np.asarray(v).tolist() for k, v in result.params.items()}
        (out / "params.json").write_text(json.dumps(params, indent=1) + "\n")
        written.append(out / "params.json")
    if not args.no_plots:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            written += write_plots(result, idata, out, jax.random.key(args.seed + 3), args.tol)
    print("Wrote " + ", ".join(str(p) for p in written) + ".", flush=True)


CACHE_BY_DEFAULT = True
"""``fit`` turns on the persistent compilation cache unless ``--no-cache`` (the test suite sets this False)."""


def _fit(args: argparse.Namespace) -> int:
    from blrppl.choosing import ENGINES
    from blrppl.compilation_cache import enable_compilation_cache

    if CACHE_BY_DEFAULT and not args.no_cache:
        enable_compilation_cache()

    zoo = load_zoo()
    names = list(zoo) if args.models == ["all"] else (args.models or [DEFAULT_MODEL])
    unknown = [n for n in names if n not in zoo]
    if unknown:
        raise CommandError(f"unknown model {unknown[0]!r}; `python -m blrppl list` lists the zoo.")
    if args.algorithm != AUTO and args.algorithm not in ENGINES:
        raise CommandError(f"unknown algorithm {args.algorithm!r}; use one of {[AUTO, *ENGINES]}.")
    failed = []
    for name in names:
        out = None
        if args.out:
            out = pathlib.Path(args.out) if len(names) == 1 else pathlib.Path(args.out) / name
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                _fit_one(name, zoo[name], args, out)
        except FIT_ERRORS as error:
            print(f"blrppl: error: {name}: {error}", file=sys.stderr, flush=True)
            failed.append(name)
    if failed and len(names) > 1:
        print(f"blrppl: {len(failed)} of {len(names)} fits failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _list(args: argparse.Namespace) -> int:
    del args
    for name, entry in load_zoo().items():
        print(f"{name:28s} {entry.description}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line (``python -m blrppl --help``)."""
    from blrppl.choosing import ENGINES
    from blrppl.blr.restarts import DEFAULT_RESTARTS

    main_parser = argparse.ArgumentParser(prog="python -m blrppl", description=__doc__.splitlines()[0])
    commands = main_parser.add_subparsers(dest="command")
    fit = commands.add_parser("fit", help="fit zoo models on their bundled data")
    fit.add_argument("models", nargs="*", metavar="MODEL", help=f"zoo models, or 'all' (default {DEFAULT_MODEL})")
    fit.add_argument(
        "--algorithm", default=AUTO, choices=[AUTO, *ENGINES], help="the engine (default: chosen from the trace)"
    )
    fit.add_argument("--steps", type=_positive_int, default=200, help="the maximum number of steps")
    fit.add_argument(
        "--tol",
        type=_nonnegative_float,
        default=1e-6,
        help="stop once the ELBO changes by at most T relative, with no more than that left to gain by Aitken's "
        "extrapolation (Monte Carlo fits: q moves by KL <= T), twice",
    )
    fit.add_argument("--draws", type=_positive_int, default=1000, help="draws from q for summaries and ArviZ")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument(
        "--restarts",
        type=_positive_int,
        default=None,
        help=f"fit from this many starts (default: {DEFAULT_RESTARTS} for discrete latents, else 1)",
    )
    fit.add_argument("--out", default=None, help="write posterior.nc, summary.txt, fit.npz and figures here")
    fit.add_argument("--no-plots", action="store_true", help="write no figures")
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    fit.add_argument(
        "--no-cache",
        action="store_true",
        help="do not use JAX's persistent compilation cache (on by default here: ~/.cache/blrppl/jax, or "
        "$BLRPPL_COMPILATION_CACHE), so that a later run compiles nothing",
    )
    commands.add_parser("list", help="list the zoo")
    return main_parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m blrppl``: returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("fit", "list", "-h", "--help"):
        argv = ["fit", *argv]
    try:
        args = parser().parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage and the error
        return int(exit_.code or 0)
    try:
        if args.command == "list":
            return _list(args)
        return _fit(args)
    except CommandError as error:
        print(f"blrppl: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("blrppl: interrupted", file=sys.stderr)
        return 130
