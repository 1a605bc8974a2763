"""Observed values are checked at trace time: shape, finiteness, support, naming the site.

Each bad case used to run silently wrong or fail inside JAX without naming a
site; each good case is a legitimate model that must still trace.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.contrib.control_flow import scan

import blrppl
from blrppl.graph import build_graph
from blrppl.graph.validate import describe_support

N = 50
Y = jnp.asarray(np.random.default_rng(0).normal(1.5, 0.8, N))
COUNTS = jnp.array([0.0, 3.0, 1.0, 2.0])
BITS = jnp.array([0.0, 1.0, 1.0, 0.0])
ZEROS = BITS != 1
TOTAL = jnp.full(2, 10.0)


def normal_plate(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", N):
        numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def normal_no_plate(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    tau = numpyro.sample("tau", dist.Gamma(1.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0 / jnp.sqrt(tau)), obs=y)


def latent_vector(y):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(w, 1.0).to_event(1), obs=y)


def poisson(y):
    rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def poisson_masked(y, mask):
    rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Poisson(rate).mask(mask), obs=y)


def bernoulli_obs_mask(y, mask):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(p), obs=y, obs_mask=mask)


def gamma(y):
    rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Gamma(2.0, rate), obs=y)


def bernoulli(y):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(p), obs=y)


def binomial(y, total_count):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Binomial(total_count, p), obs=y)


def categorical(y):
    probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones(3)))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Categorical(probs), obs=y)


def dirichlet_obs(y):
    conc = numpyro.sample("conc", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Dirichlet(conc * jnp.ones(3)), obs=y)


def mvn(y):
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 1.0).to_event(1))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(mu, jnp.eye(2)), obs=y)


def multinomial(y):
    probs = numpyro.sample("probs", dist.Dirichlet(jnp.ones(3)))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Multinomial(10, probs), obs=y)


def column_plate(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", 5, dim=-2):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def uniform_latent_bound(y):
    upper = numpyro.sample("upper", dist.Gamma(2.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Uniform(0.0, upper), obs=y)


def sample_shape(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y, sample_shape=(5,))


def subsampled(y, index_data=True):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0], subsample_size=4) as idx:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx] if index_data else y)


def factors(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.factor("total", -0.5 * jnp.sum((y - mu) ** 2))
    with numpyro.plate("N", y.shape[0]):
        numpyro.factor("each", -0.5 * (y - mu) ** 2)


def scan_normal(y):
    def step(prev, y_t):
        x = numpyro.sample("x", dist.Normal(prev, 1.0))
        numpyro.sample("y_t", dist.Normal(x, 1.0), obs=y_t)
        return x, None

    scan(step, 0.0, y)


def scan_poisson(y):
    def step(prev, y_t):
        x = numpyro.sample("x", dist.Normal(prev, 0.3))
        numpyro.sample("y_t", dist.Poisson(jnp.exp(x)), obs=y_t)
        return x, None

    scan(step, 0.0, y)


def scan_vector(y):
    def step(prev, y_t):
        x = numpyro.sample("x", dist.Normal(prev, 1.0).to_event(1))
        with numpyro.plate("d", 2):
            numpyro.sample("y_t", dist.Normal(x, 1.0), obs=y_t)
        return x, None

    scan(step, jnp.zeros(2), y)


def mixture(y):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(2)))
    locs = numpyro.sample("locs", dist.Normal(jnp.zeros(2), 5.0).to_event(1))
    with numpyro.plate("N", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(locs[z], 1.0), obs=y)


def conditioned(y):
    return handlers.condition(poisson, {"y": y})(jnp.zeros_like(y))


def with_nan(values, at):
    return jnp.asarray(values).at[at].set(jnp.nan)


# id, model, args, the site the message names first, other names and phrases it contains
BAD_CASES = [
    ("column-in-plate", normal_plate, (Y[:, None],), "y", ["(50, 50)", "50 times", "'N'"]),
    ("too-short-for-plate", normal_plate, (Y[:49],), "y", ["(49,)", "(50,)"]),
    ("extra-trailing-dim", normal_plate, (jnp.stack([Y, Y], 1),), "y", ["(50, 2)"]),
    ("scalar-broadcast-to-plate", normal_plate, (Y[0],), "y", ["50 times"]),
    ("latent-shape-clashes", latent_vector, (jnp.zeros(10),), "y", ["'w'", "(3,)", "(10,)"]),
    ("event-shape-wrong", mvn, (jnp.zeros((10, 3)),), "y", ["event shape (2,)"]),
    ("sample-shape-wrong", sample_shape, (jnp.zeros(4),), "y", ["sample_shape (5,)"]),
    ("subsampled-data-not-indexed", subsampled, (jnp.zeros(10), False), "y", ["(10,)", "(4,)"]),
    ("scan-step-shape", scan_normal, (jnp.zeros((4, 3)),), "y_t", ["(4, 3)"]),
    ("nan", normal_plate, (with_nan(Y, 3),), "y", ["NaN or infinite"]),
    ("nan-outside-the-mask", poisson_masked, (with_nan(COUNTS, 1), COUNTS != 0), "y", ["NaN"]),
    ("negative-count", poisson, (COUNTS.at[2].set(-1.0),), "y", ["Poisson", "-1.0"]),
    ("fractional-count", poisson, (COUNTS.at[2].set(1.5),), "y", ["non-negative integers"]),
    ("negative-gamma", gamma, (jnp.array([1.0, -1.0, 2.0]),), "y", ["positive", "-1.0"]),
    ("zero-gamma", gamma, (jnp.array([1.0, 0.0, 2.0]),), "y", ["positive"]),
    ("bernoulli-two", bernoulli, (BITS.at[0].set(2.0),), "y", ["0 or 1", "2.0"]),
    ("bernoulli-half", bernoulli, (BITS.at[1].set(0.5),), "y", ["0 or 1", "0.5"]),
    ("binomial-above-total", binomial, (jnp.array([3.0, 11.0]), TOTAL), "y", ["Binomial"]),
    ("categorical-out-of-range", categorical, (jnp.array([0, 3, 1]),), "y", ["from 0 to 2"]),
    ("off-simplex", dirichlet_obs, (jnp.array([[0.2, 0.3, 0.6]]),), "y", ["summing to 1"]),
    ("negative-count-in-scan", scan_poisson, (COUNTS.at[3].set(-2.0),), "y_t", ["-2.0"]),
    ("obs-mask-unmasked", bernoulli_obs_mask, (BITS.at[0].set(0.5), ZEROS), "y_observed", ["0.5"]),
    ("conditioned", conditioned, (COUNTS.at[1].set(-1.0),), "y", ["Poisson"]),
    ("multinomial-total", multinomial, (jnp.array([[3, 3, 5], [10, 0, 0]]),), "y", ["to 10"]),
    ("flat-data-in-dim-2-plate", column_plate, (jnp.zeros(5),), "y", ["(5, 5)", "5 times"]),
]

# id, model, args
GOOD_CASES = [
    ("plate", normal_plate, (Y,)),
    ("no-plate-vector-data", normal_no_plate, (Y,)),
    ("latent-vector-matches", latent_vector, (jnp.zeros(3),)),
    ("masked-nan", poisson_masked, (with_nan(COUNTS, 1), COUNTS != 3)),
    ("obs-mask-nan", bernoulli_obs_mask, (with_nan(BITS, 1), ZEROS)),
    ("masked-out-of-support", poisson_masked, (COUNTS.at[1].set(-1.0), COUNTS != 3)),
    ("integer-counts", poisson, (jnp.array([0, 3, 1]),)),
    ("boolean-bits", bernoulli, (BITS.astype(bool),)),
    ("binomial", binomial, (jnp.array([3.0, 9.0]), TOTAL)),
    ("categorical", categorical, (jnp.array([0, 2, 1]),)),
    ("dirichlet", dirichlet_obs, (jnp.array([[0.2, 0.3, 0.5]]),)),
    ("mvn", mvn, (jnp.zeros((10, 2)),)),
    ("support-bound-is-latent", uniform_latent_bound, (jnp.array([0.5, 3.0]),)),
    ("sample-shape", sample_shape, (jnp.zeros(5),)),
    ("subsampled-indexed", subsampled, (jnp.zeros(10),)),
    ("factor-sites", factors, (Y,)),
    ("scan", scan_normal, (jnp.arange(4.0),)),
    ("scan-counts", scan_poisson, (COUNTS,)),
    ("scan-vector", scan_vector, (jnp.ones((4, 2)),)),
    ("enumerated-mixture", mixture, (Y[:10],)),
    ("conditioned", conditioned, (COUNTS,)),
    ("multinomial", multinomial, (jnp.array([[3, 3, 4], [10, 0, 0]]),)),
    ("column-in-dim-2-plate", column_plate, (jnp.zeros((5, 1)),)),
]


@pytest.mark.parametrize(
    "model, args, site, phrases",
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_observations_raise_naming_the_site(model, args, site, phrases):
    with pytest.raises(blrppl.ModelError) as error:
        build_graph(model, args)
    message = str(error.value)
    assert message.startswith(f"site {site!r}: ") and message.endswith(".")
    problem, _, remedy = message.partition("; ")
    assert remedy, "the message says what to do"
    for phrase in phrases:
        assert phrase in message


@pytest.mark.parametrize(
    "model, args", [case[1:] for case in GOOD_CASES], ids=[case[0] for case in GOOD_CASES]
)
def test_legitimate_models_trace(model, args):
    graph = build_graph(model, args)
    assert graph.factors


def test_an_engine_refuses_a_silently_broadcast_observation_before_running(rng_key):
    """The issue's case: (50, 1) data in a plate of 50 gave an ELBO of -3036 instead of -67."""
    with pytest.raises(blrppl.ModelError, match="count every observation 50 times"):
        blrppl.VMP(normal_plate).run(rng_key, 5, Y[:, None], progress_bar=False)


