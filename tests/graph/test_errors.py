"""Every tracing error is a ModelError that names the site."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

import blrppl
from blrppl.graph import build_graph


def _normal_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y_obs", dist.Normal(mu, 1.0), obs=y)


def _check(error, site):
    assert isinstance(error.value, ValueError)
    message = str(error.value)
    assert message.startswith(f"site {site!r}: ")
    assert message.endswith(".")


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_non_finite_observations(bad):
    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(_normal_model, jnp.array([0.0, bad, 1.0]))
    _check(error, "y_obs")
    assert "NaN or infinite" in str(error.value)


def test_non_finite_observations_in_a_vector_event():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 1.0).to_event(1))
        numpyro.sample("obs", dist.MultivariateNormal(mu, jnp.eye(2)), obs=y)

    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(model, jnp.array([[0.0, 1.0], [jnp.nan, 0.0]]))
    _check(error, "obs")


def test_non_finite_observations_inside_a_scan():
    def model(y):
        def step(prev, y_t):
            x = numpyro.sample("x", dist.Normal(prev, 1.0))
            numpyro.sample("y_t", dist.Normal(x, 1.0), obs=y_t)
            return x, None

        scan(step, 0.0, y)

    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(model, jnp.array([0.0, jnp.nan, 1.0]))
    _check(error, "y_t")


def test_shape_that_depends_on_a_latent_value():
    def model():
        numpyro.sample("scale", dist.HalfNormal(1.0))
        k = numpyro.sample("k", dist.Categorical(jnp.ones(3) / 3))
        numpyro.sample("x", dist.Normal(jnp.zeros(k + 1), 1.0).to_event(1))

    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(model)
    _check(error, "k")


def test_python_control_flow_on_a_latent_value():
    def model():
        numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0))
        if jnp.sum(b) > 0:
            numpyro.sample("c", dist.Normal(0.0, 1.0))

    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(model)
    _check(error, "b")


def test_latent_discrete_site_with_infinite_support():
    def model():
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        numpyro.sample("count", dist.Poisson(rate))

    with pytest.raises(blrppl.ModelError) as error:
        blrppl.trace(model)
    _check(error, "count")
    assert "infinite support" in str(error.value)


@pytest.mark.parametrize(
    "families, site",
    [
        ({"mu": "Gamma"}, "mu"),  # real support, positive family
        ({"mu": "Categorical"}, "mu"),  # continuous site, discrete family
        ({"mu": "ChainGaussian"}, "mu"),  # not a chain
        ({"mu": "Student"}, "mu"),  # unknown family
        ({"nope": "Normal"}, "nope"),  # not a latent site
        ({"y_obs": "Normal"}, "y_obs"),  # observed, not latent
    ],
)
def test_family_override_that_does_not_fit(families, site):
    with pytest.raises(blrppl.ModelError) as error:
        build_graph(_normal_model, (jnp.zeros(3),), families=families)
    _check(error, site)


def test_family_override_on_a_discrete_site():
    def categorical():
        numpyro.sample("z", dist.Categorical(jnp.ones(3) / 3))

    def poisson():
        numpyro.sample("n", dist.Poisson(2.0))

    for model, families, site in [
        (categorical, {"z": "Normal"}, "z"),
        (categorical, {"z": "Bernoulli"}, "z"),
        (poisson, {"n": "Categorical"}, "n"),
    ]:
        with pytest.raises(blrppl.ModelError) as error:
            build_graph(model, families=families)
        _check(error, site)


def test_family_override_on_a_chain_initial_state():
    def model(y):
        x0 = numpyro.sample("x0", dist.Normal(0.0, 1.0))

        def step(prev, y_t):
            x = numpyro.sample("x", dist.Normal(prev, 1.0))
            numpyro.sample("y", dist.Normal(x, 1.0), obs=y_t)
            return x, None

        scan(step, x0, y)

    with pytest.raises(blrppl.ModelError) as error:
        build_graph(model, (jnp.zeros(3),), families={"x0": "Normal"})
    _check(error, "x0")
    assert "'x'" in str(error.value)


def numpy_indexed_by_plate(X, y=None, batch=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=batch) as idx:
        numpyro.sample("y", dist.Poisson(jnp.exp(X[idx] @ beta)), obs=y[idx])


@pytest.mark.parametrize("engine, batch", [("NonConjugateVI", None), ("SVI", 10)])
def test_numpy_data_indexed_by_traced_plate_indices_is_a_model_error(engine, batch):
    """X[idx] with a numpy X fails where the model is traced (NumPyro's NUTS fails the same way):
    a ModelError naming the site whose statement fails, not JAX's traceback."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = rng.poisson(1.0, size=40).astype(float)
    options = {"estimator": "auto"} if engine == "SVI" else {}
    make = getattr(blrppl, engine)(numpy_indexed_by_plate, **options)
    with pytest.raises(blrppl.ModelError, match=r"site 'y': .*concrete value.*jnp.asarray\(X\)"):
        make.plan(X, y, batch) if batch else make.plan(X, y)
    # The same model on jax arrays plans.
    plan = make.plan(jnp.asarray(X), jnp.asarray(y), batch) if batch else make.plan(jnp.asarray(X), jnp.asarray(y))
    assert "y" in plan.graph.factors
