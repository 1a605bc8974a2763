"""Expectations of symbolic log factors under a mean-field q.

A log factor is compiled once (:func:`~blrppl.symbolic.analysis.analyse`) into
an :class:`~blrppl.symbolic.compiled.Analysis`, a list of statistic terms: a
coefficient, one pre-contracted constant operand (the data's sufficient
statistics: ``sum(y**2)``, ``X.T @ X``, per-group sums, ...) and reads of the
variables' mean parameters. Evaluating it (:func:`expected_value`) is then a
few einsums over mean parameters, so ``E_q[log f]`` is affine in each
variable's mean parameters and ``jax.grad`` of it with respect to them is the
exact site parameter (Khan & Rue, Eq. 54 and Sec. 5.1). Evaluation is plain
``jax.numpy``: the analysis may be an argument of a jitted function.

Mean parameters are given in *value layout*: for a variable of shape
``batch + block`` (``block``: the axes q keeps a full covariance over),

- Gaussian: ``x`` (shape ``batch + block``) and ``xx`` (``batch + block + block``,
  ``E[x x^T]`` within a block; ``E[x^2]`` when the block is scalar),
- Gamma: ``x``, ``log_x``; InverseGamma: ``inv_x``, ``log_x``;
  Beta: ``log_x``, ``log1m_x``; Dirichlet: ``log_x``; Bernoulli: ``x`` (read as
  an index, ``mu[z]``, its one-hot statistic (1 - x, x) is derived from it);
  Categorical: ``one_hot`` (shape ``value + (K,)``); Wishart: ``x``, ``log_det_x``;
  chain Gaussian: ``x``, ``xx``, ``x_next`` (lag one); chain Categorical:
  ``one_hot`` (T, K) and ``pair`` (T-1, K, K), the marginals and neighbouring
  pairwise marginals of a discrete chain.

Under mean-field, q factorises over variables and over the batch positions
of each variable, so the expectation of a product of reads is the product of
expectations, except where two reads of one variable may land on the same
position; those pairs are resolved at compile time
(:mod:`blrppl.symbolic.pairing`, :mod:`blrppl.symbolic.chain_reads`), or
rejected as non-conjugate.

The q kinds, :class:`~blrppl.symbolic.statistics.VarInfo` and the statistics
of point estimates are defined in :mod:`blrppl.symbolic.statistics`, and the
analysis types in :mod:`blrppl.symbolic.compiled`; both are re-exported here
for the estimators and engines.
"""

from __future__ import annotations

import string
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.symbolic.compiled import MAX_RUNS, Analysis, StatRead, StatTerm, index_runs, stats_needed
from blrppl.symbolic.statistics import (
    CHAIN,
    CHAIN_CATEGORICAL,
    GAUSSIAN,
    POINT,
    VarInfo,
    point_stats,
    statistic_name,
)
from blrppl.symbolic.terms import Index, Operand

__all__ = [
    "CHAIN",
    "CHAIN_CATEGORICAL",
    "GAUSSIAN",
    "POINT",
    "Analysis",
    "StatRead",
    "StatTerm",
    "VarInfo",
    "contract_fixed_reads",
    "einsum_letters",
    "expected_value",
    "point_stats",
    "read_statistic",
    "statistic_name",
    "stats_needed",
    "take_observations",
]


def einsum_letters(label_lists: Iterable[Sequence[Any]]) -> dict:
    """Map labels to distinct einsum subscript letters, in order of first appearance.

    Args:
      label_lists: the labels of each einsum operand (and of the output).

    Returns:
      Label -> a letter of ``string.ascii_letters`` (at most 52 labels).
    """
    mapping: dict = {}
    for labels in label_lists:
        for lab in labels:
            if lab not in mapping:
                mapping[lab] = string.ascii_letters[len(mapping)]
    return mapping


def take_observations(
    array: jax.Array, labels: Sequence[Any], label: Any, batch: jax.Array | None
) -> jax.Array:
    """Read ``array`` at the observations ``batch`` along the axis labelled ``label``.

    Args:
      array: an array with one label per axis.
      labels: its labels.
      label: the observation label.
      batch: integer positions (M,), or None for all observations.

    Returns:
      ``array`` itself when ``batch`` is None or ``array`` has no axis
      ``label``; else its minibatch, that axis of length M.
    """
    if batch is None or label not in labels:
        return array
    return jnp.take(array, batch, axis=list(labels).index(label))


