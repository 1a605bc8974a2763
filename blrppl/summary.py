"""Text summaries of a fit: NumPyro's ``print_summary`` table from draws of q, and the parameters.

Rows are sites (one per entry of a vector site, ``theta[3]``), columns the
mean, standard deviation, median and the central ``prob`` interval of the
draws. Draws from q are independent, so there is no r-hat or n_eff column.
A site with more than ``max_entries`` entries (a chain of 100 states) is
condensed into one line giving the range of its means and standard
deviations.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np


def summary_lines(samples: Mapping[str, Any], prob: float = 0.9, max_entries: Optional[int] = None) -> list[str]:
    """The table of :func:`print_summary` as lines of text."""
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must lie in (0, 1), got {prob}.")
    low, high = 50.0 * (1.0 - prob), 50.0 * (1.0 + prob)
    header = ["mean", "std", "median", f"{low:.1f}%", f"{high:.1f}%"]
    rows, condensed = [], []
    for name, value in samples.items():
        draws = np.asarray(value, dtype=float)
        flat = draws.reshape(draws.shape[0], -1)
        entries = flat.shape[1]
        if max_entries is not None and entries > max_entries:
            mean, sd = flat.mean(0), flat.std(0)
            condensed.append(
                f"{name}: {entries} entries of shape {draws.shape[1:]}; means {mean.min():.4g} to {mean.max():.4g}, "
                f"sds {sd.min():.4g} to {sd.max():.4g}"
            )
            continue
        stats = np.stack(
            [flat.mean(0), flat.std(0), np.median(flat, 0), np.percentile(flat, low, 0), np.percentile(flat, high, 0)], -1
        )
        for index, row in zip(np.ndindex(*draws.shape[1:]), stats):
            label = name if not index else f"{name}[{','.join(map(str, index))}]"
            rows.append((label, row))
    width = max([len(label) for label, _ in rows] + [8])
    lines = []
    if rows:
        lines.append(" " * (width + 2) + "".join(f"{h:>11s}" for h in header))
        lines.extend(f"{label:>{width + 2}s}" + "".join(f"{x:11.4g}" for x in row) for label, row in rows)
    lines.extend(condensed)
    return lines


def param_lines(params: Mapping[str, Any], max_entries: int = 12) -> list[str]:
    """One line per fitted ``numpyro.param`` site: its name and value."""
    lines = []
    for name, value in params.items():
        array = np.asarray(value, dtype=float)
        if array.ndim == 0:
            text = f"{float(array):.6g}"
        else:
            text = np.array2string(
                array, precision=5, threshold=max_entries, edgeitems=3, max_line_width=100, separator=", "
            )
            text = f"shape {array.shape}: {text}"
        lines.append(f"  {name} = {text}")
    return lines


def print_summary(result: Any, prob: float, samples: Mapping[str, Any], max_entries: Optional[int] = None) -> None:
    """Print the draws' table, the fitted parameters and the final ELBO (see the module docstring)."""
    lines = summary_lines(samples, prob, max_entries)
    if result.params:
        lines.append("Point estimates (numpyro.param):")
        lines.extend(param_lines(result.params))
    if len(result.elbo):
        lines.append(f"ELBO after {len(result.elbo)} steps: {float(result.elbo[-1]):.6f}")
    print("\n".join(lines))
