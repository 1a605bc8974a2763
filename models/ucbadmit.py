"""numpyro's UCBadmit GLMM (``examples/ucbadmit.py``): admissions by department and gender.

v_mu ~ Normal(0, (4, 1)),   sigma ~ HalfNormal(1) (2,),   L_Rho ~ LKJCholesky(2, 2),
z ~ Normal(0, 1) (6, 2),   v = (sigma * L_Rho) @ z.T,
admit_i ~ Binomial(applications_i, logit = v_mu_0 + v_{dept_i, 0} + (v_mu_1 + v_{dept_i, 1}) male_i)

The model is numpyro's, as written (a (6, 2) matrix latent ``z`` without
plates, ``jnp.dot(scale_tril, z.T).T``); the data are the 12 rows of
McElreath's ``UCBadmit`` (Statistical Rethinking), bundled here.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import expit

#: (admitted, rejected) per department A-F, male row first (the data set's order).
_COUNTS = [
    (512, 313), (89, 19), (353, 207), (17, 8), (120, 205), (202, 391),
    (138, 279), (131, 244), (53, 138), (94, 299), (22, 351), (24, 317),
]


def model(dept, male, applications, *, y=None):
    """numpyro's ``glmm`` with the observations as ``y`` (``admit``)."""
    v_mu = numpyro.sample("v_mu", dist.Normal(0, jnp.array([4.0, 1.0])))
    sigma = numpyro.sample("sigma", dist.HalfNormal(jnp.ones(2)))
    L_Rho = numpyro.sample("L_Rho", dist.LKJCholesky(2, concentration=2))
    scale_tril = sigma[..., jnp.newaxis] * L_Rho
    # non-centered parameterization
    num_dept = len(np.unique(dept))
    z = numpyro.sample("z", dist.Normal(jnp.zeros((num_dept, 2)), 1))
    v = jnp.dot(scale_tril, z.T).T
    logits = v_mu[0] + v[dept, 0] + (v_mu[1] + v[dept, 1]) * male
    if y is None:
        probs = expit(logits)
        numpyro.sample("probs", dist.Delta(probs), obs=probs)
    numpyro.sample("admit", dist.Binomial(applications, logits=logits), obs=y)


def data():
    """The 12 rows: department index 0-5, male 0/1, applications, admitted."""
    counts = np.array(_COUNTS)
    dept = np.repeat(np.arange(6), 2)
    male = np.tile(np.array([1.0, 0.0]), 6)
    applications = counts.sum(1)
    return (dept, jnp.asarray(male), jnp.asarray(applications, float)), {"y": jnp.asarray(counts[:, 0], float)}
