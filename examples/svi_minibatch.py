"""Stochastic VI on minibatches: Bayesian linear regression on 20,000 rows.

Minibatches come from an ordinary ``numpyro.plate(..., subsample_size=M)``.
``SVI`` is the Bayesian learning rule on minibatches (Khan & Rue, Sec. 5.3):
in ``mode="global"`` (Hoffman et al. 2013) the global q takes a step of size
rho_t towards the minibatch's site parameters rescaled by N / M; in
``mode="local"`` (Eq. 60, incremental) each observation keeps its latest
site parameter, so one pass with rho = 1 already sees every row once. Both
approach the full-data VMP fit, which this script computes for comparison.

    python examples/svi_minibatch.py [--steps N]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.blr.schedules import robbins_monro

NUM_ROWS, BATCH = 20_000, 500


def regression(X, batch_size=None, *, y=None):
    """The zoo's linear regression, with a subsampled data plate."""
    num_rows, num_features = X.shape
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", num_rows, subsample_size=batch_size) as idx:
        loc = alpha + X[idx] @ beta
        numpyro.sample("y", dist.Normal(loc, 1.0 / jnp.sqrt(tau)), obs=None if y is None else y[idx])


def main(steps: int = 200) -> None:
    rng = np.random.default_rng(3)
    X = jnp.asarray(rng.normal(size=(NUM_ROWS, 3)))
    y = jnp.asarray(1.0 + X @ np.array([0.5, -1.0, 2.0]) + 0.5 * rng.normal(size=NUM_ROWS))

    full = blrppl.VMP(regression).run(jax.random.key(0), 50, X, y=y, progress_bar=False, tol=1e-8)
    print(f"VMP on all {NUM_ROWS} rows ({len(full.elbo)} steps):")
    print(f"  E[beta] {np.round(np.asarray(full.posterior['beta'].mean), 4)}, E[tau] {float(full.posterior['tau'].mean):.4f}")

    epochs = steps * BATCH / NUM_ROWS
    for mode, rate in (("global", robbins_monro(1.0, 0.7)), ("local", 1.0)):
        result = blrppl.SVI(regression, mode=mode, learning_rate=rate).run(
            jax.random.key(0), steps, X, BATCH, y=y, progress_bar=False
        )
        beta, tau = np.asarray(result.posterior["beta"].mean), float(result.posterior["tau"].mean)
        error = np.max(np.abs(beta - np.asarray(full.posterior["beta"].mean)))
        print(f"SVI mode={mode!r}, {steps} minibatches of {BATCH} ({epochs:.2g} epochs):")
        print(f"  E[beta] {np.round(beta, 4)}, E[tau] {tau:.4f}; largest error in E[beta] {error:.2g}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    main(parser.parse_args().steps)
