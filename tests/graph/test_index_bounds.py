"""Indices from the data outside the axis they index are a ModelError, not a silent clamp.

JAX clamps ``a[g]`` for ``g >= len(a)``: a model whose group codes run 1..G
fitted, silently, one in which the last group's effect is shared. Each bad
case below used to fit without a word; each good case must still fit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

import blrppl
from blrppl.graph import build_graph

Y = jnp.array([0.1, 0.2, 0.3, 2.0, 2.1])
GOOD = np.array([0, 1, 2, 2, -1])  # -1 is the last group, as in numpy
ONE_BASED = np.array([1, 2, 3, 3, 3])


def intercepts(g, y=None):
    a = numpyro.sample("a", dist.Normal(0, 1).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(a[g], 1.0), obs=y)


def crossed(g, h, y=None):
    a = numpyro.sample("a", dist.Normal(jnp.zeros((3, 2)), 1.0).to_event(2))
    numpyro.sample("y", dist.Normal(a[g, h], 1.0), obs=y)


@jax.jit
def _effect(a, g):
    return a[g]


def in_a_jitted_helper(g, y=None):
    a = numpyro.sample("a", dist.Normal(0, 1).expand([3]).to_event(1))
    mu = numpyro.deterministic("mu", _effect(a, g))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def scalar_index(i, y=None):
    a = numpyro.sample("a", dist.Normal(0, 1).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(a[i], 1.0), obs=y)


def clipped(g, y=None):
    a = numpyro.sample("a", dist.Normal(0, 1).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(jnp.take(a, g, mode="clip"), 1.0), obs=y)


def through_a_reshape(g, y=None):
    """An index computed by integer division: row g // 2, column g % 2 of the reshaped latent."""
    a = numpyro.sample("a", dist.Normal(0, 1).expand([6]).to_event(1))
    numpyro.sample("y", dist.Normal(a.reshape(3, 2)[g // 2, g % 2], 1.0), obs=y)


def indexed_in_scan(g, y=None):
    a = numpyro.sample("a", dist.Normal(0, 1).expand([3]).to_event(1))

    def step(carry, y_t):
        numpyro.sample("y", dist.Normal(carry + a[g].sum(), 1.0), obs=y_t)
        return carry, None

    scan(step, 0.0, y)


@pytest.mark.parametrize(
    "model, args, site",
    [
        (intercepts, (ONE_BASED,), "y"),
        (intercepts, (np.array([0, 1, 2, -4, 0]),), "y"),  # below -len(a)
        (crossed, (np.array([0, 1, 2, 2, 0]), np.array([0, 1, 2, 0, 1])), "y"),
        (in_a_jitted_helper, (ONE_BASED,), "mu"),
        (scalar_index, (jnp.asarray(3),), "y"),
        (indexed_in_scan, (ONE_BASED,), "y"),
        (through_a_reshape, (np.array([0, 1, 2, 5, 6]),), "y"),  # 6 // 2 = 3 on an axis of 3
    ],
)
def test_out_of_range_index_names_the_site(model, args, site):
    with pytest.raises(blrppl.ModelError, match=rf"site '{site}'.*out of range"):
        build_graph(model, args, {"y": Y if model is not scalar_index else Y[:1].sum()})


@pytest.mark.parametrize(
    "model, args",
    [
        (intercepts, (GOOD,)),
        (crossed, (np.array([0, 1, 2, 2, 0]), np.array([0, 1, 1, 0, 1]))),
        (in_a_jitted_helper, (GOOD,)),
        (clipped, (ONE_BASED,)),  # clamping asked for
        (through_a_reshape, (np.array([0, 1, 2, 5, 4]),)),
    ],
)
def test_indices_in_range_fit(model, args):
    result = blrppl.NonConjugateVI(model).run(jax.random.PRNGKey(0), 20, *args, y=Y, progress_bar=False)
    assert np.all(np.isfinite(result.posterior["a"].mean))


def test_new_data_out_of_range_on_a_second_call_and_in_a_batch():
    engine = blrppl.ConjugateBayes(intercepts)
    first = engine.run(jax.random.PRNGKey(0), 5, GOOD, y=Y, progress_bar=False)
    # The last group's effect: y's 3rd to 5th values (index -1 is group 2).
    np.testing.assert_allclose(first.posterior["a"].mean[2], (0.3 + 2.0 + 2.1) / 4)
    with pytest.raises(blrppl.ModelError, match="out of range"):
        engine.run(jax.random.PRNGKey(0), 5, ONE_BASED, y=Y, progress_bar=False)
    with pytest.raises(blrppl.ModelError, match="data set 1 of the batch.*out of range"):
        engine.run_batched(jax.random.PRNGKey(0), 5, np.stack([GOOD, ONE_BASED]), y=jnp.stack([Y, Y]))


def test_float_index_array_and_failing_model_code_are_model_errors():
    with pytest.raises(blrppl.ModelError, match=r"site 'a': after this site.*integer dtype"):
        build_graph(intercepts, (GOOD.astype(float),), {"y": Y})
    with pytest.raises(blrppl.ModelError, match="before its first site.*missing 1 required positional"):
        build_graph(crossed, (GOOD,), {"y": Y})


def group_predictor(g, x_group, y=None):
    """A gather of data by data (a group-level predictor read at each row's group)."""
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(2), 2.0).to_event(1))
    numpyro.sample("y", dist.Normal(beta[0] + beta[1] * x_group[g], 0.5), obs=y)


def test_a_data_gather_by_new_out_of_range_indices_is_not_replayed():
    """``x_group[g]`` (data by data) is replayed from the tape: a new g out of range must not be
    clamped there (the compiled planner replanned it and the fit used x_group[G - 1])."""
    x_group = jnp.asarray([0.5, -1.0, 2.0])
    engine = blrppl.ConjugateBayes(group_predictor)
    engine.run(jax.random.key(0), 5, GOOD, x_group, y=Y, progress_bar=False)
    with pytest.raises(blrppl.ModelError, match="out of range"):
        engine.run(jax.random.key(0), 5, ONE_BASED, x_group, y=Y, progress_bar=False)
    with pytest.raises(blrppl.ModelError, match="data set 1 of the batch.*out of (range|bounds)"):
        engine.run_batched(
            jax.random.key(0), 5, np.stack([GOOD, ONE_BASED]), x_group, y=jnp.stack([Y, Y]), shared=("x_group",)
        )
