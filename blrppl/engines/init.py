"""Where q starts: the prior, pushed through the graph in trace order.

Each variable starts at its prior factor's site parameter evaluated at the
starting q of its parents (a hierarchical prior ``theta ~ N(mu, 1/sqrt(tau))``
starts at N(E[mu], 1/E[tau])). Categorical latents break the symmetry of
exchangeable priors (mixture components), which would otherwise leave VMP at
the symmetric fixed point forever: when the latent indexes observations
(``y_n ~ f(mu[z_n])``), its responsibilities start from k-means++ seeding on
those observations (Arthur & Vassilvitskii 2007) with the rng_key, refined by
a few k-means steps; otherwise from random responsibilities.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from blrppl.blr.build import mean_params
from blrppl.errors import ModelError
from blrppl.estimators.base import owner
from blrppl.symbolic.expectation import CHAIN, CHAIN_CATEGORICAL, GAUSSIAN


def _placeholder(q, node) -> Any:
    """A valid member of the variable's family with the right shapes."""
    if q.kind in (GAUSSIAN, CHAIN, CHAIN_CATEGORICAL):
        return q.example_natural()
    if q.kind == "categorical":
        return q.family.stats_type(one_hot=jnp.zeros(q.shape + (q.num_categories,)))
    try:
        natural = q.family.from_numpyro(node.prior)
    except Exception as error:  # noqa: BLE001 - re-raised with the site named
        raise ModelError(
            f"site {q.name!r}: cannot start q ({q.family.name}) from the prior {type(node.prior).__name__} "
            f"({error}); pass init_state= or choose another family."
        ) from None
    num_batch = len(q.family.batch_shape(natural))
    return jax.tree.map(
        lambda a: jnp.broadcast_to(a, q.batch_shape + jnp.shape(a)[num_batch:]), natural
    )


def initial_natural(
    rng_key: jax.Array, plan: Any, init: Optional[Mapping[str, Any]] = None, cache: Optional[dict] = None
) -> dict:
    """Natural parameters to start from (see the module docstring).

    ``init`` maps sites to a numpyro distribution (q starts there) or a value
    (q keeps the spread it has from the prior but is centred at the value).
    ``cache`` (a dict the caller keeps for one plan) holds the compiled
    starts, so that running the same algorithm again does not recompile them.
    """
    qs, graph = plan.qs, plan.graph
    natural = {v: _placeholder(q, graph.variables[v]) for v, q in qs.items()}
    by_factor = {est.factor: est for est in plan.estimators}
    for i, (v, q) in enumerate(qs.items()):
        if q.kind == "categorical":
            key = jax.random.fold_in(rng_key, i)
            probs = _kmeans_responsibilities(key, graph, v, q)
            if probs is None:
                probs = jax.random.dirichlet(key, jnp.ones(q.num_categories), q.shape)
            natural[v] = q.family.stats_type(one_hot=jnp.log(probs))
            continue
        if q.kind == CHAIN_CATEGORICAL:
            natural[v] = _chain_start(jax.random.fold_in(rng_key, i), graph, v, q)
            continue
        priors = [f for f in graph.factors if owner(graph, f) == v]
        if not priors:
            continue
        if q.kind == GAUSSIAN and any(by_factor[f].method != "exact" for f in priors):
            natural[v] = _gaussian_from_prior(q, graph.variables[v])
            continue
        estimators = [by_factor[f] for f in priors]
        prior_start = _prior_start(v, q, estimators, qs, cache)
        natural[v], valid = prior_start(natural, jax.random.fold_in(rng_key, i), plan.init_params)
        if not bool(valid):
            raise ModelError(
                f"site {v!r}: its prior does not define a proper starting q ({q.family.name}); "
                "give the site a proper prior."
            )
    for v, start in (init or {}).items():
        natural[v] = _user_start(qs[v], natural[v], start)
    return natural


