"""The tied chain Categorical family: one pair potential for every step of a discrete chain.

Each member is the untied chain Categorical whose pair potentials are all equal
(:func:`~blrppl.families.tied_chain_categorical.expand`); its mean parameters are
the marginals and the pairwise marginals summed over time. Checked against the
untied family (itself checked against enumeration) and against enumeration.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from blrppl.errors import ModelError
from blrppl.families import chain_categorical as untied
from blrppl.families import tied_chain_categorical as tc
from tests.compiles import cheap_jit

moments = cheap_jit(tc.mean_and_log_normalizer)
untied_moments = cheap_jit(untied.mean_and_log_normalizer)
log_normalizer = cheap_jit(tc.log_normalizer)


def _member(seed, batch=(), length=30, k=3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tc.TiedChainStats(
        jnp.asarray(2.0 * rng.normal(size=batch + (length, k)), dtype), jnp.asarray(rng.normal(size=batch + (k, k)), dtype)
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_moments_are_the_untied_familys_summed_over_time(dtype):
    """μ = (marginals, Σ_t pairwise marginals) and A(λ) of the expanded member, for a batch of two
    chains; in float64 (probabilities, counts from one (K, T-1) x (T-1, K) product) and float32
    (log space)."""
    natural = _member(0, batch=(2,), dtype=dtype)
    mean, log_norm = moments(natural)
    reference, ref_norm = untied_moments(tc.expand(natural))
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(mean.one_hot, reference.one_hot, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(mean.transitions, reference.pair.sum(-3), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(log_norm, ref_norm, rtol=rtol)
    np.testing.assert_allclose(log_normalizer(natural), ref_norm, rtol=rtol)
    np.testing.assert_allclose(mean.transitions.sum((-2, -1)), 29.0, rtol=rtol)


def test_mean_is_the_gradient_of_the_log_normalizer_and_matches_enumeration():
    natural = _member(1, length=6, k=2)
    mean = moments(natural)[0]
    grad = cheap_jit(jax.grad(tc.log_normalizer))(natural)
    np.testing.assert_allclose(grad.one_hot, mean.one_hot, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grad.transitions, mean.transitions, rtol=1e-10, atol=1e-13)
    paths = np.array(list(itertools.product(range(2), repeat=6)))
    unary, pair = np.asarray(natural.one_hot), np.asarray(natural.transitions)
    log_w = unary[np.arange(6), paths].sum(1) + pair[paths[:, :-1], paths[:, 1:]].sum(1)
    np.testing.assert_allclose(log_normalizer(natural), logsumexp(log_w), rtol=1e-12)
    weights = np.exp(log_w - logsumexp(log_w))
    counts = np.zeros((2, 2))
    for t in range(5):
        np.add.at(counts, (paths[:, t], paths[:, t + 1]), weights)
    np.testing.assert_allclose(mean.transitions, counts, rtol=1e-10)
    stats = tc.sufficient_stats(jnp.asarray(paths), 2)
    np.testing.assert_allclose(np.einsum("n,nij->ij", weights, stats.transitions), counts, rtol=1e-10)


def test_values_draws_and_errors():
    """Draws and the numpyro distribution are the expanded member's; λ from μ has no closed form
    here and says so; a chain distribution with step-dependent pairs is not tied."""
    natural = _member(2, length=8)
    draws = cheap_jit(tc.sample, static_argnums=2)(jax.random.key(0), natural, (500,))
    assert draws.shape == (500, 8) and draws.dtype.kind == "i"
    d = tc.to_numpyro(natural)
    np.testing.assert_allclose(d.pair_marginals.sum(0), moments(natural)[0].transitions, rtol=1e-12)
    log_prob = cheap_jit(lambda n, z: tc.to_numpyro(n).log_prob(z))
    untied_log_prob = cheap_jit(lambda n, z: untied.to_numpyro(tc.expand(n)).log_prob(z))
    np.testing.assert_allclose(log_prob(natural, draws), untied_log_prob(natural, draws), rtol=1e-12)
    valid = cheap_jit(tc.is_valid)
    assert bool(valid(natural)) and not bool(valid(natural._replace(transitions=natural.transitions * jnp.nan)))
    back = tc.from_numpyro(d)
    np.testing.assert_allclose(back.transitions, natural.transitions)
    with pytest.raises(ModelError, match="no closed form"):
        tc.natural_params(moments(natural)[0])
    untied_member = tc.expand(natural)._replace(pair=tc.expand(natural).pair.at[3].add(1.0))
    with pytest.raises(ModelError, match="differ between steps"):
        tc.from_numpyro(untied.to_numpyro(untied_member))


def test_validity_needs_no_per_step_array():
    """``is_valid`` bounds A(λ) from (T, K) and (K, K) sums, and falls back to the forward pass
    (never an expansion to (T-1, K, K)) where a potential is infinite: a forbidden transition
    is valid, a NaN or +∞ one is not."""
    natural = _member(3, length=200)
    jaxpr = jax.make_jaxpr(tc.is_valid)(natural)
    assert "(199, 3, 3)" not in str(jaxpr).replace("f64[199,3,3]", "(199, 3, 3)")
    valid = cheap_jit(tc.is_valid)
    forbidden = natural._replace(transitions=natural.transitions.at[0, 2].set(-jnp.inf))
    assert bool(valid(natural)) and bool(valid(forbidden))
    assert not bool(valid(natural._replace(transitions=natural.transitions.at[1, 1].set(jnp.inf))))
    assert not bool(valid(natural._replace(one_hot=natural.one_hot.at[5, 0].set(jnp.nan))))
