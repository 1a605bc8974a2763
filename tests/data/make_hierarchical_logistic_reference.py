"""Make ``tests/data/hierarchical_logistic_reference.json``: NUTS on the zoo's hierarchical logistic regression.

Run from the repository root (a minute or two)::

    python -m tests.data.make_hierarchical_logistic_reference

Float64, fixed seed, 4 chains x 5000 draws after 1000 warmup (target
acceptance 0.95); every component must have split r-hat < 1.01 and bulk ESS >
2000 (NUTS error of a mean below 0.025 sd), else the script raises. Stored per site: the mean and sd in the site's
own (constrained) space, and for ``sigma`` also the mean and sd of
``log sigma`` (the space ``Integrated`` lays its grid on).
"""

from __future__ import annotations

import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

from models import hierarchical_logistic  # noqa: E402

PATH = pathlib.Path(__file__).with_name("hierarchical_logistic_reference.json")
SITES = ("mu", "sigma", "alpha", "beta")


def main() -> None:
    args, kwargs = hierarchical_logistic.data()
    mcmc = MCMC(NUTS(hierarchical_logistic.model, target_accept_prob=0.95), num_warmup=1000, num_samples=5000,
                num_chains=4, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    draws["log_sigma"] = np.log(draws["sigma"])
    out = {"mean": {}, "sd": {}, "metadata": {"num_chains": 4, "num_warmup": 1000, "num_samples": 5000}}
    for site in SITES + ("log_sigma",):
        x = np.asarray(draws[site])
        rhat, ess = float(np.max(split_gelman_rubin(x))), float(np.min(effective_sample_size(x)))
        if rhat > 1.01 or ess < 2000:
            raise RuntimeError(f"{site}: r-hat {rhat:.4f}, ESS {ess:.0f}")
        out["metadata"][site] = {"r_hat": rhat, "ess": ess}
        flat = x.reshape((-1,) + x.shape[2:])
        out["mean"][site] = flat.mean(0).tolist()
        out["sd"][site] = flat.std(0).tolist()
    PATH.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
