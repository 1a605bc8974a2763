"""Save a fit to a plain array file and load it back (no pickle).

``result.save(path)`` writes a NumPy ``.npz`` file of the fit's arrays: every
leaf of the engine state under a string key naming its place in the state
(``state.natural['mu'].x``), the ELBO trace, and with restarts the stacked
states, traces and the best restart's index, plus the format version and the
mode. Nothing else: the traced graph holds the model's Python code, which an
array file cannot hold, so loading needs the engine, the model and its data
again::

    result.save("fit.npz")
    loaded = blrppl.VMP(model).load("fit.npz", y=y)     # or blrppl.load("fit.npz", engine, y=y)
    engine.run(rng_key, 50, y=y, init_state=loaded.state)   # resume

:func:`load` traces the model, builds the engine's starting state as a
template and fills it with the saved arrays, checking that every key and shape
matches; it is loaded with ``allow_pickle=False``.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.blr import driver
from blrppl.errors import ModelError
from blrppl.graph.data import content_digest
from blrppl.results import BLRResult, Restarts

FORMAT = "blrppl-result-1"


def _is_key(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.asarray(leaf).dtype if not hasattr(leaf, "dtype") else leaf.dtype, jax.dtypes.prng_key)


def _flatten(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    """Named arrays of a pytree; PRNG keys (the state's random stream) as their raw key data."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {
        prefix + jax.tree_util.keystr(path): np.asarray(jax.random.key_data(leaf) if _is_key(leaf) else leaf)
        for path, leaf in leaves
    }


def save(result: BLRResult, path: Any) -> str:
    """Write ``result``'s arrays to ``path`` (``.npz`` appended if missing); returns the path."""
    path = os.fspath(path)
    if not path.endswith(".npz"):
        path += ".npz"
    arrays = _flatten("state", result.state)
    arrays["elbo"] = np.asarray(result.elbo)
    arrays["format"] = np.asarray(FORMAT)
    arrays["mode"] = np.asarray(result.mode)
    arrays["data"] = np.asarray(content_digest(result.graph.data.arrays))
    if result.restarts is not None:
        r = result.restarts
        arrays.update(_flatten("restarts.state", r.state))
        arrays["restarts.elbo"] = np.asarray(r.elbo)
        arrays["restarts.num_steps"] = np.asarray(r.num_steps)
        arrays["restarts.best"] = np.asarray(r.best)
        arrays["restarts.finite"] = np.asarray(r.finite)
    np.savez(path, **arrays)
    return path


def _fill(prefix: str, template: Any, arrays: Any, path: str) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    expected = {prefix + jax.tree_util.keystr(p) for p, _ in leaves}
    saved = {k for k in arrays.files if k.startswith(prefix + ".") or k.startswith(prefix + "[")}
    if expected != saved:
        missing, extra = sorted(expected - saved), sorted(saved - expected)
        raise ModelError(
            f"site {path!r}: the saved fit does not match this engine and model (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); load with the engine settings, model and data of the saved fit."
        )
    out = []
    for p, template_leaf in leaves:
        leaf = template_leaf
        key = prefix + jax.tree_util.keystr(p)
        value = arrays[key]
        if _is_key(leaf):
            leaf = jax.random.key_data(leaf)
        if value.shape != jnp.shape(leaf):
            raise ModelError(
                f"site {path!r}: {key} has shape {value.shape} in the file but {jnp.shape(leaf)} for this "
                "model; pass the data of the saved fit."
            )
        if _is_key(template_leaf):  # the state's random stream, in the template's key implementation
            out.append(jax.random.wrap_key_data(jnp.asarray(value), impl=jax.random.key_impl(template_leaf)))
        else:
            out.append(jnp.asarray(value))
    return jax.tree_util.tree_unflatten(treedef, out)


def load(path: Any, engine: Any, *model_args: Any, **model_kwargs: Any) -> BLRResult:
    """The result saved at ``path``, for ``engine`` on the model's data (see the module docstring).

    Args:
      path: the ``.npz`` file ``result.save`` wrote.
      engine: an engine configured as for the saved fit (same class and
        options: they decide the state's layout).
      *model_args, **model_kwargs: the model's arguments of the saved fit.

    Returns:
      A :class:`~blrppl.results.BLRResult` equal to the saved one.

    Raises:
      ModelError: the file's arrays do not fit this engine, model or data.
    """
    path = os.fspath(path)
    if not os.path.exists(path) and os.path.exists(path + ".npz"):
        path += ".npz"
    with np.load(path, allow_pickle=False) as arrays:
        if "format" not in arrays.files or str(arrays["format"]) != FORMAT:
            raise ModelError(f"site {path!r}: not a blrppl result file ({FORMAT}); save one with result.save.")
        mode = str(arrays["mode"])
        if mode != engine.mode:
            raise ModelError(
                f"site {path!r}: the fit was saved in mode {mode!r} but the engine runs in mode "
                f"{engine.mode!r}; load with an engine in mode {mode!r}."
            )
        plan = engine.plan(*model_args, **model_kwargs)
        if "data" in arrays.files and str(arrays["data"]) != content_digest(plan.graph.data.arrays):
            raise ModelError(
                f"site {path!r}: the data passed to load differ from the data of the saved fit; "
                "pass the model arguments the fit was made with."
            )
        template = driver.init(engine.build(plan), jax.random.key(0), plan.arrays)
        state = _fill("state", template, arrays, path)
        restarts = None
        if "restarts.elbo" in arrays.files:
            elbo = jnp.asarray(arrays["restarts.elbo"])
            stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (elbo.shape[0],) + jnp.shape(a)), template)
            restarts = Restarts(
                state=_fill("restarts.state", stacked, arrays, path),
                elbo=elbo,
                num_steps=jnp.asarray(arrays["restarts.num_steps"]),
                best=int(arrays["restarts.best"]),
                finite=jnp.asarray(arrays["restarts.finite"]),
            )
        return BLRResult(plan=plan, state=state, elbo=jnp.asarray(arrays["elbo"]), mode=mode, restarts=restarts)
