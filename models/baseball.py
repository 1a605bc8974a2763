"""Batting averages without pooling (numpyro's examples/baseball.py, ``not_pooled``).

phi_i ~ Uniform(0, 1),   hits_i ~ Binomial(at_bats_i, phi_i),   i = 1..18 players

``Uniform(0, 1)`` is ``Beta(1, 1)``: phi gets a Beta q and every edge is
exact (``ConjugateBayes`` is the exact posterior). The other pooling
variants of the numpyro example are here too (``fully_pooled``,
``partially_pooled``, ``partially_pooled_with_logit``). The observed site is
``y`` (the zoo's convention; the numpyro example calls it ``obs``).
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

#: Efron & Morris (1975): hits in the first 45 at-bats of the 1970 season.
HITS = np.array([18, 17, 16, 15, 14, 14, 13, 12, 11, 11, 10, 10, 10, 10, 10, 9, 8, 7], dtype=float)


def model(at_bats, *, y=None):
    """One Uniform(0, 1) chance of a hit per player (no pooling)."""
    with numpyro.plate("num_players", at_bats.shape[0]):
        phi = numpyro.sample("phi", dist.Uniform(0, 1))
        return numpyro.sample("y", dist.Binomial(at_bats, probs=phi), obs=y)


def fully_pooled(at_bats, *, y=None):
    """One chance of a hit shared by every player."""
    phi = numpyro.sample("phi", dist.Uniform(0, 1))
    with numpyro.plate("num_players", at_bats.shape[0]):
        return numpyro.sample("y", dist.Binomial(at_bats, probs=phi), obs=y)


def partially_pooled(at_bats, *, y=None):
    """Players' chances drawn from a Beta with a Uniform mean and a Pareto concentration."""
    m = numpyro.sample("m", dist.Uniform(0, 1))
    kappa = numpyro.sample("kappa", dist.Pareto(1, 1.5))
    with numpyro.plate("num_players", at_bats.shape[0]):
        phi = numpyro.sample("phi", dist.Beta(m * kappa, (1 - m) * kappa))
        return numpyro.sample("y", dist.Binomial(at_bats, probs=phi), obs=y)


def partially_pooled_with_logit(at_bats, *, y=None):
    """Players' log-odds drawn from a Normal with a HalfCauchy scale."""
    loc = numpyro.sample("loc", dist.Normal(-1, 1))
    scale = numpyro.sample("scale", dist.HalfCauchy(1))
    with numpyro.plate("num_players", at_bats.shape[0]):
        alpha = numpyro.sample("alpha", dist.Normal(loc, scale))
        return numpyro.sample("y", dist.Binomial(at_bats, logits=alpha), obs=y)


def data():
    """The 18 players of Efron & Morris, 45 at-bats each."""
    return (jnp.full(18, 45),), {"y": jnp.asarray(HITS)}
