"""Make ``tests/data/nile_reference.json``: the exact posterior of ``models.nile.scales_model`` by brute force.

Run from the repository root (about a minute, numpy only)::

    python -m tests.data.make_nile_reference

The model: obs_sd ~ HalfNormal(200), level_sd ~ HalfNormal(100),
level0 ~ N(1000, 1000²), level_t ~ N(level_{t-1}, level_sd²),
y_t ~ N(level_t, obs_sd²) for the T = 100 Nile flows. Given the two sds
everything else is a linear Gaussian chain, so

* log p(y | obs_sd, level_sd) is the Kalman filter's prediction-error
  decomposition (exact), and
* p(level0..level_T | sds, y) is Gaussian with the RTS smoother's means and
  variances (exact).

The two sds are integrated on a dense tensor grid of u = (log obs_sd,
log level_sd) by the trapezoidal rule, with log p(u, y) = log p(y | sds) +
log HalfNormal(sds) + u1 + u2 (the log-Jacobian of sd = e^u). Posterior
moments of the sds (and of log sd and sd²) are the grid's weighted moments;
the levels' are those of the Gaussian mixture over the grid (within-node
plus between-node variance). No NUTS, no blrppl: nothing here depends on
mixing or on the engine under test.

The grid's reach is checked (weight on edge nodes < 1e-12) and its step by
a second grid with half as many nodes per axis: ``metadata.coarse_diff``
holds the largest |difference| of the two grids' moments in units of the
posterior sd (means) and relatively (sds); the script raises if it is above
1e-6.

Stored: ``mean``/``sd`` per site for ``obs_sd``, ``level_sd``,
``log_obs_sd``, ``log_level_sd``, ``obs_var``, ``level_var``, ``level0``
(a scalar) and ``level`` (the T = 100 levels level_1..level_T, as in the
model's ``level`` site), plus ``log_evidence`` (log p(y)).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from models import nile

PATH = pathlib.Path(__file__).with_name("nile_reference.json")
OBS_SCALE, LEVEL_SCALE = 200.0, 100.0
#: Reach of the grid in log obs_sd and log level_sd (posterior: obs_sd ~ 120, level_sd ~ 40, with a
#: long left tails in both: as either sd -> 0 the likelihood tends to a positive limit, so p(u | y) ~ e^u).
REACH = ((-14.0, 7.5), (-24.0, 7.5))
NUM = (861, 1261)
CHUNK = 20_000


def _filter(y, obs_var, level_var, keep=False):
    """Kalman filter at every node: log p(y | h), and the filtered moments when ``keep``."""
    T, G = y.shape[0], obs_var.shape[0]
    m, p = np.full(G, nile.INITIAL_MEAN), np.full(G, nile.INITIAL_SD**2)
    log_lik = np.zeros(G)
    if keep:
        fm, fp = np.empty((T + 1, G)), np.empty((T + 1, G))
        fm[0], fp[0] = m, p
    for t in range(T):
        p = p + level_var
        s = p + obs_var
        e = y[t] - m
        log_lik -= 0.5 * (e**2 / s + np.log(2 * np.pi * s))
        gain = p / s
        m, p = m + gain * e, p - gain * p
        if keep:
            fm[t + 1], fp[t + 1] = m, p
    return (log_lik, fm, fp) if keep else log_lik


def _smooth(fm, fp, level_var):
    """RTS smoother: the means and variances of level_0..level_T given y."""
    T = fm.shape[0] - 1
    sm, sp = np.empty_like(fm), np.empty_like(fp)
    sm[T], sp[T] = fm[T], fp[T]
    for t in range(T - 1, -1, -1):
        predicted = fp[t] + level_var
        back = fp[t] / predicted
        sm[t] = fm[t] + back * (sm[t + 1] - fm[t])
        sp[t] = fp[t] + back**2 * (sp[t + 1] - predicted)
    return sm, sp


def _log_half_normal(x, scale):
    return 0.5 * np.log(2 / np.pi) - np.log(scale) - 0.5 * (x / scale) ** 2


def posterior(y, num=NUM, reach=REACH):
    """Moments of every site and log p(y) on a ``num`` grid over ``reach`` (see the module docstring)."""
    y = np.asarray(y, float)
    u1, u2 = np.linspace(*reach[0], num[0]), np.linspace(*reach[1], num[1])
    g1, g2 = (g.ravel() for g in np.meshgrid(u1, u2, indexing="ij"))
    obs_sd, level_sd = np.exp(g1), np.exp(g2)
    log_joint = np.empty(g1.shape[0])
    for start in range(0, g1.shape[0], CHUNK):
        part = slice(start, start + CHUNK)
        log_joint[part] = _filter(y, obs_sd[part] ** 2, level_sd[part] ** 2)
    log_joint += _log_half_normal(obs_sd, OBS_SCALE) + _log_half_normal(level_sd, LEVEL_SCALE) + g1 + g2
    top = log_joint.max()
    w = np.exp(log_joint - top).reshape(num)
    edge = np.ones(num, bool)
    edge[1:-1, 1:-1] = False
    w[[0, -1], :] *= 0.5  # trapezoid
    w[:, [0, -1]] *= 0.5
    cell = (u1[1] - u1[0]) * (u2[1] - u2[0])
    log_evidence = top + np.log(np.sum(w) * cell)
    w = w / np.sum(w)
    edge_weight = float(np.sum(w[edge]))
    w = w.ravel()

    def moments(values):
        mean = np.sum(w * values)
        return float(mean), float(np.sqrt(max(np.sum(w * values**2) - mean**2, 0.0)))

    out = {
        "obs_sd": moments(obs_sd), "level_sd": moments(level_sd),
        "log_obs_sd": moments(g1), "log_level_sd": moments(g2),
        "obs_var": moments(obs_sd**2), "level_var": moments(level_sd**2),
    }
    first = np.zeros(y.shape[0] + 1)
    second = np.zeros(y.shape[0] + 1)
    for start in range(0, g1.shape[0], CHUNK):
        part = slice(start, start + CHUNK)
        wp = w[part]
        if not np.any(wp > 0):
            continue
        _, fm, fp = _filter(y, obs_sd[part] ** 2, level_sd[part] ** 2, keep=True)
        sm, sp = _smooth(fm, fp, level_sd[part] ** 2)
        first += sm @ wp
        second += (sp + sm**2) @ wp
    sd = np.sqrt(second - first**2)
    out["level0"] = (float(first[0]), float(sd[0]))
    out["level"] = (first[1:].tolist(), sd[1:].tolist())
    return out, float(log_evidence), edge_weight


def _differences(a, b):
    mean = max(float(np.max(np.abs(np.subtract(a[s][0], b[s][0])) / np.asarray(a[s][1]))) for s in a)
    sd = max(float(np.max(np.abs(np.asarray(b[s][1]) / np.asarray(a[s][1]) - 1))) for s in a)
    return mean, sd


def main() -> None:
    y = np.asarray(nile.FLOW, float)
    fine, log_evidence, edge_weight = posterior(y)
    coarse, coarse_evidence, _ = posterior(y, num=tuple((n + 1) // 2 for n in NUM))
    diff = _differences(fine, coarse)
    if edge_weight > 1e-12 or max(diff) > 1e-6 or abs(log_evidence - coarse_evidence) > 1e-8:
        raise RuntimeError(f"grid not converged: edge weight {edge_weight:.2g}, coarse-grid differences {diff}")
    out = {
        "mean": {s: v[0] for s, v in fine.items()},
        "sd": {s: v[1] for s, v in fine.items()},
        "log_evidence": log_evidence,
        "metadata": {
            "method": "2-D trapezoid over (log obs_sd, log level_sd) of Kalman-filter log p(y | sds) + log priors "
                      "+ log-Jacobian; levels: mixture of RTS-smoother Gaussians",
            "reach": REACH, "num": NUM, "edge_weight": edge_weight,
            "coarse_diff": {"mean_over_sd": diff[0], "sd_relative": diff[1],
                            "log_evidence": abs(log_evidence - coarse_evidence)},
            "obs_scale": OBS_SCALE, "level_scale": LEVEL_SCALE,
            "initial_mean": nile.INITIAL_MEAN, "initial_sd": nile.INITIAL_SD,
        },
    }
    PATH.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
