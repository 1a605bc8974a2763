"""Run in a subprocess with forced host devices: fits on 1, 2, 4 devices, and the step's collectives.

``python tests/sharding_check.py CASE [CASE ...]`` prints one JSON line per case:
the largest relative difference of the natural parameters on k sharded devices
from the unsharded fit, the shardings of the plan's per-observation arrays, and
the collectives in the compiled step on the largest mesh. XLA_FLAGS must be set
before jax is imported, hence a separate process.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

jax.config.update("jax_enable_x64", True)

import blrppl  # noqa: E402

N, D, M = 400, 3, 40


def linear(X, y):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, 0.5), obs=y)


def logistic_full(X, y):
    """Full data without indexing: ``y[jnp.arange(N)]`` would gather a sharded y onto every device."""
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def logistic(X, y, batch_size=None):
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ beta), obs=y[idx])


def cases():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    w = np.array([0.5, -0.3, 0.2])
    y_binary = (rng.random(N) < 1.0 / (1.0 + np.exp(-X @ w))).astype(float)
    y_linear = X @ w + 0.5 * rng.normal(size=N)
    X, y_binary, y_linear = jnp.asarray(X), jnp.asarray(y_binary), jnp.asarray(y_linear)
    return {
        "conjugate": (blrppl.ConjugateBayes(linear), 1, (X, y_linear), ()),
        "glm": (blrppl.NonConjugateVI(logistic_full), 20, (X, y_binary), ()),
        "svi": (blrppl.SVI(logistic, estimator="auto"), 20, (X, y_binary), (M,)),
    }


def flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def check(name, devices):
    engine, steps, data, extra = cases()[name]
    key = jax.random.PRNGKey(0)
    reference = flat(engine.run(key, steps, *data, *extra, progress_bar=False).natural_params)
    out = {"case": name, "diff": {}, "row_shardings": {}}
    for k in devices:
        sharded = blrppl.shard(data, blrppl.sharding.data_mesh(jax.devices()[:k]))
        lam = flat(engine.run(key, steps, *sharded, *extra, progress_bar=False).natural_params)
        out["diff"][k] = float(np.max(np.abs(lam - reference) / (1.0 + np.abs(reference))))
        plan = engine.plan(*sharded, *extra)
        rows = [x for x in jax.tree.leaves(plan.arrays) if np.ndim(x) and np.shape(x)[0] == N]
        out["row_shardings"][k] = sorted({str(x.sharding.spec) for x in rows})
    algorithm = engine.build(plan)
    state = algorithm.init(key, plan.arrays)
    compiled = jax.jit(algorithm.step).lower(state, plan.arrays).compile()
    hlo = compiled.as_text()
    out["all_gather"] = [line.strip()[:200] for line in hlo.splitlines() if "all-gather" in line and "=" in line]
    out["all_reduce"] = sum(1 for line in hlo.splitlines() if " all-reduce(" in line or "all-reduce-start(" in line)
    out["input_shardings"] = sorted({str(s) for s in jax.tree.leaves(compiled.input_shardings[0][1])})
    return out


if __name__ == "__main__":
    devices = [int(k) for k in os.environ.get("SHARD_DEVICES", "2,4").split(",")]
    for name in sys.argv[1:]:
        print(json.dumps(check(name, devices)), flush=True)
