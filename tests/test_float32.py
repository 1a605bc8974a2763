"""Float32 stability: the same fits in a float32 process stay finite and close."""

import json

import jax
import numpy as np

import blrppl
from models import ZOO
from tests.float32 import run_in_float32

SCRIPT = """
import json, jax, numpy as np
import blrppl
from models import ZOO
out = {}
for name in ["normal_mean_precision", "gaussian_mixture", "beta_bernoulli", "linear_regression"]:
    entry = ZOO[name]
    args, kwargs = entry.data()
    result = blrppl.VMP(entry.model).run(jax.random.key(0), 80, *args, progress_bar=False, **kwargs)
    leaves = jax.tree.leaves(result.natural_params)
    out[name] = {
        "elbo": float(result.elbo[-1]),
        "finite": bool(all(np.all(np.isfinite(np.asarray(x))) for x in leaves) and np.all(np.isfinite(np.asarray(result.elbo)))),
        "dtypes": sorted({str(x.dtype) for x in leaves}),
    }
print(json.dumps(out))
"""


def test_vmp_in_float32_is_finite_and_close_to_float64():
    out = json.loads(run_in_float32(SCRIPT).strip().splitlines()[-1])
    for name, got in out.items():
        entry = ZOO[name]
        args, kwargs = entry.data()
        reference = blrppl.VMP(entry.model).run(jax.random.key(0), 80, *args, progress_bar=False, **kwargs)
        assert got["finite"], name
        assert got["dtypes"] == ["float32"], (name, got["dtypes"])
        np.testing.assert_allclose(got["elbo"], float(reference.elbo[-1]), rtol=1e-4, err_msg=name)
