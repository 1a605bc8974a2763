"""The steady-climb flag: an unfinished run whose ELBO still rises at an undiminished rate."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr.checks import steady_climb


def test_a_linear_climb_is_flagged_and_a_geometric_convergence_is_not():
    steps = np.arange(200.0)
    assert "still rising steadily" in steady_climb(-500.0 + 0.4 * steps, stopped=False)[0]
    assert steady_climb(-500.0 + 40.0 * (1.0 - 0.9**steps), stopped=False) == ()


def test_stopped_short_and_noisy_runs_are_not_flagged():
    steps = np.arange(200.0)
    assert steady_climb(-500.0 + 0.4 * steps, stopped=True) == ()
    assert steady_climb(-500.0 + 0.4 * steps[:30], stopped=False) == ()
    noisy = -500.0 + np.random.default_rng(0).normal(0.0, 1.0, 200)
    assert steady_climb(noisy, stopped=False) == ()
    assert steady_climb(-500.0 + 1e-4 * steps, stopped=False) == ()  # under a nat: a plateau


def test_a_converged_fit_carries_no_flag(rng_key):
    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = jax.random.normal(jax.random.key(1), (20,)) + 1.0
    result = blrppl.VMP(model).run(rng_key, 50, y=y, progress_bar=False)
    assert result.flags == () and jnp.isfinite(result.elbo[-1])
