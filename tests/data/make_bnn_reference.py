"""Make ``tests/data/bnn_reference.json``: long-run NUTS and an Adam MAP on the zoo's Bayesian neural network.

Run from the repository root (about 15 minutes on 2 CPU cores)::

    python -m tests.data.make_bnn_reference [--num-warmup 1000] [--num-samples 1000] [--num-chains 2]

Float64, ``models.bnn`` with D_H = 50 on its N = 50 training points. NUTS
(numpyro's defaults, chains run sequentially, seed 0) gives the held-out log
predictive density per point on ``bnn.held_out()``::

    lpd = mean_i log mean_s Normal(y_i | f_s(x_i), 1 / sqrt(prec_obs_s)),

overall and per chain (the posterior is multimodal; chains may disagree),
with the same on the training set, prec_obs's mean, sd and split r-hat, the
divergences and the numbers of leapfrog steps. The baseline is a true MAP in
the constrained space (log p(y, w, prec_obs), no log-Jacobian; optimised over
w and log prec_obs) by full-batch Adam from NUTS's default initialisation
(uniform(-2, 2) in the unconstrained space, seed 1), scored by the plug-in
predictive Normal(y | f_MAP(x), 1 / sqrt(prec_MAP)).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import optax  # noqa: E402
from jax.scipy.special import logsumexp  # noqa: E402
from jax.scipy.stats import norm  # noqa: E402
from numpyro.diagnostics import split_gelman_rubin  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.infer.util import initialize_model, log_density  # noqa: E402

from models import bnn  # noqa: E402

PATH = pathlib.Path(__file__).with_name("bnn_reference.json")
D_H = 50
MAP_STEPS, MAP_LR = 20000, 1e-2


def forward(X: jax.Array, w1: jax.Array, w2: jax.Array, w3: jax.Array) -> jax.Array:
    """The network's mean output, shape (N,) (the model's ``z3`` without the trailing axis)."""
    return (jnp.tanh(jnp.tanh(X @ w1) @ w2) @ w3)[:, 0]


def lpd(draws: dict[str, jax.Array], X: jax.Array, y: jax.Array) -> float:
    """Mean over points of log mean over draws of the Normal predictive density."""
    f = jax.vmap(forward, in_axes=(None, 0, 0, 0))(X, draws["w1"], draws["w2"], draws["w3"])  # (S, N)
    sd = 1.0 / jnp.sqrt(draws["prec_obs"])[:, None]
    logp = norm.logpdf(y[None, :, 0], f, sd)
    return float(jnp.mean(logsumexp(logp, axis=0) - jnp.log(logp.shape[0])))


def adam_map(X: jax.Array, y: jax.Array) -> tuple[dict[str, jax.Array], list[float]]:
    """MAP of (w, prec_obs), optimised over (w, log prec_obs); returns it and the loss every 1000 steps."""
    z0 = initialize_model(jax.random.key(1), bnn.model, model_args=(X, D_H), model_kwargs={"y": y})[0].z

    def loss(z: dict[str, jax.Array]) -> jax.Array:
        params = {**z, "prec_obs": jnp.exp(z["prec_obs"])}
        return -log_density(bnn.model, (X, D_H), {"y": y}, params)[0]

    opt = optax.adam(MAP_LR)

    def step(carry, _):
        z, state = carry
        value, grad = jax.value_and_grad(loss)(z)
        updates, state = opt.update(grad, state)
        return (optax.apply_updates(z, updates), state), value

    (z, _), losses = jax.jit(lambda z: jax.lax.scan(step, (z, opt.init(z)), None, MAP_STEPS))(z0)
    return {**z, "prec_obs": jnp.exp(z["prec_obs"])}, [float(v) for v in losses[999::1000]]


def main(num_warmup: int, num_samples: int, num_chains: int) -> None:
    (X,), kwargs = bnn.data()
    y = kwargs["y"]
    X_test, y_test = bnn.held_out()

    mcmc = MCMC(NUTS(bnn.model), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(0), X, D_H, y=y, extra_fields=("diverging", "num_steps"))
    wall = time.perf_counter() - start
    by_chain = mcmc.get_samples(group_by_chain=True)
    draws = mcmc.get_samples()
    extra = mcmc.get_extra_fields(group_by_chain=True)
    prec = np.asarray(by_chain["prec_obs"])
    steps = np.asarray(extra["num_steps"])

    w_map, losses = adam_map(X, y)
    map_draw = jax.tree.map(lambda v: v[None], w_map)

    out = {
        "nuts": {
            "lpd_test": lpd(draws, X_test, y_test),
            "lpd_test_per_chain": [lpd(jax.tree.map(lambda v: v[c], by_chain), X_test, y_test)
                                   for c in range(num_chains)],
            "lpd_train": lpd(draws, X, y),
            "prec_obs_mean": float(prec.mean()),
            "prec_obs_sd": float(prec.std()),
            "prec_obs_mean_per_chain": prec.mean(1).tolist(),
            "prec_obs_r_hat": float(split_gelman_rubin(prec)),
            "divergences_per_chain": np.asarray(extra["diverging"]).sum(1).tolist(),
            "num_steps_mean_per_chain": steps.mean(1).tolist(),
            "num_steps_max": int(steps.max()),
            "wall_time_s": wall,
        },
        "adam_map": {
            "lpd_test": lpd(map_draw, X_test, y_test),
            "lpd_train": lpd(map_draw, X, y),
            "prec_obs": float(w_map["prec_obs"]),
            "neg_log_joint_every_1000_steps": losses,
        },
        "metadata": {
            "D_H": D_H, "N_train": int(X.shape[0]), "N_test": int(X_test.shape[0]),
            "num_warmup": num_warmup, "num_samples": num_samples, "num_chains": num_chains,
            "chain_method": "sequential", "target_accept_prob": 0.8, "nuts_seed": 0,
            "map": {"optimizer": "optax.adam", "lr": MAP_LR, "steps": MAP_STEPS, "seed": 1,
                    "init": "numpyro init_to_uniform (unconstrained)",
                    "objective": "log p(y, w, prec_obs) in the constrained space (no log-Jacobian)"},
            "numpyro": numpyro.__version__, "jax": jax.__version__, "optax": optax.__version__,
            "x64": True, "platform": jax.devices()[0].platform,
        },
    }
    PATH.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-warmup", type=int, default=1000)
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--num-chains", type=int, default=2)
    main(**vars(parser.parse_args()))
