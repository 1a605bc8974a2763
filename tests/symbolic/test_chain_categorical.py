"""Exact site parameters of factors that read a chain Categorical (HMM states).

Reads of one_hot(z_t) are the marginals; reads of one_hot(z_{t-1}) one_hot(z_t)
(``A[z_prev]`` gathered by the previous state, then evaluated at z_t) are the
``pair`` statistic, so a transition factor's expected log density is
sum_t sum_jk pair[t, j, k] E[log A_jk]. Mean parameters here are random
positive arrays: the expectation is linear in them, consistency is not needed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.symbolic import canonical as C
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value
from blrppl.symbolic.terms import NonConjugate
from ._helpers import dirichlet

T, K = 6, 3
CHAIN = VarInfo("chain_categorical", (T,), 0, K)  # one sequence: no batch axes
TRANS = VarInfo("dirichlet", (K, K), 1)


def site_parameters(log_factor, infos, mean):
    examples = {
        v: jnp.zeros(info.shape, jnp.int32) if info.kind == "chain_categorical" else jnp.full(info.shape, 1.0 / K)
        for v, info in infos.items()
    }
    terms = analyse(log_factor, examples, infos)
    mean = jax.tree.map(jnp.asarray, mean)
    return jax.value_and_grad(lambda m: expected_value(terms, m))(mean)


def chain_mean(rs):
    return {"one_hot": rs.uniform(0.1, 1.0, (T, K)), "pair": rs.uniform(0.1, 1.0, (T - 1, K, K))}


@pytest.mark.parametrize("spelling", ["slices", "reversed gathers"])
def test_transition_factor_reads_pairs(spelling):
    rs = np.random.RandomState(0)
    mean = {"z": chain_mean(rs), "A": dirichlet(rs, (K,), K)}
    elog = mean["A"]["log_x"]
    prev = np.arange(T - 1)[::-1]

    def log_factor(v):
        if spelling == "slices":
            return jnp.sum(C._categorical_probs(v["z"][1:], v["A"][v["z"][:-1]]))
        return jnp.sum(C._categorical_probs(v["z"][prev + 1], v["A"][v["z"][prev]]))

    value, grads = site_parameters(log_factor, {"z": CHAIN, "A": TRANS}, mean)
    np.testing.assert_allclose(value, np.einsum("tjk,jk->", mean["z"]["pair"], elog), rtol=1e-12)
    np.testing.assert_allclose(grads["z"]["pair"], np.broadcast_to(elog, (T - 1, K, K)), rtol=1e-12)
    np.testing.assert_allclose(grads["z"]["one_hot"], 0.0, atol=1e-14)
    np.testing.assert_allclose(grads["A"]["log_x"], mean["z"]["pair"].sum(0), rtol=1e-12)


def test_a_constant_first_state_is_a_unary_term():
    """prev = [0, z_0, ..., z_{T-2}]: the first transition leaves the known state 0."""
    rs = np.random.RandomState(1)
    mean = {"z": chain_mean(rs), "A": dirichlet(rs, (K,), K)}
    elog = mean["A"]["log_x"]

    def log_factor(v):
        prev = jnp.concatenate([jnp.zeros(1, jnp.int32), v["z"][:-1]])
        return jnp.sum(C._categorical_probs(v["z"], v["A"][prev]))

    value, grads = site_parameters(log_factor, {"z": CHAIN, "A": TRANS}, mean)
    one_hot = np.zeros((T, K))
    one_hot[0] = elog[0]
    expected = mean["z"]["one_hot"][0] @ elog[0] + np.einsum("tjk,jk->", mean["z"]["pair"], elog)
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    np.testing.assert_allclose(grads["z"]["one_hot"], one_hot, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads["z"]["pair"], np.broadcast_to(elog, (T - 1, K, K)), rtol=1e-12)


def test_emissions_read_marginals():
    rs = np.random.RandomState(2)
    y, mu = rs.randn(T), rs.randn(K)
    mean = {"z": chain_mean(rs)}

    def log_factor(v):
        return jnp.sum(C._normal(y, jnp.asarray(mu)[v["z"]], 0.7))

    value, grads = site_parameters(log_factor, {"z": CHAIN}, mean)
    emission = -0.5 * np.log(2 * np.pi) - np.log(0.7) - 0.5 * (y[:, None] - mu) ** 2 / 0.49
    np.testing.assert_allclose(value, np.sum(mean["z"]["one_hot"] * emission), rtol=1e-12)
    np.testing.assert_allclose(grads["z"]["one_hot"], emission, rtol=1e-12)
    np.testing.assert_allclose(grads["z"]["pair"], 0.0, atol=1e-14)


def test_states_two_steps_apart_are_not_conjugate():
    rs = np.random.RandomState(3)
    mean = {"z": chain_mean(rs), "A": dirichlet(rs, (K,), K)}

    def log_factor(v):
        return jnp.sum(C._categorical_probs(v["z"][2:], v["A"][v["z"][:-2]]))

    with pytest.raises(NonConjugate, match="two or more steps apart"):
        site_parameters(log_factor, {"z": CHAIN, "A": TRANS}, mean)


def test_one_output_per_step_is_stacked_and_equals_the_vectorised_factor():
    """A loop's factor, analysed site by site (a tuple of outputs): the same expectation and site
    parameters as the scan form, from one stacked term per kind instead of one per step."""
    rs = np.random.RandomState(3)
    y, mu = rs.randn(T), rs.randn(K)
    mean = {"z": chain_mean(rs), "A": dirichlet(rs, (K,), K)}

    def per_step(v):
        steps = [C._categorical_probs(v["z"][t], v["A"][v["z"][t - 1]]) for t in range(1, T)]
        emissions = [-0.5 * (y[t] - jnp.asarray(mu)[v["z"][t]]) ** 2 for t in range(T)]
        return tuple(steps) + tuple(emissions)

    def vectorised(v):
        steps = jnp.sum(C._categorical_probs(v["z"][1:], v["A"][v["z"][:-1]]))
        return steps + jnp.sum(-0.5 * (y - jnp.asarray(mu)[v["z"]]) ** 2)

    infos = {"z": CHAIN, "A": TRANS}
    examples = {"z": jnp.zeros((T,), jnp.int32), "A": jnp.full((K, K), 1.0 / K)}
    stacked = analyse(per_step, examples, infos)
    assert len(stacked.terms) == len(analyse(vectorised, examples, infos).terms)  # not one per step
    value, grads = site_parameters(per_step, infos, mean)
    expected_value_, expected_grads = site_parameters(vectorised, infos, mean)
    np.testing.assert_allclose(value, expected_value_, rtol=1e-12)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14), grads, expected_grads)
