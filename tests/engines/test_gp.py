"""numpyro's Gaussian process example (``models/gp.py``) under the default engine.

The hyperparameters (kernel variance, noise, length scale) get one joint
Gaussian q on their log scale and a deterministic degree-5 cubature of the
marginal likelihood, evaluated node by node (``lax.map``: never a batched
LAPACK call, which jaxlib 0.10 can deadlock on). Reference: NUTS on the same
data (N = 100, 1000 warm-up + 1000 draws, float64, seed 0).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import blrppl
from blrppl.blr import watchdog
from blrppl.graph.jaxpr import lapack_primitives
from models import gp

#: NUTS posterior mean and sd at N = 100 (numpyro's MCMC(NUTS(model), 1000, 1000), float64).
NUTS_N100 = {
    "kernel_var": (1.9807, 2.7578),
    "kernel_noise": (0.0442, 0.0068),
    "kernel_length": (0.4866, 0.0823),
}


@pytest.fixture(scope="module")
def fit():
    args, kwargs = gp.data(100)
    engine = blrppl.NonConjugateVI(gp.model)
    return engine.run(jax.random.key(0), 100, *args, progress_bar=False, tol=1e-6, **kwargs)


def test_gp_hyperparameters_match_nuts(fit):
    assert fit.converged
    # The log-normal hyperpriors are exact on the log scale (tests/symbolic/test_exp.py).
    assert fit.estimators == {"kernel_var": "exact", "kernel_noise": "exact", "kernel_length": "exact", "y": "cubature"}
    for site, (mean, sd) in NUTS_N100.items():
        q = fit.posterior[site]
        assert abs(float(q.mean) - mean) < 0.2 * sd, site
    for site in ("kernel_noise", "kernel_length"):  # the variance's posterior is heavy-tailed: sd not compared
        assert abs(float(jnp.sqrt(fit.posterior[site].variance)) / NUTS_N100[site][1] - 1.0) < 0.15, site


def test_gp_factor_is_evaluated_node_by_node(fit):
    (y,) = [e for e in fit.plan.estimators if e.factor == "y"]
    assert y.sequential
    assert not any(e.sequential for e in fit.plan.estimators if e.factor != "y")

    def factor(k):
        return jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(k))))

    assert lapack_primitives(jax.make_jaxpr(factor)(jnp.eye(3))) == {"cholesky"}
    assert not lapack_primitives(jax.make_jaxpr(jnp.sum)(jnp.eye(3)))


class _NeverReady:
    """A dispatched result that never becomes ready (a deadlocked computation)."""

    def is_ready(self):
        return False


def test_a_stalled_computation_is_an_error_not_a_hang(monkeypatch):
    """The driver waits through the watchdog: no progress (no CPU used) for
    ``BLRPPL_STALL_SECONDS`` raises ``RuntimeDeadlock`` naming the workaround,
    and schedules the process's exit (a deadlocked runtime cannot shut down)."""
    exits = []
    monkeypatch.setenv("BLRPPL_STALL_SECONDS", "0.5")
    monkeypatch.setattr(watchdog.atexit, "register", exits.append)
    with pytest.raises(blrppl.RuntimeDeadlock, match="PJRT_NPROC=1"):
        watchdog.block_until_ready([jnp.zeros(2), _NeverReady()])
    assert exits == [watchdog._exit_now]
    monkeypatch.setenv("BLRPPL_STALL_SECONDS", "0")  # off: a ready result passes straight through
    assert watchdog.block_until_ready(jnp.ones(())) == 1.0
