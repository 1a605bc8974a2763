"""Stochastic VI: the BLR on minibatches of one subsampled plate (Khan & Rue, Sec. 5.3).

Each step reads a minibatch of M of the plate's N observations (blrppl's
own epoch-wise permutation: every observation once per epoch when M divides
N). Variables local to the plate get ρ = 1 on their minibatch rows; global
variables take a step of size ρ_t towards the rescaled minibatch target
(Hoffman et al. 2013):

    λ ← (1 - ρ_t) λ + ρ_t [Σ_{f outside} λ̃_f + (N / M) Σ_{f in plate} λ̃_f(batch)]   (Eq. 58)

In local mode (Eq. 60; incremental, Neal & Hinton) each observation keeps
its latest contribution to the global site parameters: refreshing a
minibatch swaps its old contributions for new ones, so after one pass at
ρ = 1 a conjugate model with one global latent is exact. Contributions are
stored compactly (see :mod:`blrppl.blr.incremental`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp

from blrppl.blr.build import mean_params
from blrppl.blr.elbo import entropy_terms
from blrppl.blr.state import BLRInfo, BLRState, InferenceAlgorithm
from blrppl.blr.update import global_update


def minibatch(batch_key: jax.Array, step: jax.Array, size: int, batch_size: int) -> jax.Array:
    """The minibatch of step ``step`` (from 1): epoch-wise random permutations."""
    per_epoch = max(size // batch_size, 1)
    index = step - 1
    epoch, position = index // per_epoch, index % per_epoch
    permutation = jax.random.permutation(jax.random.fold_in(batch_key, epoch), size)
    return jax.lax.dynamic_slice(permutation, (position * batch_size,), (batch_size,))


def _take_rows(tree: Any, rows: jax.Array, axis: int) -> Any:
    return jax.tree.map(lambda a: jnp.take(a, rows, axis=axis), tree)


def _put_rows(tree: Any, rows: jax.Array, values: Any, axis: int) -> Any:
    def put(a, v):
        moved = jnp.moveaxis(a, axis, 0)
        moved = moved.at[rows].set(jnp.moveaxis(v, axis, 0))
        return jnp.moveaxis(moved, 0, axis)

    return jax.tree.map(put, tree, values)


def build_svi(
    qs: Mapping[str, Any],
    estimators: Sequence[Any],
    *,
    plate: Any,
    local_axes: Mapping[str, int],
    plate_factors: frozenset,
    rho: Callable[[jax.Array], jax.Array],
    init_natural: Callable[[jax.Array], dict],
    batch_key: jax.Array,
    init_params: Optional[Mapping[str, Any]] = None,
    order: Optional[Sequence[str]] = None,
    incremental: Any = None,
) -> InferenceAlgorithm:
    """Build stochastic VI for one subsampled plate.

    Args:
      qs: variable name -> its q.
      estimators: one per factor; those in ``plate_factors`` accept ``batch=``.
      plate: the subsampled :class:`~blrppl.graph.nodes.Plate` (N, M).
      local_axes: local variable name -> the axis of its natural parameters
        that indexes the plate.
      plate_factors: names of the factors inside the plate.
      rho: the global learning-rate schedule ρ_t (t from 1).
      init_natural: ``rng_key -> natural``.
      batch_key: the key of the epoch permutations.
      init_params: point estimates (kept fixed here).
      order: the order of global variables (default: as in ``qs``).
      incremental: local mode's store (:func:`blrppl.blr.incremental.build_store`),
        or None for the global (stepwise) mode.
    """
    estimators = tuple(estimators)
    size, batch_size = plate.size, plate.subsample_size
    scale = size / batch_size
    local = [v for v in qs if v in local_axes]
    globals_ = [v for v in (order or tuple(qs)) if v not in local_axes]
    init_params = dict(init_params or {})

    def init(rng_key):
        natural = init_natural(rng_key)
        if local:
            # The local latents start from symmetry-breaking responsibilities;
            # one full coordinate step of the globals carries that start over
            # (otherwise the first local step would erase it).
            for i, v in enumerate(globals_):
                msgs = messages(jax.random.fold_in(rng_key, i), natural, init_params, v, None)
                natural[v] = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *[g for _, g, _ in msgs])
        sites = incremental.init(natural, init_params) if incremental is not None else {}
        return BLRState(natural=natural, site_params=sites, params=dict(init_params), step=jnp.zeros((), jnp.int32))

    def messages(rng_key, natural, params, v, batch):
        mean = mean_params(qs, natural)
        out = []
        for i, est in enumerate(estimators):
            if v not in est.neighbours:
                continue
            key = jax.random.fold_in(rng_key, i)
            if est.factor in plate_factors:
                _, grads = est.estimate(key, mean, params, batch=batch)
                out.append((est.factor, grads[v], True))
            else:
                _, grads = est.estimate(key, mean, params)
                out.append((est.factor, grads[v], False))
        return out

    def step(rng_key, state):
        t = state.step + 1
        r = jnp.asarray(rho(t), jnp.result_type(float))
        batch = minibatch(batch_key, t, size, batch_size)
        natural, sites, params = dict(state.natural), state.site_params, state.params
        local_key, global_key, elbo_key = jax.random.split(rng_key, 3)
        # Local variables: rho = 1 on the minibatch rows (the exact local step).
        for i, v in enumerate(local):
            msgs = messages(jax.random.fold_in(local_key, i), natural, params, v, batch)
            target = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *[g for _, g, _ in msgs])
            axis = local_axes[v]
            natural[v] = _put_rows(natural[v], batch, _take_rows(target, batch, axis), axis)
        # Global variables.
        for i, v in enumerate(globals_):
            key = jax.random.fold_in(global_key, i)
            if incremental is not None:
                mean = mean_params(qs, natural)
                target, sites = incremental.refresh(key, mean, params, v, batch, sites, r)
                natural[v] = target  # Eq. 60: λ = Σ_f λ̃_f, the batch's sites refreshed
                continue
            msgs = messages(key, natural, params, v, batch)
            scaled = [jax.tree.map(lambda g: scale * g, g) if in_plate else g for _, g, in_plate in msgs]
            natural[v] = global_update(natural[v], scaled, r)  # Eq. 58
        new_state = BLRState(natural=natural, site_params=sites, params=params, step=t)
        return new_state, BLRInfo(elbo=elbo(elbo_key, new_state, batch), rho=r)

    def elbo(rng_key, state, batch=None):
        """The minibatch estimate of the ELBO (the full ELBO without a batch)."""
        mean = mean_params(qs, state.natural)
        total = jnp.zeros((), jnp.result_type(float))
        for i, est in enumerate(estimators):
            key = jax.random.fold_in(rng_key, i)
            if est.factor in plate_factors and batch is not None:
                value, _ = est.estimate(key, mean, state.params, batch=batch)
                total = total + scale * value
            else:
                total = total + est.estimate(key, mean, state.params)[0]
        for v, h in entropy_terms(qs, state.natural).items():
            if v in local_axes and batch is not None:
                total = total + scale * jnp.sum(jnp.take(h, batch, axis=local_axes[v]))
            else:
                total = total + jnp.sum(h)
        return total

    return InferenceAlgorithm(init=init, step=step, elbo=lambda k, s: elbo(k, s))
