"""The evidence lower bound of q: E_q[log p(x, y)] + H[q]."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp

from blrppl.families import entropy


def elbo(
    rng_key: jax.Array,
    qs: Mapping[str, Any],
    estimators: Sequence[Any],
    natural: Mapping[str, Any],
    params: Mapping[str, Any],
) -> jax.Array:
    """ELBO = Σ_f E_q[log f] + Σ_v H[q_v].

    Every factor is in the sum, priors included, so this equals
    E_q[log p(x, y)] + H[q] (for a Gaussian q on an unconstrained space the
    Jacobian sits in the variable's prior factor). Point estimates (EM) have
    no entropy: their constant delta-method entropy is left out, as in the
    usual EM bound (Khan & Rue, Sec. 5.2).
    """
    mean = {v: qs[v].family.mean_params(natural[v]) for v in natural}
    total = jnp.zeros((), jnp.result_type(float))
    for i, est in enumerate(estimators):
        value, _ = est.estimate(jax.random.fold_in(rng_key, i), mean, params)
        total = total + value
    for h in entropy_terms(qs, natural).values():
        total = total + jnp.sum(h)
    return total


def entropy_terms(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> dict:
    """H[q_v] for every variable, batch shaped (one entry per independent block)."""
    return {v: entropy(qs[v].family, lam) for v, lam in natural.items()}
