"""Quickstart: fit an ordinary NumPyro model with blrppl and inspect the posterior.

Normal data with unknown mean and precision. VMP (the Bayesian learning rule
with rho = 1, coordinate-wise) converges in a handful of exact steps; the
ELBO it reports is exact, and the posterior is a dict of numpyro
distributions.

    python examples/quickstart.py [--steps N]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

import blrppl


def model(y=None, num_obs=50):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", num_obs if y is None else y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def main(steps: int = 100) -> None:
    y = 1.5 + 0.8 * jax.random.normal(jax.random.key(1), (50,))

    # The factor graph blrppl sees, with each edge's conjugacy verdict.
    graph = blrppl.trace(model, y=y)
    for name, factor in graph.factors.items():
        verdicts = {v: e.conjugate for v, e in factor.edges.items()}
        print(f"factor {name!r}: neighbours {factor.neighbours}, conjugate {verdicts}")

    result = blrppl.VMP(model).run(jax.random.key(0), steps, y=y, tol=1e-6, progress_bar=False)
    mu, tau = result.posterior["mu"], result.posterior["tau"]
    print(f"converged in {len(result.elbo)} steps, ELBO {float(result.elbo[-1]):.4f}")
    print(f"mu  ~ Normal(mean {float(mu.mean):.4f}, sd {float(mu.variance) ** 0.5:.4f})")
    print(f"tau ~ Gamma(mean {float(tau.mean):.4f}, sd {float(tau.variance) ** 0.5:.4f})")

    # Posterior predictive draws through NumPyro's own Predictive.
    predictive = numpyro.infer.Predictive(model, guide=blrppl.VMP(model).guide(result), num_samples=500)
    draws = predictive(jax.random.key(2), num_obs=50)["y"]
    print(f"posterior predictive mean {float(draws.mean()):.4f} (data mean {float(y.mean()):.4f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    main(parser.parse_args().steps)
