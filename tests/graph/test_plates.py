"""Plates: names outermost first, full and minibatch sizes, broadcasting."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

import blrppl
from blrppl.graph.nodes import Plate


def test_nested_plates_are_recorded_outermost_first():
    def model():
        with numpyro.plate("A", 3):
            with numpyro.plate("B", 4, dim=-2):
                numpyro.sample("x", dist.Normal(0.0, 1.0))

    fg = blrppl.trace(model)
    assert fg.variables["x"].plates == ("A", "B")
    assert fg.variables["x"].shape == (4, 3)
    assert fg.factors["x"].plates == ("A", "B")
    assert fg.plates == {"A": Plate("A", 3, 3, -1), "B": Plate("B", 4, 4, -2)}


def test_broadcasting_plates():
    def model(y=None):
        with numpyro.plate("J", 3):
            mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            with numpyro.plate("N", 2, dim=-2):
                numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    fg = blrppl.trace(model, y=jnp.zeros((2, 3)))
    assert fg.variables["mu"].plates == ("J",)
    assert fg.factors["y"].plates == ("J", "N")
    assert fg.factors["y"].neighbours == ("mu",)
    assert fg.factors["y"].distribution.batch_shape == (2, 3)


def test_subsample_records_full_size_batch_and_scale():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("N", 100, subsample_size=10) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    fg = blrppl.trace(model, jnp.arange(100.0))
    plate = fg.plates["N"]
    assert (plate.size, plate.subsample_size) == (100, 10)
    assert plate.subsampled and plate.scale == 10.0
    assert fg.factors["y"].scale == 10.0
    assert fg.factors["y"].value.shape == (10,)
    assert fg.factors["mu"].scale is None


def test_local_latents_in_a_subsampled_plate():
    def model(y):
        with numpyro.plate("N", 50, subsample_size=5) as idx:
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])

    fg = blrppl.trace(model, jnp.zeros(50))
    assert fg.variables["z"].shape == (5,)
    assert fg.variables["z"].plates == ("N",)
    assert fg.factors["z"].scale == 10.0
