"""Make ``tests/data/robust_references.json``: NUTS posteriors of ``tests/robust_models.py``.

Run from the repository root (minutes)::

    python -m tests.data.make_robust_references

Float64, fixed seeds, 4 chains x 2000 draws after 1000 warmup; every stored
component must have split r-hat < 1.01 and bulk ESS > 2000 (the NUTS error of
a mean is then below 0.025 posterior sd), else the script raises.
"""

from __future__ import annotations

import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import MCMC, NUTS

from tests.robust_models import CASES

PATH = pathlib.Path(__file__).with_name("robust_references.json")


def reference(name: str) -> dict:
    model, data, sites = CASES[name]
    args, kwargs = data()
    mcmc = MCMC(NUTS(model, target_accept_prob=0.9), num_warmup=1000, num_samples=2000, num_chains=4,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    out = {"mean": {}, "sd": {}}
    for site in sites:
        x = np.asarray(draws[site])
        rhat = np.max(split_gelman_rubin(x))
        ess = np.min(effective_sample_size(x))
        if rhat > 1.01 or ess < 2000:
            raise RuntimeError(f"{name}/{site}: r-hat {rhat:.4f}, ESS {ess:.0f}")
        flat = x.reshape((-1,) + x.shape[2:])
        out["mean"][site] = flat.mean(0).tolist()
        out["sd"][site] = flat.std(0).tolist()
    return out


def main() -> None:
    table = {name: reference(name) for name in CASES}
    PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
