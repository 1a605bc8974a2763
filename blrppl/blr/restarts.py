"""``num_restarts=C``: C fits from random starts, the best kept.

Restart 0 starts where a plain ``run`` starts (the prior pushed through the
graph, k-means responsibilities for categorical latents, the user's
``init``), with the same keys, so it *is* the plain run. Restarts 1..C-1 start
from random points: each q whose family allows it (``random_restart``) is
re-centred at a random point drawn around its starting q (its spread kept, the
family's ``start_at``; the point is a draw from q, or for Gamma-based q's a
log-normal draw with q's mean and variance, ``restart_draw``), categorical latents get their own random responsibilities
(their own k-means, its clusters labelled in a canonical order, reversed or rotated by c: restarts try the
components on the clusters in different labellings, which differ where the components' priors do),
point estimates (EM) move by a standard normal step on their unconstrained
space, and sites the user fixed with ``init=`` keep that start. The C runs of
one data set run one after another with a single fit's programs
(:mod:`blrppl.blr.serial_restarts`); those of a batch of data sets are one
``jax.vmap`` of the compiled driver loop (:func:`blrppl.blr.driver.run_restarts`).

The best restart is the one with the highest final ELBO among those whose q
and ELBO are finite (:func:`best_restart`).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.compile_mode import to_device


def restart_keys(rng_key: jax.Array, num_restarts: int) -> jax.Array:
    """Keys of the restarts: ``rng_key`` itself, then ``fold_in(rng_key, c)``."""
    if num_restarts <= 8:
        return jnp.stack([rng_key] + [jax.random.fold_in(rng_key, c) for c in range(1, num_restarts)])
    return _many_keys(rng_key, jnp.arange(1, num_restarts))  # one compiled call for many data sets


@jax.jit
def _many_keys(rng_key: jax.Array, indices: jax.Array) -> jax.Array:
    folded = jax.vmap(lambda c: jax.random.fold_in(rng_key, c))(indices)
    return jnp.concatenate([rng_key[None], folded])


def folded_keys(rng_key: jax.Array, indices: Any) -> jax.Array:
    """``fold_in(rng_key, i)`` for every ``i`` in ``indices``, stacked, as one vectorised
    hash: the same keys as a loop of ``fold_in`` calls, with one copy of the hash in a
    compiled program instead of one per index."""
    return jax.vmap(lambda i: jax.random.fold_in(rng_key, i))(to_device(np.asarray(list(indices), np.uint32)))


def random_start(rng_key: jax.Array, qs: Mapping[str, Any], natural: Mapping[str, Any], keep: Any = ()) -> dict:
    """Re-centre each q at a draw from itself, keeping its spread.

    Families without ``random_restart`` (categorical responsibilities, which
    are random already, and chains) and the sites in ``keep`` are left as
    they are.
    """
    out = dict(natural)
    keys = folded_keys(rng_key, range(len(qs))) if qs else None
    for i, (v, q) in enumerate(qs.items()):
        if v in keep or not q.family.random_restart or q.family.start_at is None:
            continue
        draw = (q.family.restart_draw or q.family.sample)(keys[i], natural[v], ())
        out[v] = q.family.start_at(natural[v], draw)
    return out


def random_params(rng_key: jax.Array, transforms: Mapping[str, Any], params: Mapping[str, Any]) -> dict:
    """Point estimates moved by a standard normal step on their unconstrained space."""
    out = dict(params)
    keys = folded_keys(rng_key, range(len(params))) if params else None
    for i, (name, value) in enumerate(params.items()):
        transform = transforms.get(name)
        if transform is None:
            continue
        u = transform.inv(value)
        u = u + jax.random.normal(keys[i], jnp.shape(u), jnp.result_type(u))
        out[name] = transform(u)
    return out


def finite_state(state: Any, elbo: Any) -> bool:
    """Whether a run ended with finite natural parameters and a finite last ELBO (read on the host)."""
    natural_ok = all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(state.natural))
    return natural_ok and (len(elbo) == 0 or bool(np.isfinite(np.asarray(elbo)[-1])))


TIE = 1e-9
"""Final ELBOs within this, relative, are equal: which is highest is the rounding of the programs
that ran them (a batched fit's, a single one's), not the fits."""


def best_restart(states: Any, elbo: jax.Array, num_run: list[int]) -> tuple[int, list[bool]]:
    """The restart with the highest final ELBO among the finite ones (-1: none), and which are finite.

    Restarts that ended within ``TIE`` (relative) of the highest are tied, and the first of them
    is the best: a batched fit and a single one picked different restarts of a mixture that had
    converged to one optimum (1e-10 apart), a few steps and 1e-6 in a mean apart."""
    natural = jax.tree.map(np.asarray, states.natural)  # read once: no eager device ops per restart
    elbo = np.asarray(elbo)
    finite = []
    for c, n in enumerate(num_run):
        row = jax.tree.map(lambda a: a[c], natural)
        finite.append(all(bool(np.all(np.isfinite(x))) for x in jax.tree.leaves(row))
                      and (n == 0 or bool(np.isfinite(elbo[c, n - 1]))))
    if not any(finite):
        return -1, finite
    finals = np.asarray([elbo[c, n - 1] if ok else -np.inf for c, (n, ok) in enumerate(zip(num_run, finite))])
    best = float(np.max(finals))
    margin = TIE * max(1.0, abs(best))
    return int(np.flatnonzero(finals >= best - margin)[0]), finite


DEFAULT_RESTARTS = 4
"""Restarts by default for models with discrete latents (mixtures, HMMs)."""


def default_restarts(plan: Any) -> int:
    """``DEFAULT_RESTARTS`` where the posterior is typically multimodal (discrete latents), else 1."""
    multimodal = any(q.family.index_valued or q.family.kind == "bernoulli" for q in plan.qs.values())
    return DEFAULT_RESTARTS if multimodal and plan.subsample is None else 1


NOISY_SLACK = 1.0
"""Nats by which Monte Carlo restarts' final ELBOs may differ before they are several optima
(their ELBOs are estimates)."""
DETERMINISTIC_SLACK = 0.05
"""The same for deterministic restarts, whose final ELBOs are exact to ``tol``: the zoo's
``hmm_enum`` (key 3) ended its four restarts at -384.242, -384.456, -384.456 and -385.144, 0.9
nats apart, none at the -383.084 two other keys reached, and was returned without a flag under
the 1-nat slack of noisy fits."""


def disagreement(elbo: jax.Array, num_run: list[int], finite: list[bool], slack: float = NOISY_SLACK) -> tuple[str, ...]:
    """A flag when the finite restarts ended more than ``slack`` nats apart (several optima)."""
    elbo = np.asarray(elbo)  # read once on the host
    finals = [float(elbo[c, n - 1]) for c, (n, ok) in enumerate(zip(num_run, finite)) if ok]
    if len(finals) < 2 or max(finals) - min(finals) <= slack * (1.0 + 1e-6 * abs(max(finals))):
        return ()
    ends = ", ".join(f"{f:.6g}" for f in sorted(finals, reverse=True))
    return (
        f"restarts ended in different optima (final ELBOs {ends}): the posterior is multimodal or some runs "
        "had not converged; the best is reported; run longer or with more restarts (num_restarts=...) to be sure",
    )
