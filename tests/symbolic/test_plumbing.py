"""Array plumbing of parameters and latents: exactness does not depend on layout.

User code lays values out in arrays before using them: a per-step scale
``concatenate([[sd0], full(T - 1, sqrt(v))])``, a padded or stacked vector, a
``where`` with a constant condition, a reshaped or transposed matrix. Each
position of the result is then a constant or one element of a variable, and
the symbolic layer must see through the layout, also where a nonlinear
function (``log``, a power) follows it.

For each operation, a vector of T positions is built from a variable v (J
elements) and constants; which element of v (or which constant) lands at
each position is found by running the same code on marker values (plain
jax.numpy, not the symbolic layer). The closed forms then follow position by
position: a Gamma precision (``E log v``, ``E v``), a point estimate (the log
density at its value) and a Gaussian mean (``E x``, ``E x^2``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from blrppl.symbolic import canonical as C
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value, point_stats, stats_needed

from ._helpers import assert_messages, assert_value, gamma, gaussian, library_site_parameters

T = 6
J = 2
CONST = np.array([0.7, 1.3, 2.1, 0.4, 1.8, 0.9])


def _concatenate(v):
    return jnp.concatenate([jnp.asarray(CONST[:2]), jnp.full((T - 2,), v[0])])


def _full(v):
    return jnp.full((T,), v[1])


def _broadcast(v):
    return jnp.where(jnp.arange(T) % 2 == 0, jnp.broadcast_to(v[0], (T,)), jnp.asarray(CONST))


def _stack(v):
    return jnp.stack([CONST[0], v[0], CONST[2], v[1], v[0], CONST[5]])


def _pad(v):
    return jnp.pad(jnp.stack([v[0], v[1], v[1], v[0]]), (1, 1), constant_values=CONST[0])


def _static_slice(v):
    long = jnp.concatenate([jnp.asarray(CONST), jnp.full((3,), v[1]), jnp.asarray(CONST)])
    return long[4 : 4 + T]


def _dynamic_slice(v):
    long = jnp.concatenate([jnp.full((4,), v[0]), jnp.asarray(CONST)])
    return jax.lax.dynamic_slice(long, (2,), (T,))


def _where(v):
    return jnp.where(jnp.asarray([True, False, True, True, False, False]), v[1], jnp.asarray(CONST))


def _reshape(v):
    grid = jnp.stack([jnp.full((3,), v[0]), jnp.asarray(CONST[:3])])  # (2, 3)
    return jnp.reshape(grid, (T,))


def _transpose(v):
    grid = jnp.stack([jnp.full((2,), v[1]), jnp.asarray(CONST[:2]), jnp.full((2,), v[0])])  # (3, 2)
    return jnp.reshape(grid.T, (T,))


PLUMBING = {
    "concatenate": _concatenate,
    "full": _full,
    "broadcast_in_dim": _broadcast,
    "stack": _stack,
    "pad": _pad,
    "static slice": _static_slice,
    "dynamic_slice": _dynamic_slice,
    "where (constant condition)": _where,
    "reshape": _reshape,
    "transpose": _transpose,
}


def layout(build):
    """(which, constants): the element of v at each position (-1: a constant) and the constants."""
    markers = 1000.0 + np.arange(J)
    values = np.asarray(build(jnp.asarray(markers)))
    which = np.full(T, -1)
    for j, marker in enumerate(markers):
        which[values == marker] = j
    return which, np.where(which < 0, values, np.nan)


Y = np.array([0.3, -1.2, 0.8, 2.0, -0.5, 1.1])


@pytest.mark.parametrize("op", sorted(PLUMBING))
def test_a_plumbed_precision_is_exact(op):
    """y_t ~ Normal(0, 1 / sqrt(prec_t)), prec laid out from a Gamma latent v by ``op``."""
    build = PLUMBING[op]
    which, constants = layout(build)
    assert (which >= 0).any()
    rs = np.random.RandomState(sum(map(ord, op)))
    mean = {"v": gamma(rs, (J,))}

    def log_factor(values):
        return jnp.sum(C._normal(jnp.asarray(Y), 0.0, 1.0 / jnp.sqrt(build(values["v"]))))

    value, grads = library_site_parameters(log_factor, {"v": VarInfo("gamma", (J,), 1)}, mean)
    latent = which >= 0
    e_log = np.where(latent, mean["v"]["log_x"][np.maximum(which, 0)], np.log(np.where(latent, 1.0, constants)))
    e_prec = np.where(latent, mean["v"]["x"][np.maximum(which, 0)], constants)
    expected = np.sum(-0.5 * math.log(2 * math.pi) + 0.5 * e_log - 0.5 * e_prec * Y**2)
    assert_value(value, expected)
    messages = {
        "log_x": np.array([0.5 * np.sum(which == j) for j in range(J)]),
        "x": np.array([-0.5 * np.sum(Y[which == j] ** 2) for j in range(J)]),
    }
    assert_messages(grads, {"v": messages}, {"v": "gamma"})


@pytest.mark.parametrize("op", sorted(PLUMBING))
def test_a_plumbed_point_estimate_is_exact(op):
    """y_t ~ Normal(0, sqrt(var_t)), var laid out from a point estimate (EM's parameter) by ``op``."""
    build = PLUMBING[op]
    which, constants = layout(build)
    v = np.array([0.8, 2.5])

    def log_factor(values):
        return jnp.sum(C._normal(jnp.asarray(Y), 0.0, jnp.sqrt(build(values["v"]))))

    infos = {"v": VarInfo("point", (J,), 0)}
    analysis = analyse(log_factor, {"v": jnp.asarray(v)}, infos)
    stats = point_stats(jnp.asarray(v), stats_needed(analysis.terms, "v"))
    value = expected_value(analysis, {"v": stats})
    variances = np.where(which >= 0, v[np.maximum(which, 0)], constants)
    np.testing.assert_allclose(value, np.sum(norm.logpdf(Y, 0.0, np.sqrt(variances))), rtol=1e-12)
    # The gradient in v (EM's M-step) through the statistics equals autodiff of the density.
    direct = jax.grad(lambda u: log_factor({"v": u}))(jnp.asarray(v))
    through = jax.grad(lambda u: expected_value(analysis, {"v": point_stats(u, stats_needed(analysis.terms, "v"))}))(jnp.asarray(v))
    np.testing.assert_allclose(through, direct, rtol=1e-12)


@pytest.mark.parametrize("op", sorted(PLUMBING))
def test_a_plumbed_gaussian_mean_is_exact(op):
    """y_t ~ Normal(m_t, 1), m laid out from a mean-field Gaussian latent x by ``op``."""
    build = PLUMBING[op]
    which, constants = layout(build)
    rs = np.random.RandomState(sum(map(ord, op)) + 1)
    mean = {"x": gaussian(rs, (J,))}

    def log_factor(values):
        return jnp.sum(C._normal(jnp.asarray(Y), build(values["x"]), 1.0))

    value, grads = library_site_parameters(log_factor, {"x": VarInfo("gaussian", (J,), 1)}, mean)
    latent = which >= 0
    index = np.maximum(which, 0)
    square = np.where(latent, Y**2 - 2 * Y * mean["x"]["x"][index] + mean["x"]["xx"][index], (Y - np.where(latent, 0.0, constants)) ** 2)
    assert_value(value, np.sum(-0.5 * math.log(2 * math.pi) - 0.5 * square))
    messages = {
        "x": np.array([np.sum(Y[which == j]) for j in range(J)]),
        "xx": np.array([-0.5 * np.sum(which == j) for j in range(J)]),
    }
    assert_messages(grads, {"x": messages}, {"x": "gaussian"})
