"""``blrppl.trace``: a model's factor graph with every edge's conjugacy verdict.

The graph comes from :func:`blrppl.graph.build_graph`; the verdicts from the
estimators (:func:`blrppl.estimators.select.graph_verdicts`): an edge is
conjugate when the factor's expected log density is affine in the variable's
sufficient statistics, and otherwise carries a reason a user can read.
"""

from __future__ import annotations

from typing import Any, Callable

from blrppl.blr.plan import param_examples
from blrppl.errors import ModelError
from blrppl.estimators.base import q_space_examples
from blrppl.graph.concrete import example_latents
from blrppl.estimators.select import graph_verdicts, with_verdicts
from blrppl.graph import FactorGraph, build_graph
from blrppl.graph.families import variable_q


def trace(model: Callable, *args: Any, **kwargs: Any) -> FactorGraph:
    """Trace ``model(*args, **kwargs)`` into its factor graph.

    Args:
        model: an ordinary NumPyro model (a Python callable).
        *args: the model's positional arguments.
        **kwargs: the model's keyword arguments (observations as ``obs=`` data).

    Returns:
        The model's :class:`~blrppl.graph.nodes.FactorGraph`: ``variables``
        (one per latent site or latent chain, with its q family), ``factors``
        (one per sample site, each edge with its conjugacy verdict),
        ``params``, ``deterministics`` and ``plates``.

    Raises:
        ModelError: naming the site, for NaN or infinite observations outside
            masked positions, shapes or control flow that depend on latent
            values, and latent discrete sites with infinite support.

    Example:
        >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> def model(y=None):
        ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with numpyro.plate("N", 3):
        ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> fg = trace(model, y=jnp.zeros(3))
        >>> fg.factors["y"].neighbours
        ('mu',)
        >>> fg.factors["y"].edges["mu"].conjugate
        True
    """
    graph = build_graph(model, args, kwargs)
    qs, missing = {}, {}
    for name, node in graph.variables.items():
        try:
            qs[name] = variable_q(node, graph.plates)
        except ModelError as error:
            missing[name] = str(error)
    transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
    examples = q_space_examples({k: v for k, v in example_latents(graph).items() if k in qs}, transforms)
    params, _ = param_examples(graph)
    return with_verdicts(graph, graph_verdicts(graph, qs, missing, examples, params))
