"""Every zoo model traces to exactly the graph it should (one table row per model)."""

import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import networkx as nx
import pytest
from numpyro import handlers

import blrppl
from models import ZOO


class Expected(NamedTuple):
    variables: dict  # name -> (family, shape, plates)
    factors: dict  # name -> (kind, neighbours, plates)
    deterministics: dict = {}  # name -> neighbours
    plates: dict = {}  # name -> (size, subsample_size)
    transformed: frozenset = frozenset()  # variables with a Gaussian on an unconstrained space
    chains: dict = {}  # variable -> (sites, length, kind)


EXPECTED = {
    "beta_bernoulli": Expected(
        variables={"p": ("Beta", (), ())},
        factors={"p": ("prior", ("p",), ()), "y": ("likelihood", ("p",), ("N",))},
        plates={"N": (20, 20)},
    ),
    "gamma_poisson": Expected(
        variables={"lam": ("Gamma", (), ())},
        factors={"lam": ("prior", ("lam",), ()), "y": ("likelihood", ("lam",), ("N",))},
        plates={"N": (30, 30)},
    ),
    "normal_mean_precision": Expected(
        variables={"mu": ("Normal", (), ()), "tau": ("Gamma", (), ())},
        factors={
            "mu": ("prior", ("mu",), ()),
            "tau": ("prior", ("tau",), ()),
            "y": ("likelihood", ("mu", "tau"), ("N",)),
        },
        plates={"N": (50, 50)},
    ),
    "linear_regression": Expected(
        variables={
            "alpha": ("Normal", (), ()),
            "beta": ("MultivariateNormal", (3,), ()),
            "tau": ("Gamma", (), ()),
        },
        factors={
            "alpha": ("prior", ("alpha",), ()),
            "beta": ("prior", ("beta",), ()),
            "tau": ("prior", ("tau",), ()),
            "y": ("likelihood", ("alpha", "beta", "tau"), ("N",)),
        },
        plates={"N": (100, 100)},
    ),
    "gaussian_mixture": Expected(
        variables={
            "weights": ("Dirichlet", (3,), ()),
            "mu": ("Normal", (3,), ("K",)),
            "tau": ("Gamma", (3,), ("K",)),
            "z": ("Categorical", (90,), ("N",)),
        },
        factors={
            "weights": ("prior", ("weights",), ()),
            "mu": ("prior", ("mu",), ("K",)),
            "tau": ("prior", ("tau",), ("K",)),
            "z": ("prior", ("z", "weights"), ("N",)),
            "y": ("likelihood", ("mu", "tau", "z"), ("N",)),
        },
        plates={"K": (3, 3), "N": (90, 90)},
    ),
    "hmm": Expected(
        variables={
            "trans": ("Dirichlet", (2, 2), ("K",)),
            "mu": ("Normal", (2,), ("K",)),
            "tau": ("Gamma", (2,), ("K",)),
            "z": ("ChainCategorical", (61,), ()),
        },
        factors={
            "trans": ("prior", ("trans",), ("K",)),
            "mu": ("prior", ("mu",), ("K",)),
            "tau": ("prior", ("tau",), ("K",)),
            "z0": ("prior", ("z",), ()),
            "z": ("prior", ("z", "trans"), ()),
            "y": ("likelihood", ("mu", "tau", "z"), ()),
        },
        plates={"K": (2, 2)},
        chains={"z": (("z0", "z"), 61, "scan")},
    ),
    "annotation": Expected(
        variables={
            "zeta": ("Dirichlet", (4, 4), ("class",)),
            "pi": ("Dirichlet", (4,), ()),
            "c": ("Categorical", (45, 1), ("item",)),
        },
        factors={
            "zeta": ("prior", ("zeta",), ("class",)),
            "pi": ("prior", ("pi",), ()),
            "c": ("prior", ("c", "pi"), ("item",)),
            "y": ("likelihood", ("zeta", "c"), ("item", "position")),
        },
        plates={"class": (4, 4), "item": (45, 45), "position": (7, 7)},
    ),
    "hmm_sequences": Expected(
        variables={
            "trans": ("Dirichlet", (2, 2), ("K",)),
            "mu": ("Normal", (2,), ("K",)),
            "tau": ("Gamma", (2,), ("K",)),
            "z": ("ChainCategorical", (12, 31), ("sequences",)),
        },
        factors={
            "trans": ("prior", ("trans",), ("K",)),
            "mu": ("prior", ("mu",), ("K",)),
            "tau": ("prior", ("tau",), ("K",)),
            "z0": ("prior", ("z",), ("sequences",)),
            "z": ("prior", ("z", "trans"), ("sequences",)),
            "y": ("likelihood", ("mu", "tau", "z"), ("sequences",)),
        },
        plates={"K": (2, 2), "sequences": (12, 12)},
        chains={"z": (("z0", "z"), 31, "scan")},
    ),
    "hmm_enum": Expected(
        variables={
            "probs_x": ("Dirichlet", (3, 3), ()),
            "probs_y": ("Beta", (3, 4), ()),
            "x": ("ChainCategorical", (8, 1, 24), ("sequences",)),
        },
        factors={
            "probs_x": ("prior", ("probs_x",), ()),
            "probs_y": ("prior", ("probs_y",), ()),
            "x": ("prior", ("x", "probs_x"), ("sequences",)),
            "y": ("likelihood", ("probs_y", "x"), ("sequences", "tones")),
        },
        plates={"sequences": (8, 8), "tones": (4, 4)},
        chains={"x": (("x",), 24, "scan")},
    ),
    "hmm_markov": Expected(
        variables={
            "trans": ("Dirichlet", (2, 2), ("K",)),
            "mu": ("Normal", (2,), ("K",)),
            "tau": ("Gamma", (2,), ("K",)),
            "z_0": ("ChainCategorical", (5, 11), ("sequences",)),
        },
        factors={
            "trans": ("prior", ("trans",), ("K",)),
            "mu": ("prior", ("mu",), ("K",)),
            "tau": ("prior", ("tau",), ("K",)),
            "z_0": ("prior", ("z_0",), ("sequences",)),
            # The loop's steps: one factor per kind of step (sites z_1..z_10 and y_0..y_9).
            "z_1": ("prior", ("z_0", "trans"), ("sequences",)),
            "y_0": ("likelihood", ("mu", "tau", "z_0"), ("sequences",)),
        },
        plates={"K": (2, 2), "sequences": (5, 5)},
        chains={"z_0": (tuple(f"z_{t}" for t in range(11)), 11, "markov")},
    ),
    "eight_schools_centered": Expected(
        variables={
            "mu": ("Normal", (), ()),
            "tau": ("Normal", (), ()),
            "theta": ("Normal", (8,), ("J",)),
        },
        factors={
            "mu": ("prior", ("mu",), ()),
            "tau": ("prior", ("tau",), ()),
            "theta": ("prior", ("theta", "mu", "tau"), ("J",)),
            "y": ("likelihood", ("theta",), ("J",)),
        },
        plates={"J": (8, 8)},
        transformed=frozenset({"tau"}),
    ),
    "eight_schools_noncentered": Expected(
        variables={
            "mu": ("Normal", (), ()),
            "tau": ("Normal", (), ()),
            "theta_raw": ("Normal", (8,), ("J",)),
        },
        factors={
            "mu": ("prior", ("mu",), ()),
            "tau": ("prior", ("tau",), ()),
            "theta_raw": ("prior", ("theta_raw",), ("J",)),
            "y": ("likelihood", ("mu", "tau", "theta_raw"), ("J",)),
        },
        deterministics={"theta": ("mu", "tau", "theta_raw")},
        plates={"J": (8, 8)},
        transformed=frozenset({"tau"}),
    ),
    "local_level_sequences": Expected(
        variables={
            "prec_level": ("Gamma", (), ()),
            "prec_obs": ("Gamma", (), ()),
            "level": ("ChainGaussian", (6, 40), ("series",)),
        },
        factors={
            "prec_level": ("prior", ("prec_level",), ()),
            "prec_obs": ("prior", ("prec_obs",), ()),
            "level": ("prior", ("level", "prec_level"), ("series",)),
            "y": ("likelihood", ("prec_obs", "level"), ("series",)),
        },
        plates={"series": (6, 6)},
        chains={"level": (("level",), 40, "GaussianRandomWalk")},
    ),
    "local_level_in_scan": Expected(
        variables={
            "prec_obs": ("Gamma", (), ()),
            "prec_level": ("Gamma", (), ()),
            "level": ("ChainGaussian", (100,), ()),
        },
        factors={
            "prec_obs": ("prior", ("prec_obs",), ()),
            "prec_level": ("prior", ("prec_level",), ()),
            "level": ("prior", ("level", "prec_level"), ()),
            "y": ("likelihood", ("prec_obs", "level"), ()),
        },
        chains={"level": (("level",), 100, "scan")},
    ),
    "radon": Expected(
        variables={
            "mu_alpha": ("Normal", (), ()),
            "sigma_alpha": ("Normal", (), ()),
            "alpha": ("Normal", (85,), ("county",)),
            "beta": ("Normal", (), ()),
            "sigma_y": ("Normal", (), ()),
        },
        factors={
            "mu_alpha": ("prior", ("mu_alpha",), ()),
            "sigma_alpha": ("prior", ("sigma_alpha",), ()),
            "alpha": ("prior", ("alpha", "mu_alpha", "sigma_alpha"), ("county",)),
            "beta": ("prior", ("beta",), ()),
            "sigma_y": ("prior", ("sigma_y",), ()),
            "y": ("likelihood", ("alpha", "beta", "sigma_y"), ("N",)),
        },
        plates={"county": (85, 85), "N": (919, 919)},
        transformed=frozenset({"sigma_alpha", "sigma_y"}),
    ),
    "local_level_grw": Expected(
        variables={
            "sigma_level": ("Normal", (), ()),
            "sigma_obs": ("Normal", (), ()),
            "level": ("ChainGaussian", (50,), ()),
        },
        factors={
            "sigma_level": ("prior", ("sigma_level",), ()),
            "sigma_obs": ("prior", ("sigma_obs",), ()),
            "level": ("prior", ("level", "sigma_level"), ()),
            "y": ("likelihood", ("sigma_obs", "level"), ("time",)),
        },
        plates={"time": (50, 50)},
        transformed=frozenset({"sigma_level", "sigma_obs"}),
        chains={"level": (("level",), 50, "GaussianRandomWalk")},
    ),
    "local_level_scan": Expected(
        variables={
            "level": ("ChainGaussian", (51,), ()),
            "sigma_level": ("Normal", (), ()),
            "sigma_obs": ("Normal", (), ()),
        },
        factors={
            "level0": ("prior", ("level",), ()),
            "sigma_level": ("prior", ("sigma_level",), ()),
            "sigma_obs": ("prior", ("sigma_obs",), ()),
            "level": ("prior", ("level", "sigma_level"), ()),
            "y": ("likelihood", ("level", "sigma_obs"), ()),
        },
        transformed=frozenset({"sigma_level", "sigma_obs"}),
        chains={"level": (("level0", "level"), 51, "scan")},
    ),
    "nile": Expected(
        variables={"level": ("ChainGaussian", (101,), ())},
        factors={
            "level0": ("prior", ("level",), ()),
            "level": ("prior", ("level",), ()),
            "y": ("likelihood", ("level",), ()),
        },
        chains={"level": (("level0", "level"), 101, "scan")},
    ),
    "local_linear_trend": Expected(
        variables={"state": ("ChainGaussian", (81, 2), ())},
        factors={
            "state0": ("prior", ("state",), ()),
            "state": ("prior", ("state",), ()),
            "y": ("likelihood", ("state",), ()),
        },
        chains={"state": (("state0", "state"), 81, "scan")},
    ),
    "ar1": Expected(
        variables={"x": ("ChainGaussian", (201,), ())},
        factors={
            "x0": ("prior", ("x",), ()),
            "x": ("prior", ("x",), ()),
            "y": ("likelihood", ("x",), ()),
        },
        chains={"x": (("x0", "x"), 201, "scan")},
    ),
    "linear_gaussian_ssm": Expected(
        variables={"x": ("ChainGaussian", (60, 2), ())},
        factors={"x": ("prior", ("x",), ()), "y": ("likelihood", ("x",), ("time",))},
        plates={"time": (60, 60)},
        chains={"x": (("x",), 60, "GaussianStateSpace")},
    ),
    "stochastic_volatility": Expected(
        variables={"h": ("ChainGaussian", (61,), ())},
        factors={
            "h0": ("prior", ("h",), ()),
            "h": ("prior", ("h",), ()),
            "y": ("likelihood", ("h",), ()),
        },
        chains={"h": (("h0", "h"), 61, "scan")},
    ),
    "logistic_regression": Expected(
        variables={"beta": ("MultivariateNormal", (3,), ())},
        factors={"beta": ("prior", ("beta",), ()), "y": ("likelihood", ("beta",), ("N",))},
        plates={"N": (200, 200)},
    ),
    "poisson_regression": Expected(
        variables={"beta": ("MultivariateNormal", (3,), ())},
        factors={"beta": ("prior", ("beta",), ()), "y": ("likelihood", ("beta",), ("N",))},
        plates={"N": (150, 150)},
    ),
    "multivariate_regression": Expected(
        variables={"W": ("Normal", (6, 2), ())},
        factors={"W": ("prior", ("W",), ()), "y": ("likelihood", ("W",), ("N",))},
        plates={"N": (30, 30)},
    ),
    "baseball": Expected(
        variables={"phi": ("Beta", (18,), ("num_players",))},
        factors={"phi": ("prior", ("phi",), ("num_players",)), "y": ("likelihood", ("phi",), ("num_players",))},
        plates={"num_players": (18, 18)},
    ),
    "log_mix": Expected(
        variables={
            "theta": ("Beta", (), ()),
            "mu": ("MultivariateNormal", (2,), ()),
            "z": ("Categorical", (40,), ("N",)),
        },
        factors={
            "theta": ("prior", ("theta",), ()),
            "mu": ("prior", ("mu",), ()),
            "z": ("prior", ("z", "theta"), ("N",)),
            "y": ("likelihood", ("mu", "z"), ("N",)),
        },
        plates={"N": (40, 40)},
    ),
    "ucbadmit": Expected(
        variables={
            "v_mu": ("Normal", (2,), ()),
            "sigma": ("Normal", (2,), ()),
            "L_Rho": ("MultivariateNormal", (2, 2), ()),
            "z": ("Normal", (6, 2), ()),
        },
        factors={
            "v_mu": ("prior", ("v_mu",), ()),
            "sigma": ("prior", ("sigma",), ()),
            "L_Rho": ("prior", ("L_Rho",), ()),
            "z": ("prior", ("z",), ()),
            "admit": ("likelihood", ("v_mu", "sigma", "L_Rho", "z"), ()),
        },
        transformed=frozenset({"sigma", "L_Rho"}),
    ),
    "gp": Expected(
        variables={
            "kernel_var": ("Normal", (), ()),
            "kernel_noise": ("Normal", (), ()),
            "kernel_length": ("Normal", (), ()),
        },
        factors={
            "kernel_var": ("prior", ("kernel_var",), ()),
            "kernel_noise": ("prior", ("kernel_noise",), ()),
            "kernel_length": ("prior", ("kernel_length",), ()),
            "y": ("likelihood", ("kernel_var", "kernel_noise", "kernel_length"), ()),
        },
        transformed=frozenset({"kernel_var", "kernel_noise", "kernel_length"}),
    ),
}


