"""Shared helpers for the exact-site-parameter tests.

Random mean parameters are built from usual parameters with scipy (not with
the library's families), in the *value layout* of
:mod:`blrppl.symbolic.expectation`; the closed forms the tests compare with are
the textbook VMP messages (Winn & Bishop 2005; Bishop, PRML ch. 10).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import digamma

from blrppl.estimators.base import var_info
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.expectation import VarInfo, expected_value

RTOL = 1e-10
ATOL = 1e-12
LOG_2PI = math.log(2.0 * math.pi)

# Statistics that are matrices over a block: only their symmetric part is a
# natural parameter (from_value_layout symmetrises them), so compare that.
_MATRIX_STATS = {("gaussian", "xx"), ("wishart", "x")}


# ---------------------------------------------------------------------------
# Random q's in value layout (usual parameters -> mean parameters, by scipy).


def gaussian(rs: np.random.RandomState, shape: tuple, num_batch: int | None = None) -> dict:
    """A random Gaussian q: ``{"x": E[x], "xx": E[x x^T] (block) or E[x^2]}``."""
    shape = tuple(shape)
    num_batch = len(shape) if num_batch is None else num_batch
    m = rs.randn(*shape)
    block = shape[num_batch:]
    if not block:
        v = rs.uniform(0.2, 1.5, shape)
        return {"x": m, "xx": m**2 + v}
    (d,) = block
    a = rs.randn(*shape[:num_batch], d, d)
    cov = a @ np.swapaxes(a, -1, -2) / d + 0.3 * np.eye(d)
    return {"x": m, "xx": cov + m[..., :, None] * m[..., None, :]}


def observed(y) -> dict:
    """Observed data as a degenerate Gaussian (E[y] = y, E[y^2] = y^2)."""
    y = np.asarray(y, float)
    return {"x": y, "xx": y**2}


def gamma(rs, shape=()) -> dict:
    a = rs.uniform(1.5, 4.0, shape)
    b = rs.uniform(0.5, 3.0, shape)
    return {"x": a / b, "log_x": digamma(a) - np.log(b)}


def inverse_gamma(rs, shape=()) -> dict:
    a = rs.uniform(2.5, 5.0, shape)
    b = rs.uniform(0.5, 3.0, shape)
    return {"inv_x": a / b, "log_x": np.log(b) - digamma(a)}


def beta(rs, shape=()) -> dict:
    a = rs.uniform(0.7, 4.0, shape)
    b = rs.uniform(0.7, 4.0, shape)
    return {"log_x": digamma(a) - digamma(a + b), "log1m_x": digamma(b) - digamma(a + b)}


def dirichlet(rs, shape=(), k=3) -> dict:
    alpha = rs.uniform(0.7, 4.0, tuple(shape) + (k,))
    return {"log_x": digamma(alpha) - digamma(alpha.sum(-1, keepdims=True))}


def categorical(rs, shape, k) -> dict:
    p = rs.dirichlet(np.ones(k), tuple(shape))
    return {"one_hot": p}


def bernoulli(rs, shape) -> dict:
    return {"x": rs.uniform(0.1, 0.9, shape)}


def wishart(rs, d, shape=()) -> dict:
    """Wishart(n, V): ``{"x": n V, "log_det_x": psi_d(n/2) + d log 2 + log|V|}``."""
    n = d + 1.0 + rs.uniform(0.5, 3.0, shape)
    a = rs.randn(*shape, d, d)
    v = a @ np.swapaxes(a, -1, -2) / d + 0.5 * np.eye(d)
    psi_d = sum(digamma((n - i) / 2.0) for i in range(d))
    return {"x": n[..., None, None] * v, "log_det_x": psi_d + d * math.log(2.0) + np.linalg.slogdet(v)[1]}


def cov_of(q: dict) -> np.ndarray:
    """Cov[x] (block) or Var[x] of a Gaussian q in value layout."""
    m = q["x"]
    if q["xx"].shape == m.shape:
        return q["xx"] - m**2
    return q["xx"] - m[..., :, None] * m[..., None, :]


# ---------------------------------------------------------------------------
# Example values (only shapes and dtypes matter to the analysis).


def example(info: VarInfo):
    shape = tuple(info.shape)
    if info.kind == "gaussian":
        return jnp.zeros(shape)
    if info.kind in ("gamma", "inverse_gamma"):
        return jnp.ones(shape)
    if info.kind == "beta":
        return jnp.full(shape, 0.5)
    if info.kind == "dirichlet":
        return jnp.full(shape, 1.0 / shape[-1])
    if info.kind == "wishart":
        return jnp.broadcast_to(jnp.eye(shape[-1]), shape)
    if info.kind == "categorical":
        return jnp.zeros(shape, jnp.int32)
    if info.kind == "bernoulli":
        return jnp.zeros(shape)
    raise ValueError(info.kind)


# ---------------------------------------------------------------------------
# The library's side: E_q[log f] and its gradient in mean parameters.


def library_site_parameters(log_factor: Callable, infos: Mapping[str, VarInfo], mean: Mapping[str, dict]):
    """``(E_q[log f], {var: {stat: d E / d stat}})`` from the symbolic analysis."""
    examples = {v: example(info) for v, info in infos.items()}
    terms = analyse(log_factor, examples, infos)
    mean = jax.tree.map(jnp.asarray, dict(mean))
    value, grads = jax.value_and_grad(lambda m: expected_value(terms, m))(mean)
    return value, grads


def assert_messages(actual: Mapping, expected: Mapping, kinds: Mapping[str, str], rtol=RTOL, atol=ATOL):
    """Compare site parameters variable by variable and statistic by statistic."""
    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    for var in expected:
        assert set(actual[var]) == set(expected[var]), (var, sorted(actual[var]), sorted(expected[var]))
        for stat, want in expected[var].items():
            got = np.asarray(actual[var][stat])
            want = np.asarray(want, float)
            scalar_block = kinds[var] == "gaussian" and got.shape == np.shape(actual[var]["x"])
            if (kinds[var], stat) in _MATRIX_STATS and got.ndim >= 2 and not scalar_block:
                got = 0.5 * (got + np.swapaxes(got, -1, -2))
            assert got.shape == np.broadcast_shapes(got.shape, want.shape), (var, stat, got.shape, want.shape)
            np.testing.assert_allclose(
                got, np.broadcast_to(want, got.shape), rtol=rtol, atol=atol, err_msg=f"site parameter {var}.{stat}"
            )


def assert_value(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(float(actual), float(expected), rtol=rtol, atol=atol, err_msg="E_q[log f]")


def scatter(values, index, size) -> np.ndarray:
    """Sum ``values`` into ``size`` bins given by integer ``index`` (message to an indexed variable)."""
    out = np.zeros((size,) + np.shape(values)[1:])
    np.add.at(out, np.asarray(index), values)
    return out


# ---------------------------------------------------------------------------
# Per-position closed forms (Winn & Bishop's messages; Bishop PRML ch. 10).


def normal_terms(v, m, prec, log_prec, log_c=0.0):
    """Per-position ``E[log N(v | m, precision)]`` and its partials.

    ``v``, ``m``: Gaussian moments ``{"x", "xx"}`` (scalar blocks), already
    gathered to the positions; ``prec``/``log_prec``: ``E[precision]`` and
    ``E[log precision]``; ``log_c`` adds ``0.5 log c`` when the precision is
    ``c`` times a latent (already folded into ``prec`` and ``log_prec``).

    Returns ``(values, partials)`` with partials keyed ``v.x, v.xx, m.x, m.xx,
    prec, log_prec``.
    """
    sq = v["xx"] - 2.0 * v["x"] * m["x"] + m["xx"]
    value = -0.5 * LOG_2PI + 0.5 * log_prec - 0.5 * prec * sq
    partials = {
        "v.x": prec * m["x"],
        "v.xx": -0.5 * prec * np.ones_like(sq),
        "m.x": prec * v["x"],
        "m.xx": -0.5 * prec * np.ones_like(sq),
        "prec": -0.5 * sq,
        "log_prec": 0.5 * np.ones_like(sq),
    }
    return value, partials


def normal_terms_variance(v, m, var_q):
    """Per-position ``E[log N(v | m, sqrt(var))]`` with an inverse-Gamma ``var``."""
    sq = v["xx"] - 2.0 * v["x"] * m["x"] + m["xx"]
    value = -0.5 * LOG_2PI - 0.5 * var_q["log_x"] - 0.5 * var_q["inv_x"] * sq
    partials = {
        "v.x": var_q["inv_x"] * m["x"],
        "v.xx": -0.5 * var_q["inv_x"] * np.ones_like(sq),
        "m.x": var_q["inv_x"] * v["x"],
        "m.xx": -0.5 * var_q["inv_x"] * np.ones_like(sq),
        "inv_x": -0.5 * sq,
        "log_x": -0.5 * np.ones_like(sq),
    }
    return value, partials


def gathered(q: dict, index) -> dict:
    """A q's statistics read at integer positions ``index`` (``mu[idx]``)."""
    return {k: np.asarray(a)[np.asarray(index)] for k, a in q.items()}


