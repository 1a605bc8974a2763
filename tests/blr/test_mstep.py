"""EM's M-step (:mod:`blrppl.blr.mstep`): Newton's method on E_q[log p] over the point estimates."""

import jax
import numpy as np
from jax.extend.core import jaxprs_in_params

import blrppl
from blrppl.blr.mstep import build_m_step
from models import ZOO


def _calls(jaxpr, name: str) -> list:
    """The calls of the jitted function ``name`` in a jaxpr, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("pjit", "jit") and eqn.params.get("name") == name:
            found.append(eqn)
        for sub in jaxprs_in_params(eqn.params):
            found += _calls(sub, name)
    return found


def _largest_array(jaxpr) -> int:
    """The most elements of any value a jaxpr reads or makes, nested jaxprs included."""
    sizes = [int(np.prod(v.aval.shape)) for v in jaxpr.invars + jaxpr.constvars if hasattr(v.aval, "shape")]
    for eqn in jaxpr.eqns:
        sizes += [int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape")]
        sizes += [_largest_array(sub) for sub in jaxprs_in_params(eqn.params)]
    return max(sizes, default=0)


def _nile_m_step(rng_key):
    """The Nile's EM plan, its first state, its M-step and the M-step's jaxpr."""
    args, kwargs = ZOO["nile"].data()
    engine = blrppl.EM(ZOO["nile"].model)
    plan = engine.plan(*args, **kwargs)
    state = jax.jit(engine.build(plan).init)(rng_key, plan.arrays)
    m_step = build_m_step(plan)
    jaxpr = jax.make_jaxpr(lambda natural, params: m_step(rng_key, natural, params, plan.arrays))(
        state.natural, state.params
    )
    return kwargs, engine, plan, state, m_step, jaxpr


def test_the_m_step_writes_its_objective_once_per_use_and_maximises_it(rng_key):
    """The objective (a pass over the data) appears once for the start's value, once in the step
    halvings (the full Newton step is their loop's first try) and in the one program that gives
    the gradient and the Hessian: 4 calls, where a full step before the halvings, a separate
    gradient and ``jax.hessian`` made 7. The M-step still maximises: from the E-step's q, the
    objective's gradient at the new point estimates is zero."""
    kwargs, engine, plan, state, m_step, jaxpr = _nile_m_step(rng_key)
    assert len(_calls(jaxpr.jaxpr, "objective")) <= 4
    new, _ = jax.jit(lambda natural, params: m_step(rng_key, natural, params, plan.arrays))(state.natural, state.params)
    bound = jax.jit(lambda params: engine.build(plan, fixed_params=True).elbo(rng_key, state._replace(params=params), plan.arrays))
    moved = {name: value * 1.01 for name, value in new.items()}
    assert float(bound(new)) >= float(bound(moved)) and float(bound(new)) >= float(bound(state.params))
    assert all(np.isfinite(np.asarray(v)).all() for v in new.values())


def test_the_newton_iterations_read_expected_statistics_not_the_data(rng_key):
    """Each exact factor's expectation is contracted over q and the data once per M-step: the
    objective the Newton iterations evaluate holds nothing of the data's length (the Nile's 100
    years), and the values it hands the ELBO are each factor's exact E_q[log f] at the new
    point estimates."""
    kwargs, engine, plan, state, m_step, jaxpr = _nile_m_step(rng_key)
    length = np.shape(kwargs["y"])[0]
    objective = _calls(jaxpr.jaxpr, "objective")[0].params["jaxpr"].jaxpr
    assert 0 < _largest_array(objective) < length
    assert _largest_array(jaxpr.jaxpr) >= length  # the contraction itself reads the data
    new, values = jax.jit(lambda natural, params: m_step(rng_key, natural, params, plan.arrays))(
        state.natural, state.params
    )
    mean = blrppl.blr.elbo.mean_params(plan.qs, state.natural)
    touching = [e for e in plan.estimators if e.factor in values]
    assert touching
    for est in touching:
        exact = est.estimate(rng_key, mean, new, plan.arrays)[0]
        np.testing.assert_allclose(float(values[est.factor]), float(exact), rtol=1e-12)
