"""The update rule: Eq. 58 and Eq. 60, and the safe step that never leaves the family."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxprs_in_params

from blrppl.blr.update import checked_global_update, global_update, local_update, safe_global_update
from blrppl.families import GAMMA, NORMAL, SCALAR_CHAIN_GAUSSIAN, ChainGaussianStats, GammaStats, NormalStats


def test_global_update_is_the_convex_combination_of_eq_58():
    lam = NormalStats(jnp.array(0.4), jnp.array(-0.7))
    msgs = [NormalStats(jnp.array(1.0), jnp.array(-0.2)), NormalStats(jnp.array(-0.5), jnp.array(-0.3))]
    new = global_update(lam, msgs, 0.25)
    np.testing.assert_allclose(new.x, 0.75 * 0.4 + 0.25 * 0.5, rtol=1e-14)
    np.testing.assert_allclose(new.x_sq, 0.75 * -0.7 + 0.25 * -0.5, rtol=1e-14)


def test_local_mode_matches_global_mode_for_shared_rho():
    """Refreshing every site from the same q with the same ρ, Eq. 60 is Eq. 58."""
    prior = NormalStats(jnp.array(0.0), jnp.array(-0.5))
    sites = {"p": prior, "a": NormalStats(jnp.array(0.4), jnp.array(-0.2)), "b": NormalStats(jnp.array(-1.0), jnp.array(-0.7))}
    msgs = {"p": prior, "a": NormalStats(jnp.array(2.6), jnp.array(-1.0)), "b": NormalStats(jnp.array(0.3), jnp.array(-0.1))}
    natural = jax.tree.map(lambda *xs: sum(xs), *sites.values())
    expected = global_update(natural, list(msgs.values()), 0.3)
    actual, _ = local_update(sites, msgs, 0.3)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-12)


def test_local_mode_keeps_sites_that_are_not_refreshed():
    sites = {"a": NormalStats(jnp.array(1.0), jnp.array(-0.5)), "b": NormalStats(jnp.array(2.0), jnp.array(-0.25))}
    natural, new = local_update(sites, {"a": NormalStats(jnp.array(3.0), jnp.array(-1.5))}, 0.5)
    np.testing.assert_allclose(new["b"].x, 2.0)
    np.testing.assert_allclose(natural.x, 0.5 * 1.0 + 0.5 * 3.0 + 2.0)


def test_safe_step_keeps_a_gaussian_valid_where_the_plain_step_would_not():
    lam = NormalStats(jnp.array(0.0), jnp.array(-0.5))
    bad = [NormalStats(jnp.array(1.0), jnp.array(0.5))]  # precision -1: an indefinite target
    plain = global_update(lam, bad, 0.9)
    assert not bool(NORMAL.is_valid(plain))
    safe, rejected = safe_global_update(NORMAL, lam, bad, 0.9)
    assert bool(NORMAL.is_valid(safe)) and not bool(rejected)


def test_a_safe_step_is_written_once_taken_only_where_eq_58_is_invalid_and_halved_where_it_fails():
    """The family's safe step (a Gaussian's solves) appears once in the update's program, runs only
    where Eq. 58 leaves the space, and is retried with ρ/2, ρ/4, ... where it fails."""
    calls = []

    def flaky(natural, target, r):  # a safe step that fails (not finite) for r > 0.3
        calls.append(r)
        return jax.tree.map(lambda x: jnp.where(r > 0.3, jnp.nan, x), NORMAL.safe_step(natural, target, r))

    family = NORMAL._replace(safe_step=flaky)
    lam = NormalStats(jnp.array(0.0), jnp.array(-0.5))
    bad = [NormalStats(jnp.array(1.0), jnp.array(0.5))]  # precision -1: Eq. 58 leaves the space at ρ = 0.9
    jax.make_jaxpr(lambda lam: safe_global_update(family, lam, bad, 0.9))(lam)
    assert len(calls) == 1
    new, rejected = safe_global_update(family, lam, bad, 0.9)
    expected = NORMAL.safe_step(lam, bad[0], 0.225)  # ρ/4: the first try the step takes
    assert not bool(rejected) and bool(NORMAL.is_valid(new))
    np.testing.assert_allclose([new.x, new.x_sq], [expected.x, expected.x_sq], rtol=1e-14)
    good = [NormalStats(jnp.array(1.0), jnp.array(-1.0))]
    new, rejected = safe_global_update(family, lam, good, 0.9)
    plain = global_update(lam, good, 0.9)
    assert not bool(rejected) and float(new.x) == float(plain.x) and float(new.x_sq) == float(plain.x_sq)


def test_safe_step_halves_rho_for_families_without_their_own_safe_step():
    lam = GammaStats(log_x=jnp.array(1.0), x=jnp.array(-1.0))
    target = [GammaStats(log_x=jnp.array(-3.0), x=jnp.array(-1.0))]  # shape -2: invalid
    new, rejected = safe_global_update(GAMMA, lam, target, 1.0)
    assert bool(GAMMA.is_valid(new)) and not bool(rejected)
    assert float(new.log_x) > -1.0  # a shorter step towards the target, not a clip


def test_safe_step_rejects_a_target_that_is_not_finite():
    lam = GammaStats(log_x=jnp.array(1.0), x=jnp.array(-1.0))
    new, rejected = safe_global_update(GAMMA, lam, [GammaStats(jnp.array(jnp.nan), jnp.array(-1.0))], 0.5)
    assert bool(rejected)
    np.testing.assert_array_equal(new.log_x, lam.log_x)


def test_checked_step_halves_a_chain_and_returns_the_moments_of_the_lambda_it_keeps():
    """A chain's step is checked by its own moments (one smoother): an indefinite target
    is halved to a valid midpoint (the safe step's ρ/2^k), a target that is not finite is
    rejected, and the moments returned are those of the λ returned, as the ELBO reads them."""
    family = SCALAR_CHAIN_GAUSSIAN
    lam = ChainGaussianStats(np.zeros(4), np.full(4, -1.0), np.full(3, 0.5))
    bad = ChainGaussianStats(np.ones(4), np.array([-1.0, 0.5, -1.0, -1.0]), np.full(3, 0.5))  # J_22 < 0

    @jax.jit
    def both(target):
        new, rejected, moments = checked_global_update(family, lam, [target], 1.0)
        safe, safe_rejected = safe_global_update(family, lam, [target], 1.0)
        reference = (family.mean_params(new), family.log_normalizer(new), family.is_valid(new))
        return new, rejected, moments, safe, safe_rejected, reference

    new, rejected, (mean, log_norm), safe, safe_rejected, (ref_mean, ref_log_norm, valid) = both(bad)
    assert bool(valid) and not bool(rejected) and not bool(safe_rejected)
    assert_trees_close(new, safe, rtol=1e-12)
    assert_trees_close(mean, ref_mean, rtol=1e-12)
    np.testing.assert_allclose(log_norm, ref_log_norm, rtol=1e-12)
    bad.x[0] = np.nan
    kept, rejected, *_ = both(bad)
    assert bool(rejected)
    assert_trees_close(kept, lam, rtol=0.0)


def _scans(jaxpr) -> int:
    """The ``scan`` equations in a jaxpr, nested ones included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "scan"
        for sub in jaxprs_in_params(eqn.params):
            count += _scans(sub)
    return count


def test_a_small_chains_check_is_written_once_in_the_update():
    """A small λ's smoother (the check) appears once in the update's program: the first try is
    the halving loop's first iteration, not a smoother before it and another in it."""
    family = SCALAR_CHAIN_GAUSSIAN
    lam = ChainGaussianStats(np.zeros(4), np.full(4, -1.0), np.full(3, 0.5))
    target = ChainGaussianStats(np.ones(4), np.array([-1.0, 0.5, -1.0, -1.0]), np.full(3, 0.5))
    smoother = _scans(jax.make_jaxpr(lambda n: family.mean_and_log_normalizer(n))(lam).jaxpr)
    update = jax.make_jaxpr(lambda n: checked_global_update(family, n, [target], 1.0))(lam)
    assert smoother > 0 and _scans(update.jaxpr) == smoother


def assert_trees_close(actual, expected, rtol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol)


def test_the_plain_update_of_an_exact_run_rejects_a_target_outside_the_family():
    # An exact run's step is the posterior or nothing: neither the improved Gaussian step nor a
    # halved ρ, which both give a valid λ here (tests above), may stand in for it.
    lam = NormalStats(jnp.array(0.0), jnp.array(-0.5))
    bad = [NormalStats(jnp.array(1.0), jnp.array(0.5))]
    new, rejected = safe_global_update(NORMAL, lam, bad, 1.0, plain=True)
    assert bool(rejected)
    np.testing.assert_array_equal(new.x_sq, lam.x_sq)
    gamma = GammaStats(log_x=jnp.array(1.0), x=jnp.array(-1.0))
    _, rejected = safe_global_update(GAMMA, gamma, [GammaStats(log_x=jnp.array(-3.0), x=jnp.array(-1.0))], 1.0, plain=True)
    assert bool(rejected)
    good = [NormalStats(jnp.array(1.0), jnp.array(-0.25))]
    new, rejected = safe_global_update(NORMAL, lam, good, 1.0, plain=True)
    assert not bool(rejected)
    np.testing.assert_array_equal(new.x, good[0].x)