def kinds_of(infos: Mapping[str, VarInfo]) -> dict:
    return {v: info.kind for v, info in infos.items()}


def as_value_layout(q: Any, stats: Any) -> dict:
    """Family-layout statistics of one variable -> value-layout dict."""
    from blrppl.families import MVNStats, NormalStats

    if isinstance(stats, NormalStats):
        return {"x": np.asarray(stats.x).reshape(q.shape), "xx": np.asarray(stats.x_sq).reshape(q.shape)}
    if isinstance(stats, MVNStats):
        return {"x": np.asarray(stats.x).reshape(q.shape), "xx": np.asarray(stats.xxT).reshape(q.shape + q.block_shape)}
    return {k: np.asarray(a) for k, a in stats._asdict().items()}


def as_family_layout(q: Any, mean: dict) -> Any:
    """Value-layout mean parameters of one variable -> the family's stats tuple."""
    from blrppl.families import NORMAL, MVNStats, NormalStats

    if q.kind == "gaussian":
        if q.family is NORMAL:
            return NormalStats(x=jnp.asarray(mean["x"]), x_sq=jnp.asarray(mean["xx"]))
        d = math.prod(q.block_shape)
        return MVNStats(
            x=jnp.reshape(jnp.asarray(mean["x"]), q.batch_shape + (d,)),
            xxT=jnp.reshape(jnp.asarray(mean["xx"]), q.batch_shape + (d, d)),
        )
    return q.family.stats_type(**{k: jnp.asarray(mean[k]) for k in q.family.stats_type._fields})


