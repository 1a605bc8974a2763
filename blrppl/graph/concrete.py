"""Which of a model's array arguments it needs as concrete values while it runs.

Compiled fits take the model's arrays as arguments (:mod:`blrppl.graph.data`),
so the model's code runs on abstract values. A model that counts its groups
with ``len(np.unique(group))`` or sizes a plate by ``int(np.max(idx)) + 1``
needs ``group`` or ``idx`` concrete: those arrays are held as constants of the
compiled program (and their content keys it), the others stay arguments.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp

from blrppl.graph.data import DATA_ERRORS
from blrppl.graph.replay import join_chain, replay, run_model

if TYPE_CHECKING:
    from blrppl.graph.nodes import FactorGraph


def example_latents(graph: "FactorGraph") -> dict[str, jax.Array]:
    """A fixed value in the support of every latent variable (chains joined)."""
    values = graph.site_values
    if not values:  # a graph built by hand: run the model once
        trace = run_model(graph.model, graph.model_args, graph.model_kwargs, placeholders=True).trace
        values = {name: site["value"] for name, site in trace.items() if site["type"] == "sample"}
    out = {}
    for name, node in graph.variables.items():
        if node.members:
            out[name] = {m.name: jnp.asarray(values[m.name]) for m in node.members}
        elif node.chain is not None:
            out[name] = join_chain(values, node.chain)
        else:
            out[name] = jnp.asarray(values[name])
    return out


def held_data(graph: "FactorGraph") -> tuple[int, ...]:
    """The positions in ``graph.data.arrays`` of the arrays the model needs concrete (``()``: none);
    read it as ``graph.held_data`` (computed once per graph).

    The model runs (abstractly: ``jax.eval_shape``, its ``numpyro.param`` sites at their
    initial values) with every array abstract; where that fails, with each array abstract
    alone: those that fail alone are held, and the others are checked abstract together
    (else every array is held).
    """
    data = graph.data
    if not data.arrays:
        return ()
    values: dict = {}
    for v, value in example_latents(graph).items():
        if isinstance(value, dict):  # a joint block: its member sites
            values.update(value)
        else:
            values[v] = value

    def traceable(positions: Sequence[int]) -> bool:
        def run(abstract):
            arrays = list(data.arrays)
            for i, array in zip(positions, abstract):
                arrays[i] = array
            sites = replay(graph, values, {}, data=arrays)
            return [site.value for site in sites.values()]

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jax.eval_shape(run, [data.arrays[i] for i in positions])
        except DATA_ERRORS:
            return False
        return True

    everything = tuple(range(len(data.arrays)))
    if traceable(everything):
        return ()
    held = tuple(i for i in everything if not traceable((i,)))
    rest = tuple(i for i in everything if i not in held)
    return held if rest and traceable(rest) else everything


def with_held_data(graph: "FactorGraph", held: Sequence[int]) -> tuple:
    """``graph.data.arrays`` with None in the ``held`` places (what compiled code takes as arguments;
    :meth:`~blrppl.graph.data.ModelData.rebuild` puts the held arrays back)."""
    return tuple(None if i in held else a for i, a in enumerate(graph.data.arrays))
