"""Point estimates for EM (the delta method, Khan & Rue Sec. 5.2)."""

import jax
import jax.numpy as jnp
import numpy as np

from blrppl.families import point_mass
from blrppl.families.point_mass import PointMass
from tests.compiles import cheap_jit


def test_to_numpyro_is_a_delta_with_the_event_dim(rng_key):
    value = jnp.array([[0.5, -1.0, 2.0]])
    d = point_mass.to_numpyro(value, event_dim=1)
    assert d.batch_shape == (1,) and d.event_shape == (3,)
    np.testing.assert_allclose(d.mean, value)
    np.testing.assert_allclose(d.variance, 0.0)
    assert d.log_prob(value) == 0.0
    assert point_mass.to_numpyro(2.0).event_shape == ()


def test_sample_repeats_the_value_and_is_jit_safe(rng_key):
    point = PointMass(value=jnp.array([1.0, 2.0]))
    draws = cheap_jit(point_mass.sample, static_argnums=2)(rng_key, point, (4,))
    assert draws.shape == (4, 2)
    np.testing.assert_allclose(draws, jnp.broadcast_to(point.value, (4, 2)))


def test_from_value_keeps_float32_and_casts_integers():
    assert point_mass.from_value(jnp.ones(2, jnp.float32)).value.dtype == jnp.float32
    assert point_mass.from_value(3).value.dtype == jnp.result_type(float)
    assert isinstance(jax.tree.leaves(PointMass(jnp.ones(2))), list)  # A pytree.
