"""Global (Eq. 58) and local (Eq. 60) modes: equal when every site is refreshed alike."""

import jax
import numpy as np
import pytest

import blrppl
from models import ZOO


@pytest.mark.parametrize("schedule", ["parallel", "sequential"])
def test_local_mode_matches_global_mode_for_shared_rho(rng_key, schedule):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    runs = {
        mode: blrppl.BLR(entry.model, mode=mode, schedule=schedule, learning_rate=0.3).run(
            rng_key, 12, *args, progress_bar=False, **kwargs
        )
        for mode in ("global", "local")
    }
    for a, b in zip(jax.tree.leaves(runs["global"].natural_params), jax.tree.leaves(runs["local"].natural_params)):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    np.testing.assert_allclose(runs["global"].elbo, runs["local"].elbo, rtol=1e-10)
    assert runs["global"].site_params == {}


def test_local_mode_sites_sum_to_the_natural_parameters(rng_key):
    entry = ZOO["normal_mean_precision"]
    args, kwargs = entry.data()
    result = blrppl.BLR(entry.model, mode="local", learning_rate=0.5).run(rng_key, 5, *args, progress_bar=False, **kwargs)
    sites = result.site_params
    for v, natural in result.natural_params.items():
        parts = [s[v] for s in sites.values() if v in s]
        total = jax.tree.map(lambda *xs: sum(xs), *parts)
        for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(natural)):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    assert set(sites["y"]) == {"mu", "tau"}
