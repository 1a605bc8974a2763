"""Learning-rate schedules: steps count from 1, values in (0, 1]."""

import jax.numpy as jnp
import numpy as np
import pytest

from blrppl.blr.schedules import as_schedule, constant, robbins_monro


def test_robbins_monro_starts_at_one_and_is_one_over_t_for_kappa_one():
    rho = robbins_monro(1.0, 1.0)
    np.testing.assert_allclose([float(rho(jnp.asarray(t))) for t in (1, 2, 10)], [1.0, 0.5, 0.1])


def test_constant_and_callables():
    assert float(as_schedule(0.3)(jnp.asarray(5))) == pytest.approx(0.3)
    assert as_schedule(abs) is abs
    with pytest.raises(ValueError):
        constant(1.5)
    with pytest.raises(ValueError):
        robbins_monro(1.0, 0.4)
    with pytest.raises(ValueError):
        robbins_monro(0.5, 0.7)
