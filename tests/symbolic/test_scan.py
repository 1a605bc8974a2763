"""Scan bodies are interpreted as scans (one vmapped pass), never unrolled."""

import time

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

from blrppl.estimators.base import factor_log_density
from blrppl.graph.concrete import example_latents
from blrppl.graph.trace import build_graph
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value
from blrppl.symbolic.terms import NonConjugate

PHI, SIGMA, NOISE = 0.7, 0.5, 1.0


def ar1(y=None, length=5):
    x0 = numpyro.sample("x0", dist.Normal(0.0, 10.0))

    def transition(prev, y_t):
        x = numpyro.sample("x", dist.Normal(PHI * prev, SIGMA))
        numpyro.sample("y", dist.Normal(x, NOISE), obs=y_t)
        return x, x

    scan(transition, x0, y, length=length)


def analysed(model, length, factor):
    y = jnp.sin(jnp.arange(float(length)))
    graph = build_graph(model, (), {"y": y, "length": length})
    examples = example_latents(graph)
    (var,) = graph.variables
    log_factor = factor_log_density(graph, factor, {}, {})
    infos = {var: VarInfo("gaussian", (length + 1,), 1)}  # mean-field over time
    return analyse(lambda v: log_factor(v, {}), {var: examples[var]}, infos), np.asarray(y), var


@pytest.mark.parametrize("factor", ["x0", "x", "y"])
def test_scan_factors_match_closed_forms(factor):
    length = 6
    analysis, y, var = analysed(ar1, length, factor)
    rng = np.random.default_rng(0)
    m, v = rng.normal(size=length + 1), rng.uniform(0.1, 1.0, length + 1)
    value = expected_value(analysis, {var: {"x": m, "xx": m**2 + v}})
    if factor == "x0":
        expected = -0.5 * np.log(2 * np.pi * 100.0) - 0.5 * (m[0] ** 2 + v[0]) / 100.0
    elif factor == "x":
        sq = (m[1:] - PHI * m[:-1]) ** 2 + v[1:] + PHI**2 * v[:-1]
        expected = np.sum(-0.5 * np.log(2 * np.pi * SIGMA**2) - 0.5 * sq / SIGMA**2)
    else:
        expected = np.sum(-0.5 * np.log(2 * np.pi * NOISE**2) - 0.5 * ((y - m[1:]) ** 2 + v[1:]) / NOISE**2)
    np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_long_scans_are_not_unrolled():
    start = time.perf_counter()
    long, _, _ = analysed(ar1, 5000, "x")
    elapsed = time.perf_counter() - start
    short, _, _ = analysed(ar1, 50, "x")
    assert len(long.terms) == len(short.terms)  # terms over the time axis, not per step
    assert elapsed < 60.0  # generous: unrolling 5000 steps would take far longer


def cumulative(y=None, length=5):
    def transition(level, y_t):
        step = numpyro.sample("step", dist.Normal(0.0, SIGMA))
        level = level + step  # the carry accumulates random values
        numpyro.sample("y", dist.Normal(level, NOISE), obs=y_t)
        return level, level

    scan(transition, 0.0, y, length=length)


def test_an_accumulating_random_carry_is_reported_not_guessed():
    y = jnp.ones(4)
    graph = build_graph(cumulative, (), {"y": y, "length": 4})
    (var,) = graph.variables
    examples = example_latents(graph)
    log_factor = factor_log_density(graph, "y", {}, {})
    infos = {var: VarInfo("gaussian", tuple(np.shape(examples[var])), 1)}
    with pytest.raises(NonConjugate, match="accumulates"):
        analyse(lambda v: log_factor(v, {}), {var: examples[var]}, infos)
