"""Session-wide test settings: float64 once (funsor's conftest), fixed keys."""

import jax
import matplotlib
import pytest

jax.config.update("jax_enable_x64", True)
matplotlib.use("Agg")


@pytest.fixture
def rng_key():
    """A fixed key; never date-based, never tuned to pass."""
    return jax.random.key(0)
