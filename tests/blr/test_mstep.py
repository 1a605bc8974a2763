"""EM's M-step (:mod:`blrppl.blr.mstep`): Newton's method on E_q[log p] over the point estimates."""

import jax
import numpy as np
from jax.extend.core import jaxprs_in_params

import blrppl
from blrppl.blr.mstep import build_m_step
from models import ZOO


def _calls(jaxpr, name: str) -> int:
    """The calls of the jitted function ``name`` in a jaxpr, nested ones included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name in ("pjit", "jit") and eqn.params.get("name") == name
        for sub in jaxprs_in_params(eqn.params):
            count += _calls(sub, name)
    return count


def test_the_m_step_writes_its_objective_once_per_use_and_maximises_it(rng_key):
    """The objective (a pass over the data) appears once for the start's value, once in the step
    halvings (the full Newton step is their loop's first try) and in the one program that gives
    the gradient and the Hessian: 4 calls, where a full step before the halvings, a separate
    gradient and ``jax.hessian`` made 7. The M-step still maximises: from the E-step's q, the
    objective's gradient at the new point estimates is zero."""
    args, kwargs = ZOO["nile"].data()
    engine = blrppl.EM(ZOO["nile"].model)
    plan = engine.plan(*args, **kwargs)
    state = jax.jit(engine.build(plan).init)(rng_key, plan.arrays)
    m_step = build_m_step(plan)
    jaxpr = jax.make_jaxpr(lambda natural, params: m_step(rng_key, natural, params, plan.arrays))(
        state.natural, state.params
    )
    assert _calls(jaxpr.jaxpr, "objective") <= 4
    new = jax.jit(lambda natural, params: m_step(rng_key, natural, params, plan.arrays))(state.natural, state.params)
    bound = jax.jit(lambda params: engine.build(plan, fixed_params=True).elbo(rng_key, state._replace(params=params), plan.arrays))
    moved = {name: value * 1.01 for name, value in new.items()}
    assert float(bound(new)) >= float(bound(moved)) and float(bound(new)) >= float(bound(state.params))
    assert all(np.isfinite(np.asarray(v)).all() for v in new.values())