def read_statistic(
    mean: Mapping, read: StatRead, obs: Any = None, batch: jax.Array | None = None
) -> tuple[jax.Array, list]:
    """Read one statistic of one variable's mean parameters at the read's positions.

    Args:
      mean: variable name -> value-layout dict of mean parameters.
      read: which variable, statistic and positions.
      obs: the observation label of a per-observation analysis (or None).
      batch: the minibatch of observations along ``obs`` (or None for all).

    Returns:
      ``(array, labels)``: the statistic gathered at the read's indices, one
      label per axis. A label repeated in the read reads a diagonal
      (``E[x_i^2]`` from ``E[x x^T]``).
    """
    stats = mean[read.var]
    if read.stat == "one_hot" and "one_hot" not in stats:
        array = jnp.stack([1.0 - stats["x"], stats["x"]], axis=-1)  # a Bernoulli read as an index
    else:
        array = stats[read.stat]
    index = []
    for idx in read.index:
        if batch is not None and obs in idx.labels:
            if idx.direct:
                idx = Index(idx.labels, batch)
            else:
                idx = Index(idx.labels, take_observations(jnp.asarray(idx.array), list(idx.labels), obs, batch))
        index.append(idx)
    array, index = _slice_ranges(array, index)
    gather_axes = [i for i, idx in enumerate(index) if not idx.direct]
    direct_axes = [i for i, idx in enumerate(index) if idx.direct]
    if gather_axes:
        union: list = []
        for i in gather_axes:
            for lab in index[i].labels:
                if lab not in union:
                    union.append(lab)
        moved = jnp.moveaxis(array, gather_axes, list(range(len(gather_axes))))
        index_arrays = []
        for i in gather_axes:
            idx = index[i]
            own = [lab for lab in union if lab in idx.labels]
            arr = idx.array
            arr = jnp.transpose(arr, [idx.labels.index(lab) for lab in own]) if jnp.ndim(arr) else arr
            dims = iter(jnp.shape(arr))
            index_arrays.append(jnp.reshape(arr, [next(dims) if lab in own else 1 for lab in union]))
        array = moved[tuple(index_arrays)]
        labels = union + [index[i].labels[0] for i in direct_axes]
    else:
        labels = [index[i].labels[0] for i in direct_axes]
    # Repeated labels read a diagonal (E[x_i^2] from E[x x^T]).
    while len(set(labels)) < len(labels):
        for p, lab in enumerate(labels):
            q = labels.index(lab)
            if q != p:
                array = jnp.diagonal(array, axis1=q, axis2=p)
                labels = [x for i, x in enumerate(labels) if i not in (q, p)] + [lab]
                break
    return array, labels


def _slice_ranges(array: jax.Array, index: list) -> tuple[jax.Array, list]:
    """Read constant index arrays made of a few evenly spaced runs as static slices.

    A gather at constant positions ``start, start + step, ...`` reads the same
    values as a strided slice, but its gradient (how site parameters are
    taken from the expectation) is a scatter-add, a serial loop on a CPU,
    where a slice's is a pad. An index of up to ``MAX_RUNS`` such runs (a
    scan's steps after the first, ``[1, 1, 2, ..., T - 1]``, whose first entry
    the operand zeroes) is read as their slices joined: its gradient is a sum
    of pads. Only a 1-D index whose label no other axis of the read shares is
    sliced (a shared label reads a diagonal jointly).
    """
    index = list(index)
    counts: dict = {}
    for idx in index:
        for lab in idx.labels:
            counts[lab] = counts.get(lab, 0) + 1
    for axis, idx in enumerate(index):
        arr = idx.array
        if idx.direct or not isinstance(arr, np.ndarray) or arr.ndim != 1 or counts[idx.labels[0]] != 1:
            continue
        size = array.shape[axis]
        positions = np.where(arr < 0, arr + size, arr).astype(np.int64)
        if positions.size == 0 or positions.min() < 0 or positions.max() >= size:
            continue  # out of range: left to the gather's own semantics
        runs = index_runs(positions, MAX_RUNS)
        if len(runs) > MAX_RUNS:
            continue
        pieces = [jax.lax.slice_in_dim(array, start, stop, step, axis=axis) for start, stop, step in runs]
        array = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)
        index[axis] = Index(idx.labels)
    return array, index


