"""Oracles and random cases shared by the chain-family tests.

Dense brute force (STYLE.md ladder, rung 2): the dense inverse of the assembled
block-tridiagonal precision for chain Gaussians (dynamax ``joint_posterior_mvn``)
and K^T enumeration for discrete chains (dynamax ``big_log_joint``).

The random cases are jitted with static shapes, so each shape is compiled once
per session rather than dispatched op by op in every test that builds one.
"""

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from blrppl.families import chain_categorical as cc
from blrppl.families import chain_gaussian as cg
from tests.compiles import cheap_jit


@partial(cheap_jit, static_argnames=("num_steps", "dim", "batch"))
def random_chain(key, num_steps, dim, batch=()):
    """A random stable linear-Gaussian chain in natural parameters, (*batch, T, d)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    trans = (
        0.6 * jax.random.normal(k1, batch + (num_steps - 1, dim, dim)) / np.sqrt(dim)
    )
    noise = jax.random.normal(k2, batch + (num_steps - 1, dim, dim))
    noise = noise @ jnp.swapaxes(noise, -1, -2) / dim + 0.3 * jnp.eye(dim)
    return cg.from_usual(
        initial_mean=jax.random.normal(k3, batch + (dim,)),
        initial_covariance=2.0 * jnp.eye(dim),
        transition_matrices=trans,
        transition_offsets=jax.random.normal(k4, batch + (num_steps - 1, dim)),
        transition_covariances=noise,
    )


def dense_gaussian(natural):
    """(J, h) of one chain as dense (T d, T d) and (T d,) numpy arrays."""
    h = np.asarray(natural.x)
    j_diag = -np.asarray(natural.xx + np.swapaxes(natural.xx, -1, -2))
    j_off = -np.asarray(natural.x_next)
    num_steps, d = h.shape
    precision = np.zeros((num_steps * d, num_steps * d))
    for t in range(num_steps):
        precision[t * d : (t + 1) * d, t * d : (t + 1) * d] = j_diag[t]
    for t in range(num_steps - 1):
        precision[t * d : (t + 1) * d, (t + 1) * d : (t + 2) * d] = j_off[t]
        precision[(t + 1) * d : (t + 2) * d, t * d : (t + 1) * d] = j_off[t].T
    return precision, h.reshape(-1)


def dense_moments(natural):
    """Means (T, d), marginal and lag-one covariances, A and H by dense inversion."""
    precision, h = dense_gaussian(natural)
    num_steps, d = natural.x.shape
    cov = np.linalg.inv(precision)
    mean = cov @ h
    _, log_det = np.linalg.slogdet(precision)
    n = num_steps * d
    blocks = cov.reshape(num_steps, d, num_steps, d)
    idx = np.arange(num_steps)
    return {
        "mean": mean.reshape(num_steps, d),
        "cov": blocks[idx, :, idx, :],
        "cross": blocks[idx[:-1], :, idx[1:], :],
        "log_normalizer": 0.5 * h @ mean - 0.5 * log_det + 0.5 * n * np.log(2 * np.pi),
        "entropy": 0.5 * n * (1 + np.log(2 * np.pi)) - 0.5 * log_det,
        "dense": (mean, cov),
    }


@partial(cheap_jit, static_argnames=("num_steps", "num_categories", "batch"))
def random_potentials(key, num_steps, num_categories, batch=()):
    """Random unary and pairwise log potentials of a discrete chain, (*batch, T, K)."""
    k1, k2 = jax.random.split(key)
    return cc.ChainCategoricalStats(
        one_hot=jax.random.normal(k1, batch + (num_steps, num_categories)),
        pair=1.5
        * jax.random.normal(
            k2, batch + (num_steps - 1, num_categories, num_categories)
        ),
    )


def enumerate_chain(natural):
    """log q, A, marginals, pair marginals and H of one discrete chain, enumerated."""
    num_steps, k = natural.one_hot.shape
    paths = np.array(list(itertools.product(range(k), repeat=num_steps)))
    stats = cc.sufficient_stats(paths, k)
    log_joint = np.zeros(len(paths))
    # A -inf potential on an unused state contributes 0, not -inf * 0 = nan.
    for stat, lam in zip(stats, natural):
        stat, lam = np.asarray(stat), np.asarray(lam)
        terms = stat * np.where(stat > 0, lam, 0.0)
        log_joint = log_joint + np.sum(terms, axis=tuple(range(1, terms.ndim)))
    log_z = scipy.special.logsumexp(log_joint)
    probs = np.exp(log_joint - log_z)
    return {
        "paths": paths,
        "log_prob": log_joint - log_z,
        "log_normalizer": log_z,
        "marginals": np.einsum("n,ntk->tk", probs, stats.one_hot),
        "pair": np.einsum("n,ntij->tij", probs, stats.pair),
        "entropy": -np.sum(probs * np.where(probs > 0, log_joint - log_z, 0.0)),
    }


def take(tree, index):
    """Element ``index`` of the leading (batch) axis of every leaf."""
    return jax.tree.map(lambda a: a[index], tree)


def assert_trees_close(actual, expected, rtol, atol=0.0):
    """Leafwise ``assert_allclose`` of two pytrees with the same structure."""
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)
