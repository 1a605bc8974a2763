"""The enumeration tutorial's toy mixture under NonConjugateVI: an index latent, exactly.

Pyro's and NumPyro's enumeration tutorial writes a mixture with the component
label used as an index into a vector of latent locations::

    p ~ Dirichlet(0.5),  scale ~ LogNormal(0, K),  loc_k ~ Normal(0, 10),
    x_n ~ Categorical(p),  y_n ~ Normal(loc[x_n], scale)

(and its two-component form with ``z_n ~ Bernoulli(p)``, ``loc[z_n]``). The
factor of y is exact in loc, p and the labels (enumeration over each label's
categories is symbolic: a finite sum, no sampling) and non-conjugate only in
the scale, whose q is a Gaussian on log(scale) (Gauss-Hermite quadrature).
The reference is the mean-field optimum computed independently: coordinate
ascent with closed-form q(x_n), q(p), q(loc_k) and q(log scale) by BFGS on
its ELBO with 60-node Gauss-Hermite expectations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.optimize import minimize
from scipy.special import digamma, softmax

import blrppl

LOC_SD = 10.0


def categorical_model(data, num_components=3):
    """The tutorial's model as written (``infer={"enumerate": "parallel"}`` on the label)."""
    p = numpyro.sample("p", dist.Dirichlet(0.5 * jnp.ones(num_components)))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, num_components))
    with numpyro.plate("components", num_components):
        loc = numpyro.sample("loc", dist.Normal(0.0, LOC_SD))
    with numpyro.plate("data", len(data)):
        x = numpyro.sample("x", dist.Categorical(p), infer={"enumerate": "parallel"})
        numpyro.sample("obs", dist.Normal(loc[x], scale), obs=data)


def bernoulli_model(data):
    """Two components, the label a Bernoulli used as an index."""
    p = numpyro.sample("p", dist.Beta(0.5, 0.5))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("components", 2):
        loc = numpyro.sample("loc", dist.Normal(0.0, LOC_SD))
    with numpyro.plate("data", len(data)):
        z = numpyro.sample("x", dist.Bernoulli(p), infer={"enumerate": "parallel"})
        numpyro.sample("obs", dist.Normal(loc[z], scale), obs=data)


#: model, the label's name, K, the weights' Dirichlet concentration, the log scale's prior sd.
CASES = {
    "categorical": (categorical_model, 3, 0.5, 3.0),
    "bernoulli": (bernoulli_model, 2, 0.5, 2.0),
}
CENTRES = {"categorical": (-4.0, 0.5, 5.0), "bernoulli": (-2.0, 3.0)}


def data(case):
    rng = np.random.default_rng(5)
    centres = CENTRES[case]
    sizes = (20, 15, 25)[: len(centres)]
    return np.concatenate([rng.normal(c, 1.0, n) for c, n in zip(centres, sizes)])


def mean_field_optimum(y, centres, concentration, log_scale_sd, iterations=300):
    """Coordinate ascent on the mean-field ELBO (q(x_n) q(p) Π_k q(loc_k) q(log scale))."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    weights = weights / weights.sum()
    num = len(centres)
    resp = softmax(-((y[:, None] - np.array(centres)[None]) ** 2), axis=1)  # start near the centres
    m_u, s_u = 0.0, 0.3
    for _ in range(iterations):
        # q(log scale): E_q[e^{-2u}] and the ELBO in (m_u, log s_u) by quadrature.
        def loc_moments(inv_var):
            precision = 1.0 / LOC_SD**2 + inv_var * resp.sum(0)
            return inv_var * (resp * y[:, None]).sum(0) / precision, 1.0 / precision

        def negative_elbo(params, sq):
            m, log_s = params
            u = m + np.exp(log_s) * nodes
            expected = weights @ (-len(y) * u - 0.5 * np.exp(-2 * u) * sq - 0.5 * u**2 / log_scale_sd**2)
            return -(expected + log_s)

        inv_var = weights @ np.exp(-2 * (m_u + s_u * nodes))
        loc_mean, loc_var = loc_moments(inv_var)
        sq = np.sum(resp * ((y[:, None] - loc_mean) ** 2 + loc_var))
        best = minimize(negative_elbo, [m_u, np.log(s_u)], args=(sq,), method="BFGS", options={"gtol": 1e-12})
        m_u, s_u = best.x[0], np.exp(best.x[1])
        inv_var = weights @ np.exp(-2 * (m_u + s_u * nodes))
        loc_mean, loc_var = loc_moments(inv_var)
        alpha = concentration + resp.sum(0)
        log_weight = digamma(alpha) - digamma(alpha.sum())
        log_lik = -m_u - 0.5 * inv_var * ((y[:, None] - loc_mean) ** 2 + loc_var)
        resp = softmax(log_weight + log_lik, axis=1)
    assert len(centres) == num
    return {"loc": (loc_mean, np.sqrt(loc_var)), "log_scale": (m_u, s_u), "alpha": alpha, "resp": resp}


@pytest.fixture(scope="module", params=sorted(CASES))
def fits(request):
    case = request.param
    model, num, concentration, log_scale_sd = CASES[case]
    y = data(case)
    result = blrppl.NonConjugateVI(model).run(
        jax.random.key(0), 600, jnp.asarray(y), progress_bar=False, tol=1e-9
    )
    return case, result, mean_field_optimum(y, CENTRES[case], concentration, log_scale_sd)


def test_index_latent_in_the_mixture_is_enumerated_exactly(fits):
    case, result, reference = fits
    assert result.estimators["obs"] == "exact+quadrature"  # no Monte Carlo anywhere
    assert result.estimators["x"] == "exact" and result.estimators["loc"] == "exact"


def test_mixture_reaches_the_mean_field_optimum(fits):
    case, result, reference = fits
    assert result.converged
    q = result.posterior
    order = np.argsort(np.asarray(q["loc"].mean))  # components are exchangeable: match by location
    ref_order = np.argsort(reference["loc"][0])
    mean, sd = reference["loc"][0][ref_order], reference["loc"][1][ref_order]
    got_mean = np.asarray(q["loc"].mean)[order]
    got_sd = np.sqrt(np.asarray(q["loc"].variance))[order]
    np.testing.assert_array_less(np.abs(got_mean - mean) / sd, 0.05)
    np.testing.assert_array_less(np.abs(got_sd / sd - 1.0), 0.10)
    log_scale = q["scale"].base_dist
    m_u, s_u = reference["log_scale"]
    assert abs(float(log_scale.loc) - m_u) / s_u < 0.05
    assert abs(float(log_scale.scale) / s_u - 1.0) < 0.10
    labels = np.asarray(q["x"].probs) if case == "categorical" else np.asarray(q["x"].probs)[:, None]
    resp = reference["resp"][:, ref_order][:, np.argsort(order)]
    if case == "bernoulli":
        resp = resp[:, 1:]
    np.testing.assert_allclose(labels, resp, atol=0.01)
