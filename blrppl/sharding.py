"""Data-parallel fits: the data's plate axis sharded across devices with ``jax.sharding``.

JAX is the distributed engine; nothing here is home-made. :func:`shard`
places a model's data arrays on a device :class:`~jax.sharding.Mesh` with a
:class:`~jax.sharding.NamedSharding` that splits their leading (plate) axis
across the devices. Every engine then runs unchanged: the compiled BLR step
takes the data as arguments, so ``jax.jit`` (GSPMD) keeps the per-observation
work (linear predictors, Gauss-Hermite nodes, expected log factors) where the
rows live, and the sums over observations that make site parameters
(λ̃ = Σ_n λ̃_n, Khan & Rue Eq. 58) and the ELBO become collectives (all-reduce
of the small per-device partial sums). The q's natural parameters are small
and replicated.

On several hosts, start every process with ``jax.distributed.initialize()``
and build the mesh from ``jax.devices()`` (all hosts' devices); each process
then passes its global arrays (``jax.make_array_from_process_local_data``)
the same way.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

#: The mesh axis the data's plate axis is split over.
DATA_AXIS = "data"


def data_mesh(devices: Optional[Any] = None) -> Mesh:
    """A one-dimensional mesh over ``devices`` (default: every device), axis ``"data"``."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def shard(data: Any, mesh: Optional[Mesh] = None, *, axis: int = 0, size: Optional[int] = None) -> Any:
    """``data`` (any pytree of arrays) with its plate axis split across ``mesh``'s devices.

    Array leaves whose axis ``axis`` has length ``size`` (default: the
    longest such axis among the leaves, the number of observations) are
    sharded along it over the mesh's first axis; other leaves (a prior's
    hyperparameters, a batch size) are replicated. Pass the result to
    ``engine.run`` in place of the data::

        X, y = blrppl.shard((X, y))
        result = blrppl.NonConjugateVI(model).run(rng_key, 200, X, y)

    Args:
      data: arrays (numpy or JAX), or a pytree of them; non-array leaves
        pass through.
      mesh: a :class:`jax.sharding.Mesh` (default: :func:`data_mesh` over
        every device).
      axis: the plate axis of the data arrays.
      size: the number of observations (default: inferred as above).

    Raises:
      ValueError: when the number of observations is not a multiple of the
        number of devices (pad the data, with a mask, or use fewer devices).
    """
    mesh = data_mesh() if mesh is None else mesh
    leaves, treedef = jax.tree_util.tree_flatten(data)
    arrays = [x for x in leaves if isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x) > axis]
    if size is None:
        size = max((np.shape(x)[axis] for x in arrays), default=0)
    count = mesh.devices.size
    if size % count:
        raise ValueError(
            f"shard: {size} observations do not split evenly over {count} devices; pad the data to a "
            f"multiple of {count} (mask the padding) or use a mesh of fewer devices."
        )
    spec = [None] * (axis + 1)
    spec[axis] = mesh.axis_names[0]
    split = NamedSharding(mesh, PartitionSpec(*spec))
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        if not isinstance(x, (np.ndarray, jax.Array, np.generic)):
            return x
        if np.ndim(x) > axis and np.shape(x)[axis] == size:
            return jax.device_put(x, split)
        return jax.device_put(x, replicated)

    return jax.tree_util.tree_unflatten(treedef, [place(x) for x in leaves])