def _prior_start(v, q, estimators, qs, cache=None):
    """``(natural, rng_key, params) -> (λ_v, valid)``: the sum of ``v``'s prior site
    parameters at the current starts, and whether it is a valid q.

    One jit-compiled function: run eagerly, a chain's passes and the symbolic
    expectations would compile op by op, for every new chain length.
    """
    if cache is not None and v in cache:
        return cache[v]

    def start(natural, rng_key, params):
        mean = mean_params(qs, natural)
        messages = [est.estimate(rng_key, mean, params)[1][v] for est in estimators]
        total = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *messages)
        return total, jnp.all(q.family.is_valid(total))

    compiled = jax.jit(start)
    if cache is not None:
        cache[v] = compiled
    return compiled


def _gaussian_from_prior(q, node):
    """A Gaussian start for a site whose prior factor has no exact site parameter.

    The prior's mean and variance where numpyro has them (at the starting
    values of the site's parents), mapped to q's space; else the centre of
    the support with unit variance on the unconstrained space.
    """
    loc, var = None, None
    if q.transform is None:
        try:
            loc, var = jnp.asarray(node.prior.mean), jnp.asarray(node.prior.variance)
        except (NotImplementedError, AttributeError):
            loc = None
    if loc is None or not bool(jnp.all(jnp.isfinite(loc)) & jnp.all(jnp.isfinite(var)) & jnp.all(var > 0)):
        example = jnp.zeros(q.shape)
        loc, var = example, jnp.ones(q.shape)
    loc = jnp.broadcast_to(loc, q.shape)
    var = jnp.broadcast_to(var, q.shape)
    if q.family.event_ndim == 0:
        return q.family.from_usual(loc, jnp.sqrt(var))
    d = q.example_natural().x.shape[-1]
    flat_loc = jnp.reshape(loc, q.batch_shape + (d,))
    flat_var = jnp.reshape(var, q.batch_shape + (d,))
    return q.family.from_usual(flat_loc, covariance_matrix=flat_var[..., None] * jnp.eye(d))


def _user_start(q, natural, start):
    """q's natural parameters from a user's ``init`` entry."""
    if isinstance(start, dist.Distribution):
        if q.transform is not None:
            raise ModelError(
                f"site {q.name!r}: its q is a Gaussian on the unconstrained space; pass a value in "
                "the site's support as init, not a distribution."
            )
        try:
            new = q.family.from_numpyro(start)
        except Exception as error:  # noqa: BLE001 - re-raised with the site named
            raise ModelError(f"site {q.name!r}: init distribution is not a {q.family.name} ({error}); pass one.") from None
        return jax.tree.map(lambda a, old: jnp.broadcast_to(a, jnp.shape(old)), new, natural)
    value = jnp.asarray(start, jnp.result_type(float))
    if q.transform is not None:
        value = q.transform.inv(value)
    value = jnp.broadcast_to(value, q.shape)
    usual = q.family.to_usual(natural)
    kind = q.kind
    if kind == GAUSSIAN:
        if q.family.event_ndim == 0:
            return q.family.from_usual(value, usual["scale"])
        d = natural.x.shape[-1]
        flat = jnp.reshape(value, q.batch_shape + (d,))
        return natural._replace(x=-2.0 * jnp.einsum("...ij,...j->...i", natural.xxT, flat))
    if kind == "gamma":
        return q.family.from_usual(usual["concentration"], usual["concentration"] / value)
    if kind == "inverse_gamma":
        a = jnp.maximum(usual["concentration"], 2.0)
        return q.family.from_usual(a, value * (a - 1.0))
    if kind == "beta":
        total = usual["concentration1"] + usual["concentration0"]
        return q.family.from_usual(value * total, (1.0 - value) * total)
    if kind == "dirichlet":
        total = jnp.sum(usual["concentration"], -1, keepdims=True)
        return q.family.from_usual(value * total)
    if kind == "wishart":
        n = usual["concentration"]
        return q.family.from_usual(n, value / n[..., None, None])
    if kind == "categorical":
        probs = 0.9 * jax.nn.one_hot(value.astype(jnp.int32), q.num_categories) + 0.1 / q.num_categories
        return q.family.stats_type(one_hot=jnp.log(probs))
    if kind == "bernoulli":
        return q.family.stats_type(x=jnp.where(value > 0.5, 1.0, -1.0) * jnp.log(9.0))
    if kind == CHAIN_CATEGORICAL:
        probs = 0.9 * jax.nn.one_hot(value.astype(jnp.int32), q.num_categories) + 0.1 / q.num_categories
        return natural._replace(one_hot=jnp.log(probs), pair=jnp.zeros_like(natural.pair))
    raise ModelError(f"site {q.name!r}: init by value is not available for {q.family.name}; pass a distribution.")


