"""Crowdsourced annotation, the multinomial model of Paun et al. (2018), Figure 1.

zeta_k ~ Dirichlet(1)  (per true class k: the annotation distribution),
pi ~ Dirichlet(1),   c_i ~ Categorical(pi),   y_ij ~ Categorical(zeta[c_i])

Written as in numpyro's ``examples/annotation.py`` (items on plate dim -2, so
``c`` has shape (items, 1)); the data are the 45 patients x 7 assessments of
Dawid & Skene (1979), Table 1 (four classes). The posterior is multimodal
(label switching, and an empty class is a local optimum of mean-field q):
engines start it from several points by default.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

ANNOTATIONS = (
    "1111111", "3334334", "1122122", "2223121", "2223222", "2223322", "1222111", "3333433", "2222223",
    "2322223", "4444444", "2223343", "1111111", "2223212", "1211111", "1112111", "1111111", "1111111",
    "2222221", "2221322", "2222222", "2222221", "2223222", "2212222", "1111111", "1111111", "2322222",
    "1111111", "1111111", "1121121", "1111111", "3333233", "1111111", "2222222", "2223232", "4334343",
    "2212232", "2323233", "3333432", "1111111", "1111111", "1212111", "2322222", "1211111", "2222222",
)
"""Dawid & Skene (1979), Table 1: one row per patient, the class each assessment gave (1-4)."""


def model(num_classes=4, shape=(45, 7), *, y=None):
    """The multinomial annotation model (numpyro's examples/annotation.py ``multinomial``).

    ``y``: the (items, positions) array of annotated classes (None to simulate
    an array of ``shape``).
    """
    num_items, num_positions = shape if y is None else y.shape
    with numpyro.plate("class", num_classes):
        zeta = numpyro.sample("zeta", dist.Dirichlet(jnp.ones(num_classes)))
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.ones(num_classes)))
    with numpyro.plate("item", num_items, dim=-2):
        c = numpyro.sample("c", dist.Categorical(pi))
        with numpyro.plate("position", num_positions):
            numpyro.sample("y", dist.Categorical(zeta[c]), obs=y)


def data():
    """The 45 x 7 annotations, classes 0-3."""
    annotations = np.array([[int(ch) - 1 for ch in row] for row in ANNOTATIONS])
    return (int(np.max(annotations)) + 1,), {"y": annotations}
