"""PRNG keys in planning's loops evaluated with numpy (:mod:`blrppl.host_ops`).

NumPyro's ``scan`` splits its PRNG key at every step of the loop, and planning
runs the loop eagerly on the host. A key is no numpy array, and a JAX key
operation per step would cost a dispatch each; here a key is its raw bits
(:class:`HostKey`) and a split is Threefry-2x32 (JAX's default PRNG;
Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") in Python
integers, bit for bit what JAX computes (``jax._src.random.threefry2x32``,
with ``jax_threefry_partitionable``, JAX's default). Anything else (another
PRNG, a batch of keys, random bits) raises, and the caller compiles the loop.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

OPERATIONS = ("random_wrap", "random_unwrap", "random_split", "threefry2x32", "iota_2x32_shape")
"""The operations evaluated here: on keys, and the hash and counts of a split's compiled code."""

THREEFRY = "threefry2x32"
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_MASK = 0xFFFFFFFF


class HostKey(NamedTuple):
    """A key array on the host: its raw bits, ``uint32`` of shape ``(*shape, 2)``, and its PRNG."""

    data: np.ndarray
    impl: Any


def is_key(value: Any) -> bool:
    """Whether ``value`` is a JAX key array (typed: ``jax.random.key``)."""
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended)


def from_jax(key: jax.Array) -> HostKey:
    """A JAX key array on the host (its bits read once)."""
    impl = key.dtype._impl  # jax is pinned below 0.11
    if impl.name != THREEFRY:
        raise ValueError(f"a {impl.name} key")
    return HostKey(np.asarray(jax.random.key_data(key), np.uint32), impl)


def to_jax(key: HostKey) -> jax.Array:
    """The JAX key array holding ``key``'s bits (nothing compiles)."""
    from blrppl.compile_mode import to_device

    return jax.random.wrap_key_data(to_device(np.ascontiguousarray(key.data)), impl=key.impl.name)


def apply(name: str, params: dict, values: list) -> list:
    """Key operation ``name`` (one of ``OPERATIONS``) on host values; raises where not covered."""
    if name == "threefry2x32":
        words = np.broadcast_arrays(*(np.asarray(v, np.uint64) for v in values))
        return [np.asarray(w, np.uint32) for w in threefry2x32(*words)]
    if name == "iota_2x32_shape":
        counts = np.arange(math.prod(params["shape"]), dtype=np.uint64).reshape(params["shape"])
        return [np.asarray(counts >> np.uint64(32), np.uint32), np.asarray(counts & np.uint64(_MASK), np.uint32)]
    if name == "random_wrap":
        impl = params["impl"]
        if impl.name != THREEFRY:
            raise ValueError(f"a {impl.name} key")
        return [HostKey(np.asarray(values[0], np.uint32), impl)]
    key = values[0]
    if not isinstance(key, HostKey):
        raise TypeError("not a key")
    if name == "random_unwrap":
        return [key.data]
    return [split(key, tuple(params["shape"]))]


def split(key: HostKey, shape: tuple) -> HostKey:
    """``jax.random.split(key, shape)`` of one threefry key (partitionable: each new key
    hashes its index, a 64-bit count in two words)."""
    if key.data.shape != (2,) or not jax.config.jax_threefry_partitionable:
        raise ValueError("a batch of keys, or the original threefry split")
    k1, k2 = (int(word) for word in key.data)
    count = math.prod(shape)
    out = np.empty((count, 2), np.uint32)
    for c in range(count):
        out[c] = threefry2x32(k1, k2, c >> 32, c & _MASK)
    return HostKey(out.reshape(*shape, 2), key.impl)


def threefry2x32(k1: Any, k2: Any, x1: Any, x2: Any) -> tuple[Any, Any]:
    """The Threefry-2x32 hash (20 rounds) of the count ``(x1, x2)`` under key ``(k1, k2)``,
    in 32-bit words held by Python integers or ``uint64`` arrays (elementwise): JAX's
    ``_threefry2x32_lowering``."""
    schedule = (k1, k2, k1 ^ k2 ^ 0x1BD11BDA)
    x1, x2 = (x1 + k1) & _MASK, (x2 + k2) & _MASK
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x1 = (x1 + x2) & _MASK
            x2 = (((x2 << r) | (x2 >> (32 - r))) & _MASK) ^ x1
        x1 = (x1 + schedule[(i + 1) % 3]) & _MASK
        x2 = (x2 + schedule[(i + 2) % 3] + i + 1) & _MASK
    return x1, x2