def test_every_zoo_model_has_an_expected_graph():
    assert set(EXPECTED) == set(ZOO)
    assert len(ZOO) >= 12


class _Graphs(dict):
    """Each zoo model's graph, traced when a test first asks for it: under xdist the tests of
    this module are spread over workers, and each traced all 29 models (30 s) before."""

    def __missing__(self, name):
        entry = ZOO[name]
        args, kwargs = entry.data()
        self[name] = blrppl.trace(entry.model, *args, **kwargs)
        return self[name]


@pytest.fixture(scope="module")
def graphs():
    return _Graphs()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_graph(name, graphs):
    fg, expected = graphs[name], EXPECTED[name]
    assert isinstance(fg, blrppl.FactorGraph)
    actual_variables = {n: (v.family, v.shape, v.plates) for n, v in fg.variables.items()}
    assert actual_variables == expected.variables
    assert list(fg.variables) == list(expected.variables)  # trace order
    actual_factors = {n: (f.kind, f.neighbours, f.plates) for n, f in fg.factors.items()}
    assert actual_factors == expected.factors
    assert {n: d.neighbours for n, d in fg.deterministics.items()} == expected.deterministics
    assert {n: (p.size, p.subsample_size) for n, p in fg.plates.items()} == expected.plates
    assert {n for n, v in fg.variables.items() if v.transform is not None} == expected.transformed
    chains = {
        n: (v.chain.sites, v.chain.length, v.chain.kind) for n, v in fg.variables.items() if v.chain
    }
    assert chains == expected.chains
    for f in fg.factors.values():
        assert set(f.edges) == set(f.neighbours)
        for edge in f.edges.values():
            assert edge.conjugate in (True, False, None)
            assert edge.conjugate is True or edge.reason  # a verdict other than True says why
        assert f.observed == (f.kind == "likelihood")
    verdicts = {e.conjugate for f in fg.factors.values() for e in f.edges.values()}
    if name in FULLY_CONJUGATE:
        assert verdicts == {True}
    elif name in HAS_NON_CONJUGATE:
        assert False in verdicts


