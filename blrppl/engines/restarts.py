"""``num_restarts=C``: C fits from random starts in one vmapped run.

Restart 0 starts where a plain ``run`` starts (the prior pushed through the
graph, k-means++ responsibilities for categorical latents, the user's
``init``), with the same keys, so it *is* the plain run. Restarts 1..C-1 start
from random points: each q is re-centred at a draw from its starting q (its
spread kept), categorical latents get their own random responsibilities,
point estimates (EM) move by a standard normal step on their unconstrained
space, and sites the user fixed with ``init=`` keep that start. Chain
latents keep the default start. The C runs are one
``jax.vmap`` of the jit-compiled driver loop (:func:`blrppl.blr.driver.run_restarts`).

The result reports the restart with the highest final ELBO (``result.state``,
``result.elbo``, ``result.posterior``, ...) and keeps all of them in
``result.restarts``; ``result.to_arviz`` turns them into C chains, so that
r-hat above ~1.01 flags restarts that ended in different optima (several
modes, label switching, or runs that have not converged). A restart that
ends with a q or ELBO that is not finite (EM's mixture component collapsing
onto one point, say) is marked in ``result.restarts.finite``, is never the
best, and is left out of ``to_arviz``; only when every restart fails does
``run`` raise.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from blrppl.blr.driver import run_restarts
from blrppl.families import NORMAL
from blrppl.results import BLRResult, Restarts
from blrppl.symbolic.expectation import CHAIN, CHAIN_CATEGORICAL, GAUSSIAN

#: Kinds of q whose start is already random (key-dependent) or that keep the default start.
_KEEP = ("categorical", CHAIN, CHAIN_CATEGORICAL)


def restart_keys(rng_key: jax.Array, num_restarts: int) -> jax.Array:
    """Keys of the restarts: ``rng_key`` itself, then ``fold_in(rng_key, c)``."""
    keys = [rng_key] + [jax.random.fold_in(rng_key, c) for c in range(1, num_restarts)]
    return jnp.stack(keys)


def random_start(rng_key: jax.Array, plan: Any, natural: Mapping[str, Any], keep: Any = ()) -> dict:
    """Re-centre each q at a draw from itself, keeping its spread.

    Gaussian q (on any space) move their mean to the draw in q's own space;
    the other families go through ``init``'s by-value start (centred at the
    draw with the start's concentration). Categorical and chain latents and
    the sites in ``keep`` are left as they are.
    """
    from blrppl.engines.init import _user_start

    out = dict(natural)
    for i, (v, q) in enumerate(plan.qs.items()):
        if v in keep or q.kind in _KEEP:
            continue
        key = jax.random.fold_in(rng_key, i)
        draw = q.family.sample(key, natural[v], ())
        if q.kind == GAUSSIAN:
            lam = natural[v]
            if q.family is NORMAL:
                out[v] = lam._replace(x=-2.0 * lam.x_sq * draw)
            else:
                out[v] = lam._replace(x=-2.0 * jnp.einsum("...ij,...j->...i", lam.xxT, draw))
            continue
        out[v] = _user_start(q, natural[v], draw)
    return out


def random_params(rng_key: jax.Array, plan: Any, params: Mapping[str, Any]) -> dict:
    """Point estimates moved by a standard normal step on their unconstrained space."""
    out = dict(params)
    for i, (name, value) in enumerate(params.items()):
        transform = plan.param_transforms.get(name)
        if transform is None:
            continue
        u = transform.inv(value)
        u = u + jax.random.normal(jax.random.fold_in(rng_key, i), jnp.shape(u), jnp.result_type(u))
        out[name] = transform(u)
    return out


def run_with_restarts(
    engine: Any,
    plan: Any,
    rng_key: jax.Array,
    num_steps: int,
    num_restarts: int,
    *,
    init_state: Any = None,
    tol: Optional[float] = None,
    progress_bar: bool = True,
) -> BLRResult:
    """Fit ``num_restarts`` restarts of ``engine`` on ``plan`` (see the module docstring).

    ``init_state`` resumes all restarts: a stacked state with a leading axis
    of length ``num_restarts`` (``result.restarts.state``).
    """
    from blrppl.engines.base import _check_finite

    keys = restart_keys(rng_key, num_restarts)
    algorithm = engine.build(plan, rng_key)
    if init_state is None:
        starter = engine.build(plan, rng_key, random_start=True)
        starts = [algorithm.init(jax.random.split(keys[0])[0])]
        for c in range(1, num_restarts):
            init_key = jax.random.split(keys[c])[0]
            state = starter.init(init_key)
            if state.params:
                state = state._replace(params=random_params(jax.random.fold_in(init_key, 2), plan, state.params))
            starts.append(state)
        init_state = jax.tree.map(lambda *xs: jnp.stack(xs), *starts)
    else:
        steps = jnp.shape(init_state.step)
        if steps != (num_restarts,):
            raise ValueError(
                f"init_state must hold {num_restarts} stacked restarts (result.restarts.state) when "
                f"num_restarts={num_restarts}; got a state whose step has shape {steps}. Resume a "
                "single fit with num_restarts=1."
            )
    states, elbo, num_run = run_restarts(
        algorithm, keys, num_steps, init_state, tol=tol, progress_bar=progress_bar
    )
    num_run = [int(n) for n in num_run]
    finite = []
    for c in range(num_restarts):
        try:
            _check_finite(jax.tree.map(lambda a: a[c], states), elbo[c, : num_run[c]])
            finite.append(True)
        except FloatingPointError as error:
            finite.append(False)
            failure = error
    if not any(finite):
        raise FloatingPointError(f"every restart failed; the last one: {failure}") from None
    finals = jnp.asarray([elbo[c, n - 1] if ok else -jnp.inf for c, (n, ok) in enumerate(zip(num_run, finite))])
    best = int(jnp.argmax(finals))
    state = jax.tree.map(lambda a: a[best], states)
    restarts = Restarts(
        state=states, elbo=elbo, num_steps=jnp.asarray(num_run), best=best, finite=jnp.asarray(finite)
    )
    return BLRResult(plan=plan, state=state, elbo=elbo[best, : num_run[best]], mode=engine.mode, restarts=restarts)
