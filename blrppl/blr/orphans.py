"""Rows of a local latent that no observation touches are integrated out, not fitted.

A mixture's assignment ``z_n`` whose observation ``y_n`` is masked (``.mask()``,
``handlers.mask``, padding) is a latent that only its own prior
``p(z_n | weights)`` touches. Exact Bayes integrates it out: it contributes
nothing. Mean-field q does not: ``q(z_n)`` would send the prior's own counts
back to ``weights`` and add ``H[q(z_n)]`` to the ELBO, so the fit would differ
from deleting the row. Here such rows ("orphans") are handled as numpyro's
``obs_mask`` latents are (see :class:`~blrppl.blr.plan.Plan.imputed`), row by
row: the prior factor's site parameters to the *other* variables and its ELBO
term come from the model with the orphan rows masked, its site parameter to
the latent itself from the whole prior (so ``q(z_n)`` is the imputation, the
prior given the other variables' q), and the orphan rows' entropies are left
out. The fit then equals deleting the rows, ELBO included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax.numpy as jnp
import numpy as np
from numpyro.primitives import Messenger

from blrppl.estimators.base import FactorEstimator, PlanArrays
from blrppl.graph.nodes import FactorGraph


def orphan_rows(graph: FactorGraph, integrated: frozenset = frozenset()) -> dict[str, np.ndarray]:
    """Variable -> boolean mask (its batch shape) of the rows some unmasked factor touches.

    Only variables with a row that no other factor touches unmasked are
    listed: plated latents with their own prior factor, every other factor
    touching them masked (or an ``integrated`` missing-data factor, which
    informs its own latent only), none of them a chain, a joint block or
    missing data.
    """
    out = {}
    for v, node in graph.variables.items():
        if node.chain is not None or node.members or node.observed_mask is not None or not node.batch_shape:
            continue
        if v not in graph.factors or graph.factors[v].kind != "prior":
            continue
        others = [
            f for f, factor in graph.factors.items() if f != v and v in factor.neighbours and f not in integrated
        ]
        if not others or any(graph.factors[f].mask is None for f in others):
            continue
        used = np.zeros(node.batch_shape, bool)
        for f in others:
            rows = _rows_touched(graph, f, node)
            if rows is None:
                break
            used |= rows
        else:
            if not used.all():
                out[v] = used
    return out


def _rows_touched(graph: FactorGraph, factor: str, node: Any) -> Optional[np.ndarray]:
    """Rows of ``node`` (its batch shape) where ``factor``'s mask is True anywhere, or None if unknown."""
    mask = np.asarray(graph.factors[factor].mask, bool)
    dims = {graph.plates[p].dim: p for p in graph.factors[factor].plates if p in graph.plates}
    keep = set(node.plates)
    for axis in range(mask.ndim):
        dim = axis - mask.ndim
        if dims.get(dim) not in keep:
            mask = np.any(mask, axis=axis, keepdims=True)
    while mask.ndim > len(node.batch_shape):
        if mask.shape[0] != 1:
            return None
        mask = mask[0]
    try:
        return np.broadcast_to(mask, node.batch_shape).copy()
    except ValueError:
        return None


class _MaskSites(Messenger):
    """Mask the named sites' log densities with the given row masks."""

    def __init__(self, fn: Callable, masks: Mapping[str, np.ndarray]):
        self.masks = dict(masks)
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        mask = self.masks.get(msg.get("name"))
        if mask is None or msg["type"] != "sample":
            return
        mask = jnp.asarray(mask)
        msg["mask"] = mask if msg.get("mask") is None else msg["mask"] & mask


def masked_graph(graph: FactorGraph, orphans: Mapping[str, np.ndarray]) -> FactorGraph:
    """``graph`` whose model masks each orphaned variable's prior at its orphan rows."""
    model = graph.model

    def masked_model(*args: Any, **kwargs: Any) -> Any:
        return _MaskSites(model, orphans)(*args, **kwargs)

    masked_model.__name__ = getattr(model, "__name__", "model")
    masked_model.__wrapped__ = getattr(model, "__wrapped__", model)
    return dataclasses.replace(graph, model=masked_model)


def integrate_orphans(full: FactorEstimator, masked: FactorEstimator, own: str) -> FactorEstimator:
    """The prior factor of ``own``: masked site parameters to others and ELBO, full ones to ``own``."""
    factor = full.factor

    def estimate(rng_key, mean, params, arrays: PlanArrays, batch=None):
        full_arrays, masked_arrays = arrays.factors[factor]
        value, sites = masked.estimate(rng_key, mean, params, _with(arrays, factor, masked_arrays), batch)
        _, own_sites = full.estimate(rng_key, mean, params, _with(arrays, factor, full_arrays), batch)
        return value, {**sites, own: own_sites[own]}

    return masked._replace(
        estimate=estimate,
        arrays=(full.arrays, masked.arrays),
        closed_data=full.closed_data or masked.closed_data,
        delta=None,  # (a GLM's delta twin reads the unmasked arrays: the start takes the generic one)
    )


def _with(arrays: PlanArrays, factor: str, own_arrays: Any) -> PlanArrays:
    return arrays._replace(factors={**arrays.factors, factor: own_arrays})