FULLY_CONJUGATE = {
    "beta_bernoulli", "gamma_poisson", "normal_mean_precision", "linear_regression", "gaussian_mixture",
    "nile", "local_linear_trend", "ar1", "linear_gaussian_ssm", "multivariate_regression", "baseball", "log_mix",
    "hmm_sequences", "hmm_enum", "hmm_markov", "local_level_sequences", "local_level_in_scan",
}
HAS_NON_CONJUGATE = {
    "eight_schools_centered", "eight_schools_noncentered", "radon", "logistic_regression", "poisson_regression",
    "stochastic_volatility", "gp", "ucbadmit",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_networkx(name, graphs):
    fg = graphs[name]
    g = fg.to_networkx()
    assert nx.is_bipartite(g)
    variables = {("variable", n) for n in fg.variables}
    factors = {("factor", n) for n in fg.factors}
    assert set(g.nodes) == variables | factors
    for key, data in g.nodes(data=True):
        assert data["kind"] == key[0] and data["name"] == key[1]
        assert {"shape", "plates", "observed"} <= set(data)
        if key[0] == "variable":
            assert data["family"] == fg.variables[key[1]].family
    for u, v, data in g.edges(data=True):
        assert {u[0], v[0]} == {"variable", "factor"}
        assert set(data) >= {"conjugate", "reason"}
    expected_edges = {
        frozenset({("factor", f), ("variable", v)})
        for f, node in fg.factors.items()
        for v in node.neighbours
    }
    assert {frozenset(e) for e in g.edges} == expected_edges


# numpyro's UCBadmit model, kept as numpyro writes it, names its observation
# ``admit`` and records ``probs`` as an observed Delta when ``y`` is None.
WRITTEN_BY_OTHERS = {"ucbadmit"}


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - WRITTEN_BY_OTHERS))
def test_zoo_model_predicts_without_data(name):
    """``y=None`` makes every zoo model generative (used for prediction)."""
    entry = ZOO[name]
    args, kwargs = entry.data()
    y = kwargs.pop("y")
    parameters = set(inspect.signature(entry.model).parameters)
    for key in {"num_obs", "num_steps"} & parameters:
        kwargs[key] = y.shape[0]
    for key in {"num_sequences"} & parameters:  # time-major sequences (T, N)
        kwargs[key] = y.shape[1]
    observed = []

    def simulate():
        # Traced abstractly (jax.eval_shape): no sampler is compiled.
        with handlers.seed(rng_seed=0), handlers.trace() as tr:
            entry.model(*args, **kwargs)
        observed.extend(n for n, s in tr.items() if s["type"] == "sample" and s["is_observed"])
        if "y" in tr:
            return tr["y"]["value"]
        return jnp.stack([tr[f"y_{t}"]["value"] for t in range(y.shape[0])])  # a Python loop's steps

    assert jax.eval_shape(simulate).shape == y.shape
    assert observed == []
