"""Make ``tests/data/ucbadmit_reference.json``: NUTS on numpyro's UCBadmit GLMM (``models/ucbadmit.py``).

Run from the repository root (a few minutes)::

    python -m tests.data.make_ucbadmit_reference

Float64, seed 0, 4 chains x 2000 draws after 1000 warmup (target acceptance
0.95: the department effects have a funnel in ``sigma``); every stored
component must have split r-hat < 1.01 and bulk ESS > 1000, else the script
raises. Stored: posterior means and sds of ``v_mu`` and ``sigma``, of
``rho`` = ``L_Rho[1, 0]``, of the department effects ``v`` (6, 2) and of the
12 rows' admission logits.
"""

from __future__ import annotations

import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import MCMC, NUTS

from models import ucbadmit

PATH = pathlib.Path(__file__).with_name("ucbadmit_reference.json")


def department_effects(sigma, L_Rho, z):
    """v = (sigma * L_Rho) @ z.T, transposed, as the model computes it (draws leading)."""
    scale_tril = sigma[..., :, None] * L_Rho
    return jnp.einsum("...ij,...dj->...di", scale_tril, z)


def main() -> None:
    args, kwargs = ucbadmit.data()
    mcmc = MCMC(NUTS(ucbadmit.model, target_accept_prob=0.95), num_warmup=1000, num_samples=2000,
                num_chains=4, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    dept, male, _ = args
    v = department_effects(draws["sigma"], draws["L_Rho"], draws["z"])
    v_mu = draws["v_mu"]
    logits = v_mu[..., :1] + v[..., dept, 0] + (v_mu[..., 1:] + v[..., dept, 1]) * male
    sites = {
        "v_mu": draws["v_mu"],
        "sigma": draws["sigma"],
        "rho": draws["L_Rho"][..., 1, 0],
        "v": v,
        "logits": logits,
    }
    out = {"mean": {}, "sd": {}, "settings": "NUTS(target_accept_prob=0.95), 4 x (1000 + 2000), seed 0, float64"}
    for site, x in sites.items():
        x = np.asarray(x)
        rhat = np.max(split_gelman_rubin(x))
        ess = np.min(effective_sample_size(x))
        if rhat > 1.01 or ess < 1000:
            raise RuntimeError(f"{site}: r-hat {rhat:.4f}, ESS {ess:.0f}")
        flat = x.reshape((-1,) + x.shape[2:])
        out["mean"][site] = flat.mean(0).tolist()
        out["sd"][site] = flat.std(0).tolist()
    PATH.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