def expected_value(
    analysis: Analysis | Sequence[StatTerm], mean: Mapping, batch: jax.Array | None = None
) -> jax.Array:
    """E_q[log f] from mean parameters (value-layout dicts per variable).

    Args:
      analysis: an :class:`~blrppl.symbolic.compiled.Analysis` (or a list of
        terms: a scalar analysis). It may be traced (an argument of a jitted
        function): its coefficients and operands are then tracers.
      mean: variable name -> value-layout dict of mean parameters.
      batch: for a per-observation analysis, the observations to read
        (integer array, length M); the result is then the minibatch sum, not
        rescaled. None reads all observations.

    Returns:
      The scalar ``sum_t coeff_t * einsum(operand_t, reads_t...)``.
    """
    if not isinstance(analysis, Analysis):
        analysis = Analysis(tuple(analysis))
    obs = analysis.obs_label
    count = analysis.obs_size if batch is None else jnp.shape(batch)[0]
    total = 0.0
    for term in analysis.terms:
        arrays, label_lists = [], []
        if term.operand is not None:
            labels = list(term.operand.labels)
            arrays.append(take_observations(jnp.asarray(term.operand.array), labels, obs, batch))
            label_lists.append(labels)
        for read in term.reads:
            array, labels = read_statistic(mean, read, obs, batch)
            arrays.append(array)
            label_lists.append(labels)
        multiplier = count if (obs is not None and term.obs_label is None) else 1
        if not arrays:
            total = total + term.coeff * multiplier
            continue
        letters = einsum_letters(label_lists)
        spec = ",".join("".join(letters[l] for l in labs) for labs in label_lists) + "->"
        value = jnp.einsum(spec, *arrays, optimize="optimal" if len(arrays) < 5 else "greedy")
        total = total + term.coeff * multiplier * value
    return total


def contract_fixed_reads(analysis: Analysis, mean: Mapping, kept: Iterable[str]) -> Analysis:
    """The analysis with the reads of every variable not in ``kept`` contracted into the operands.

    With q's mean parameters fixed (EM's M-step, Khan & Rue Sec. 5.2), each term's
    operand and reads of other variables are summed, once, over every label that no read
    of a ``kept`` variable carries: ``expected_value(result, kept_mean)`` equals
    ``expected_value(analysis, {**mean, **kept_mean})``, but costs O(size of the kept
    variables' reads) instead of a pass over the data. A per-observation analysis is
    read whole (no minibatch).

    Args:
      analysis: a factor's analysis (may be traced).
      mean: value-layout mean parameters of the variables not in ``kept``.
      kept: the variables left as reads (point estimates).
    """
    kept = set(kept)
    count = analysis.obs_size
    terms = []
    for term in analysis.terms:
        arrays, label_lists = [], []
        if term.operand is not None:
            arrays.append(jnp.asarray(term.operand.array))
            label_lists.append(list(term.operand.labels))
        reads = tuple(r for r in term.reads if r.var in kept)
        for read in term.reads:
            if read.var not in kept:
                array, labels = read_statistic(mean, read)
                arrays.append(array)
                label_lists.append(labels)
        coeff = term.coeff * (count if (analysis.obs_label is not None and term.obs_label is None) else 1)
        if not arrays:
            terms.append(StatTerm(coeff, None, reads))
            continue
        kept_labels = {lab for r in reads for idx in r.index for lab in idx.labels}
        out = [lab for lab in einsum_letters(label_lists) if lab in kept_labels]
        letters = einsum_letters(label_lists)
        spec = ",".join("".join(letters[lab] for lab in labs) for labs in label_lists)
        spec += "->" + "".join(letters[lab] for lab in out)
        operand = jnp.einsum(spec, *arrays, optimize="optimal" if len(arrays) < 5 else "greedy")
        terms.append(StatTerm(coeff, Operand(operand, tuple(out)), reads))
    return Analysis(tuple(terms))