def test_a_model_without_a_plate_means_the_same_as_one_with_it(rng_key):
    """Vector data against a scalar distribution is counted once per observation."""
    plated = blrppl.VMP(normal_plate).run(rng_key, 10, Y, progress_bar=False)
    unplated = blrppl.VMP(normal_no_plate).run(rng_key, 10, Y, progress_bar=False)
    np.testing.assert_allclose(unplated.elbo, plated.elbo, rtol=1e-12)


@pytest.mark.parametrize(
    "support, words",
    [
        (dist.Poisson(1.0).support, "non-negative integers"),
        (dist.Bernoulli(0.5).support, "0 or 1"),
        (dist.Gamma(1.0, 1.0).support, "positive values"),
        (dist.Beta(1.0, 1.0).support, "values in [0, 1]"),
        (dist.Uniform(0.0, 2.0).support, "values in (0, 2)"),
        (dist.Multinomial(10, jnp.full(3, 1 / 3)).support, "integer counts summing to 10"),
        (dist.Normal(0.0, 1.0).to_event(0).support, "finite values"),
        (dist.Exponential(1.0).expand([3]).to_event(1).support, "positive values"),
    ],
)
def test_support_descriptions(support, words):
    assert describe_support(support) == words


def binomial_with_counts(total, y=None):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("N", total.shape[0]):
        numpyro.sample("admit", dist.Binomial(total, logits=jnp.log(p) - jnp.log1p(-p)), obs=y)


def test_a_parameter_outside_its_constraint_names_the_site_not_numpyros_bare_valueerror():
    # numpyro's validation says "BinomialLogits distribution got invalid total_count parameter."
    # without a site; the graph's trace names the site, the parameter and a bad value.
    total = jnp.asarray([10.0, 12.5, 8.0])
    with pytest.raises(blrppl.ModelError, match=r"site 'admit': .*'total_count'.*1 of 3 values, e.g. 12.5 at index \(1,\)"):
        build_graph(binomial_with_counts, (total,), {"y": jnp.asarray([3.0, 4.0, 5.0])})
    build_graph(binomial_with_counts, (jnp.asarray([10.0, 12.0, 8.0]),), {"y": jnp.asarray([3.0, 4.0, 5.0])})
