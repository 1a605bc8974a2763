"""Draws from a fitted q, shaped like the model's sites.

A chain variable's q covers the joined chain (an initial state and the states
of a ``scan``: T + 1 entries); the model samples it as two sites, so draws are
cut back into them (:func:`~blrppl.graph.replay.split_latents`): what
``numpyro.infer.Predictive(model, posterior_samples=...)`` and
``numpyro.infer.log_likelihood`` expect. Deterministic sites are computed by
re-running the model at each draw. Everything runs as one compiled function
(eagerly, each of the model's operations would compile on its own).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import jax

from blrppl.graph.replay import replay, split_latents
from blrppl.compile_mode import jit_for


#: Compiled functions of recent plans (the plan kept alive with them, so its id is not reused).
_COMPILED: OrderedDict = OrderedDict()
_MAX_COMPILED = 16


def compiled_for(plan: Any, key: Any, build: Callable[[], Callable], *, by_signature: bool = False) -> Callable:
    """``build()`` (a jitted function of ``plan``) once per plan and ``key``: repeated calls compile nothing.

    ``by_signature``: once per plan signature and ``key``, shared by every plan of that
    signature (a batch's data sets, refits on new data of the same shapes), for a ``build``
    whose function reads only the plan's structure and takes its arrays as arguments.
    """
    entry = (plan.signature if by_signature else id(plan), key)
    hit = _COMPILED.get(entry)
    if hit is not None and (by_signature or hit[0] is plan):
        _COMPILED.move_to_end(entry)
        return hit[1]
    fn = build()
    _COMPILED[entry] = (plan, fn)
    while len(_COMPILED) > _MAX_COMPILED:
        _COMPILED.popitem(last=False)
    return fn


def model_data(plan: Any) -> Any:
    """The model's array arguments as compiled code takes them (None: the traced ones, as constants)."""
    return None if plan.data_static else plan.arrays.data


class Draws(NamedTuple):
    """Joint draws from q, each leaf with a leading axis of draws.

    Attributes:
      latents: variable name -> draws in the site's support, chains joined
        (the layout :func:`~blrppl.graph.replay.replay` reads); a joint
        block contributes its member sites.
      sites: numpyro site name -> draws, chains cut into their sites, with
        the model's deterministic sites.
    """

    latents: dict
    sites: dict


def family_draws(plan: Any, natural: dict, rng_key: jax.Array, num_samples: int) -> dict:
    """Variable -> ``num_samples`` draws from its q in the family's own space (for T(x))."""
    keys = jax.random.split(rng_key, max(len(plan.qs), 1))
    return {v: q.family.sample(key, natural[v], (num_samples,)) for key, (v, q) in zip(keys, plan.qs.items())}


def to_support(plan: Any, draws: dict) -> dict:
    """Family-space draws -> values in each site's support (joint blocks -> their member sites)."""
    latents = {}
    for v, q in plan.qs.items():
        values = q.value_from_family(draws[v])
        if q.joint:
            latents.update(q.transform(values))
        else:
            latents[v] = values if q.transform is None else q.transform(values)
    return latents


def latent_draws(plan: Any, natural: dict, rng_key: jax.Array, num_samples: int) -> dict:
    """Variable -> ``num_samples`` joint draws from its q, in the site's support."""
    return to_support(plan, family_draws(plan, natural, rng_key, num_samples))


def compiled_family_draws(plan: Any, num_samples: int) -> Callable:
    """:func:`family_draws` compiled once per plan and ``num_samples``: ``fn(rng_key, natural)``.

    Every consumer of draws from q (ArviZ's posterior, the Pareto-k
    diagnostic, leave-one-out weights) shares it, so a q's sampler (a Gamma's
    rejection loop, a chain's backward pass) compiles once per fit.
    """
    build = lambda: jit_for(plan.arrays, lambda key, natural: family_draws(plan, natural, key, num_samples))  # noqa: E731
    return compiled_for(plan, ("family_draws", num_samples), build, by_signature=True)


def draw(result: Any, rng_key: jax.Array, num_samples: int) -> Draws:
    """``num_samples`` joint draws from ``result``'s q (see the module docstring)."""
    plan = result.plan

    def build():
        graph = plan.graph
        names = tuple(graph.deterministics)

        def run(family, params, data):
            latents = to_support(plan, family)
            sites = jax.vmap(lambda values: split_latents(graph, values))(latents)
            if names:

                def deterministic(values):
                    replayed = replay(graph, values, params, deterministic=True, data=data)
                    return {n: replayed[n].value for n in names if n in replayed}

                sites.update(jax.vmap(deterministic)(latents))
            return Draws(latents, sites)

        return jit_for(plan.arrays, run)

    run = compiled_for(plan, ("draw",), build, by_signature=True)
    family = compiled_family_draws(plan, num_samples)(rng_key, result.natural_params)
    return run(family, dict(result.state.params), model_data(plan))