def _chain_start(rng_key, graph, var, q):
    """A discrete chain starts with independent marginals (no pair potentials).

    The marginals are k-means responsibilities on the observations the
    states index, aligned at the end of the chain (a scan chain joined with
    its initial state has one state more than observations; that state
    starts uniform), or random responsibilities (Dirichlet(1) per step).
    """
    length, num = q.shape[0], q.num_categories
    probs = None
    for size in (length, length - 1):
        probs = _kmeans_responsibilities(rng_key, graph, var, dataclasses.replace(q, shape=(size,)))
        if probs is not None:
            uniform = jnp.full((length - size, num), 1.0 / num)
            probs = jnp.concatenate([uniform, probs])
            break
    if probs is None:
        probs = jax.random.dirichlet(rng_key, jnp.ones(num), (length,))
    return q.family.stats_type(one_hot=jnp.log(probs), pair=jnp.zeros((length - 1, num, num)))


LLOYD_STEPS = 10


def _distances(points, centres):
    return jnp.sum((points[:, None, :] - centres[None]) ** 2, -1)


def _kmeans_responsibilities(rng_key, graph, var, q):
    """Responsibilities from k-means++ seeding on the observations ``var`` indexes."""
    if len(q.shape) != 1:
        return None
    size, num = q.shape[0], q.num_categories
    for node in graph.factors.values():
        if node.kind != "likelihood" or var not in node.neighbours or node.value is None:
            continue
        data = jnp.asarray(node.value, jnp.result_type(float))
        if data.ndim == 0 or data.shape[0] != size or not bool(jnp.all(jnp.isfinite(data))):
            continue
        return _kmeans(rng_key, jnp.reshape(data, (size, -1)), num)
    return None


@functools.partial(jax.jit, static_argnums=2)
def _kmeans(rng_key: jax.Array, points: jax.Array, num: int) -> jax.Array:
    """k-means++ seeding and a few Lloyd steps; soft-hard responsibilities (N, num)."""
    size = points.shape[0]
    points = (points - points.mean(0)) / (points.std(0) + 1e-12)
    keys = jax.random.split(rng_key, num)
    centres = [points[jax.random.randint(keys[0], (), 0, size)]]
    for k in range(1, num):
        distance = jnp.min(jnp.stack([jnp.sum((points - c) ** 2, -1) for c in centres]), 0)
        choice = jax.random.choice(keys[k], size, p=distance / jnp.sum(distance))
        centres.append(points[choice])

    def lloyd(_, centres):
        hard = jax.nn.one_hot(jnp.argmin(_distances(points, centres), -1), num)
        counts = hard.sum(0)
        moved = (hard.T @ points) / jnp.maximum(counts, 1.0)[:, None]
        return jnp.where(counts[:, None] > 0, moved, centres)

    centres = jax.lax.fori_loop(0, LLOYD_STEPS, lloyd, jnp.stack(centres))
    hard = jax.nn.one_hot(jnp.argmin(_distances(points, centres), -1), num)
    return 0.9 * hard + 0.1 / num
