"""Per-observation plan arrays follow the data's sharding (data-parallel fits).

When the model's data arrive sharded along their plate axis (a
:class:`jax.sharding.NamedSharding`, e.g. from :func:`blrppl.sharding.shard`),
the arrays a plan computes from them once (a GLM's design rows and offsets,
a symbolic analysis's per-observation operands) must stay split the same way;
otherwise the compiled step would hold a full copy on every device. Anything
computed per observation keeps the observation axis first, so a plan array
whose leading axis has the data's sharded length is placed with the data's
sharding; everything else is left as it is (small and replicated). The step's
sums over observations then compile to all-reduces of per-device partial sums
(GSPMD), which is all the communication a BLR step needs (Khan & Rue, Eq. 58:
λ = Σ_i λ̃_i).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
from jax.sharding import NamedSharding, PartitionSpec


def data_sharding(data: Any) -> Optional[tuple[int, NamedSharding]]:
    """(number of observations, sharding) of the first data array split along its leading axis, or None."""
    for x in jax.tree_util.tree_leaves(data):
        sharding = getattr(x, "sharding", None)
        if not isinstance(sharding, NamedSharding) or not sharding.spec or sharding.spec[0] is None:
            continue
        if sharding.mesh.devices.size > 1 and x.ndim:
            return x.shape[0], sharding
    return None


def follow_data_sharding(tree: Any, data: Any) -> Any:
    """``tree`` with every array leaf of leading length N placed like the sharded data (N rows)."""
    found = data_sharding(data)
    if found is None:
        return tree
    size, sharding = found
    axis = sharding.spec[0]

    def place(x):
        if not hasattr(x, "shape") or not x.shape or x.shape[0] != size:
            return x
        current = getattr(x, "sharding", None)
        if isinstance(current, NamedSharding) and current.spec and current.spec[0] == axis:
            return x
        return jax.device_put(x, NamedSharding(sharding.mesh, PartitionSpec(axis)))

    return jax.tree.map(place, tree)
