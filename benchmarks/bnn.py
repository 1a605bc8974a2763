"""Issue 18: numpyro's Bayesian neural network (50 tanh units) by the deep-learning rows, NUTS and Adam MAP.

Data: ``models/bnn.py`` (numpyro's ``get_data``: N = 50, noise sd 0.05),
held-out points from ``bnn.held_out()``. NUTS (2 chains x 1000 + 1000) and
the Adam MAP are read from ``tests/data/bnn_reference.json`` (made by
``tests/data/make_bnn_reference.py``, their times measured there). Measured
here, in one process: blrppl ``DiagonalBLR`` (IVON and VOGN rows), the
first call (tracing and compilation included) and a second call (compiled),
and numpyro's own mean-field SVI (``AutoNormal`` + Adam, the same q family)
for comparison. Score: held-out log predictive density per point,
mean_i log mean_s N(y_i | f_s(x_i), 1 / sqrt(prec_s)), from 2000 draws of q.

    python -m benchmarks.bnn [--steps 30000]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.special import logsumexp
from numpyro.infer import SVI as NumPyroSVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

jax.config.update("jax_enable_x64", True)

from blrppl.engines.diagonal import DiagonalBLR  # noqa: E402
from models import bnn  # noqa: E402

REFERENCE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "bnn_reference.json"


def lpd(draws: dict, X: np.ndarray, y: np.ndarray) -> float:
    """Held-out log predictive density per point of a set of draws."""
    f = jnp.tanh(jnp.tanh(X @ draws["w1"]) @ draws["w2"]) @ draws["w3"]
    sd = 1.0 / jnp.sqrt(draws["prec_obs"])[:, None, None]
    lp = jax.scipy.stats.norm.logpdf(y, f, sd)[..., 0]
    return float(jnp.mean(logsumexp(lp, 0) - jnp.log(lp.shape[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30_000)
    args = parser.parse_args()
    (X,), kwargs = bnn.data()
    X_test, y_test = bnn.held_out()
    reference = json.loads(REFERENCE.read_text())
    nuts, map_ = reference["nuts"], reference["adam_map"]
    print(f"NUTS (reference): held-out lpd {nuts['lpd_test']:.3f}, {nuts['wall_time_s']:.0f} s")
    print(f"Adam MAP (reference): held-out lpd {map_['lpd_test']:.3f}")
    for rule in ("ivon", "vogn"):
        engine = DiagonalBLR(bnn.model, rule=rule, beta2=0.999)
        times = []
        for seed in (0, 1):
            start = time.perf_counter()
            result = engine.run(jax.random.key(seed), args.steps, X, **kwargs)
            jax.block_until_ready(result.state)
            times.append(time.perf_counter() - start)
        score = lpd(result.sample(jax.random.key(2), 2000), X_test, y_test)
        print(
            f"blrppl {rule}: held-out lpd {score:.3f} ({score - nuts['lpd_test']:+.3f} vs NUTS, "
            f"{score - map_['lpd_test']:+.3f} vs MAP); first call {times[0]:.1f} s, second {times[1]:.1f} s "
            f"({nuts['wall_time_s'] / times[1]:.0f}x faster than NUTS); flags: {len(result.flags)}"
        )
        for flag in result.flags:
            print("   -", flag[:160])
    guide = AutoNormal(bnn.model)
    svi = NumPyroSVI(bnn.model, guide, optax.adam(1e-2), Trace_ELBO())
    start = time.perf_counter()
    fit = svi.run(jax.random.key(0), args.steps, X, progress_bar=False, **kwargs)
    elapsed = time.perf_counter() - start
    draws = guide.sample_posterior(jax.random.key(2), fit.params, sample_shape=(2000,))
    print(f"numpyro AutoNormal + Adam(1e-2): held-out lpd {lpd(draws, X_test, y_test):.3f}; {elapsed:.1f} s")


if __name__ == "__main__":
    main()