def plan_site_parameters(engine_cls, model, args, factor: str, mean: Mapping[str, dict], kwargs=None):
    """Site parameters of ``factor`` from a numpyro model via ``engine.plan``.

    Returns ``(plan, value, {var: value-layout site parameter})``.
    """
    plan = engine_cls(model).plan(*args, **(kwargs or {}))
    (est,) = [e for e in plan.estimators if e.factor == factor]
    assert est.method.label == "exact"
    family_mean = {v: as_family_layout(plan.qs[v], mean[v]) for v in est.neighbours}
    value, grads = est.estimate(jax.random.key(0), family_mean, plan.init_params, plan.arrays)
    return plan, value, {v: as_value_layout(plan.qs[v], grads[v]) for v in est.neighbours}


# ---------------------------------------------------------------------------
# Table-driven cases: a log factor, its q's, and the closed forms it must match.


def G(shape=(), nb=None) -> VarInfo:
    """A Gaussian VarInfo; ``nb`` leading axes mean-field (default: all)."""
    return VarInfo("gaussian", tuple(shape), len(shape) if nb is None else nb)


@dataclasses.dataclass
class Case:
    """One factor: canonical log factor (and optionally the same factor in a NumPyro model),
    the q of each neighbour, and the closed-form E_q[log f] and site parameters."""

    infos: dict
    mean: dict
    value: float
    messages: dict
    log_factor: Callable
    model: Callable | None = None
    args: tuple = ()
    factor: str | None = None


def sum_partials(p, **names):
    """{stat: sum of the per-position partial p[key]} for a scalar variable broadcast over a plate."""
    return {stat: np.sum(p[key]) for stat, key in names.items()}


def mvn_wishart_terms(v_x, v_xx, mu, lam):
    """Per-row E[log MVN(v | mu, precision=Lam)] with S_n = E[(v_n - mu)(v_n - mu)^T], and E[Lam]."""
    d = mu["x"].shape[-1]
    L = lam["x"]
    S = v_xx - v_x[:, :, None] * mu["x"][None, None, :] - mu["x"][None, :, None] * v_x[:, None, :] + mu["xx"]
    values = -0.5 * d * LOG_2PI + 0.5 * lam["log_det_x"] - 0.5 * np.einsum("ij,nji->n", L, S)
    return values, S, L


def build_case(cases: Mapping[str, Callable], name: str) -> Case:
    """Build a case with a seed fixed by its name (independent of test order)."""
    return cases[name](np.random.RandomState(sum(map(ord, name))))


def check_canonical(case: Case) -> None:
    """The canonical-density log factor: E_q[log f] and jax.grad of it equal the closed forms."""
    value, grads = library_site_parameters(case.log_factor, case.infos, case.mean)
    assert_value(value, case.value)
    assert_messages(grads, case.messages, kinds_of(case.infos))


def check_model(case: Case, engine_cls) -> None:
    """The same factor written as a NumPyro model, through ``engine.plan`` and its exact estimator."""
    plan, value, messages = plan_site_parameters(engine_cls, case.model, case.args, case.factor, case.mean)
    for v, info in case.infos.items():
        assert var_info(plan.qs[v]) == info, (v, var_info(plan.qs[v]), info)
    assert set(plan.graph.factors[case.factor].neighbours) == set(case.infos)
    assert_value(value, case.value)
    assert_messages(messages, case.messages, kinds_of(case.infos))
