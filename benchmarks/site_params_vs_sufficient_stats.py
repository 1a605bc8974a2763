"""Issue 4: exact site parameters vs one pass over the data's sufficient statistics.

Normal with unknown mean and precision, N = 1,000,000. One evaluation of all
site parameters (both factors' expectations and their gradients) against one
jit-compiled pass computing sum(y) and sum(y**2), in the same run.
Target: at most 3x.

    python benchmarks/site_params_vs_sufficient_stats.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr import driver
from blrppl.blr.elbo import mean_params
from benchmarks._timing import best_time, table

N = 1_000_000


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def main() -> None:
    y = jnp.asarray(np.random.default_rng(0).normal(1.5, 0.8, N))
    engine = blrppl.VMP(model)
    plan = engine.plan(y)
    natural = driver.init(engine.build(plan), jax.random.key(0), plan.arrays).natural

    @jax.jit
    def all_site_params(natural, arrays):
        mean = mean_params(plan.qs, natural)
        return [est.estimate(None, mean, {}, arrays) for est in plan.estimators]

    @jax.jit
    def sufficient_statistics(y):
        return jnp.sum(y), jnp.sum(y**2)

    t_sites = best_time(lambda: all_site_params(natural, plan.arrays))
    t_stats = best_time(lambda: sufficient_statistics(y))
    print(table(
        [("all site parameters", f"{t_sites * 1e3:.3f} ms"), ("sum, sum of squares", f"{t_stats * 1e3:.3f} ms"),
         ("ratio (target <= 3)", f"{t_sites / t_stats:.3f}")],
        ("N = 1,000,000", "time"),
    ))


if __name__ == "__main__":
    main()
