"""Conjugate Bayes: the exact posterior in one step of the Bayesian learning rule.

For a model whose posterior lies in q's exponential family, one BLR step with
rho = 1 is exact Bayes (Khan & Rue, Sec. 5.1): lambda = sum of the factors'
site parameters. ``ConjugateBayes`` checks that the model qualifies (every
factor touches one q block) and its ELBO is then the log evidence log p(y).
This script fits two zoo models and checks both facts against closed forms.

    python examples/conjugate_bayes.py [--steps N]
"""

from __future__ import annotations

import argparse
import math

import jax
import numpy as np
from scipy.special import betaln, gammaln

import blrppl
from blrppl.cli import load_zoo


def main(steps: int = 1) -> None:
    zoo = load_zoo()  # the repository's models/ package

    # Beta-Bernoulli: q(p) = Beta(1 + heads, 1 + tails), log p(y) = log B(1 + h, 1 + t) - log B(1, 1).
    entry = zoo["beta_bernoulli"]
    args, kwargs = entry.data()
    result = blrppl.ConjugateBayes(entry.model).run(jax.random.key(0), steps, *args, progress_bar=False, **kwargs)
    y = np.asarray(kwargs["y"])
    heads, tails = y.sum(), y.size - y.sum()
    q = result.posterior["p"]
    print(f"beta_bernoulli: q(p) = Beta({float(q.concentration1):.1f}, {float(q.concentration0):.1f}); "
          f"closed form Beta({1 + heads:.1f}, {1 + tails:.1f})")
    log_evidence = betaln(1 + heads, 1 + tails) - betaln(1, 1)
    print(f"  ELBO {float(result.elbo[-1]):.6f} = log evidence {log_evidence:.6f}")
    assert math.isclose(float(result.elbo[-1]), log_evidence, rel_tol=1e-5)

    # Gamma-Poisson: q(lam) = Gamma(2 + sum y, 1 + N).
    entry = zoo["gamma_poisson"]
    args, kwargs = entry.data()
    result = blrppl.ConjugateBayes(entry.model).run(jax.random.key(0), steps, *args, progress_bar=False, **kwargs)
    y = np.asarray(kwargs["y"])
    q = result.posterior["lam"]
    print(f"gamma_poisson: q(lam) = Gamma({float(q.concentration):.1f}, {float(q.rate):.1f}); "
          f"closed form Gamma({2 + y.sum():.1f}, {1 + y.size:.1f})")
    a, b = 2.0 + y.sum(), 1.0 + y.size
    log_evidence = 2.0 * math.log(1.0) - gammaln(2.0) + gammaln(a) - a * math.log(b) - gammaln(y + 1).sum()
    print(f"  ELBO {float(result.elbo[-1]):.6f} = log evidence {log_evidence:.6f}")
    assert math.isclose(float(result.elbo[-1]), log_evidence, rel_tol=1e-5)

    # An exact q has constant importance ratios p(x, y) / q(x) = p(y): Pareto k is -inf
    # (or well below 0.5 in float32, where rounding makes the ratios wiggle).
    print(f"  {result.pareto_k(jax.random.key(1))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1, help="BLR steps (one is exact; more are no-ops)")
    main(parser.parse_args().steps)
