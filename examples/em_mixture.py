"""EM for a Gaussian mixture: exact q for the assignments, point estimates for the rest.

EM is the Bayesian learning rule with the delta method on the parameters
(Khan & Rue, Sec. 5.2): the E-step is the exact q(z) (rho = 1), the M-step
moves the ``numpyro.param`` sites to the maximum of E_q[log p]. The ELBO is
the usual EM lower bound; it never decreases and equals the log likelihood
at convergence. Random restarts (``num_restarts``) run in one vmapped fit.

    python examples/em_mixture.py [--steps N]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

import blrppl
from blrppl.cli import load_zoo


def gmm(y, num_components=3):
    """A mixture of Normals with maximum-likelihood weights, locations and scales."""
    weights = numpyro.param("weights", jnp.ones(num_components) / num_components, constraint=constraints.simplex)
    locs = numpyro.param("locs", jnp.linspace(jnp.min(y), jnp.max(y), num_components))
    scales = numpyro.param("scales", jnp.full(num_components, jnp.std(y)), constraint=constraints.positive)
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(weights))
        numpyro.sample("y", dist.Normal(locs[z], scales[z]), obs=y)


def log_likelihood(y, weights, locs, scales):
    """The mixture's log likelihood in plain numpy, to check the EM bound against."""
    y = np.asarray(y)[:, None]
    density = weights * np.exp(-0.5 * ((y - locs) / scales) ** 2) / (scales * np.sqrt(2 * np.pi))
    return float(np.log(density.sum(1)).sum())


def main(steps: int = 200) -> None:
    y = load_zoo()["gaussian_mixture"].data()[1]["y"]  # 90 points from three clusters
    result = blrppl.EM(gmm).run(jax.random.key(0), steps, y, progress_bar=False, tol=1e-5, num_restarts=4)
    params = {k: np.asarray(v) for k, v in result.params.items()}
    order = np.argsort(params["locs"])
    print(f"EM stopped after {len(result.elbo)} steps (best of {result.num_restarts} restarts)")
    for name in ("weights", "locs", "scales"):
        print(f"  {name:8s} {np.round(params[name][order], 3)}")
    elbo = np.asarray(result.elbo)
    print(f"  EM bound never decreases: {bool(np.all(np.diff(elbo) >= -1e-4 * np.abs(elbo[1:])))}")
    print(f"  final bound {elbo[-1]:.4f}, log likelihood {log_likelihood(y, **params):.4f}")
    for c in range(result.num_restarts):
        fit = result.restart(c)
        status = "finite" if bool(result.restarts.finite[c]) else "diverged (a component collapsed onto one point)"
        print(f"  restart {c}: {len(fit.elbo)} steps, final bound {float(fit.elbo[-1]):.4f}, {status}")
    # Posterior responsibilities of the first five points, from the exact q(z).
    print("  responsibilities of y[:5]:")
    print(np.round(np.asarray(result.posterior["z"].probs)[:5][:, order], 3))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    main(parser.parse_args().steps)
