"""A zoo of ready NumPyro models with small bundled or generated data.

``ZOO[name]`` is a :class:`ZooModel`: ``model`` is an ordinary NumPyro model
(observations are the keyword argument ``y=None``, so the model also predicts)
and ``data()`` returns ``(model_args, model_kwargs)`` from a fixed seed::

    from models import ZOO
    m = ZOO["eight_schools_centered"]
    args, kwargs = m.data()
    fg = blrppl.trace(m.model, *args, **kwargs)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from models import (
    annotation,
    ar1,
    baseball,
    beta_bernoulli,
    eight_schools_centered,
    eight_schools_noncentered,
    gamma_poisson,
    gaussian_mixture,
    gp,
    hmm,
    hmm_enum,
    hmm_markov,
    hmm_sequences,
    linear_gaussian_ssm,
    linear_regression,
    local_level_grw,
    local_level_in_scan,
    local_level_scan,
    local_level_sequences,
    local_linear_trend,
    log_mix,
    logistic_regression,
    multivariate_regression,
    nile,
    normal_mean_precision,
    poisson_regression,
    radon,
    stochastic_volatility,
    ucbadmit,
)


class ZooModel(NamedTuple):
    """A model of the zoo: its name, the NumPyro model, a data maker, a description."""

    name: str
    model: Callable
    data: Callable[[], tuple[tuple, dict]]
    description: str


def _entry(name: str, module) -> ZooModel:  # noqa: ANN001
    return ZooModel(name, module.model, module.data, module.__doc__.strip().splitlines()[0])


ZOO: dict[str, ZooModel] = {
    name: _entry(name, module)
    for name, module in [
        ("beta_bernoulli", beta_bernoulli),
        ("gamma_poisson", gamma_poisson),
        ("normal_mean_precision", normal_mean_precision),
        ("linear_regression", linear_regression),
        ("gaussian_mixture", gaussian_mixture),
        ("hmm", hmm),
        ("hmm_sequences", hmm_sequences),
        ("hmm_enum", hmm_enum),
        ("hmm_markov", hmm_markov),
        ("eight_schools_centered", eight_schools_centered),
        ("eight_schools_noncentered", eight_schools_noncentered),
        ("radon", radon),
        ("local_level_grw", local_level_grw),
        ("local_level_scan", local_level_scan),
        ("local_level_sequences", local_level_sequences),
        ("local_level_in_scan", local_level_in_scan),
        ("nile", nile),
        ("local_linear_trend", local_linear_trend),
        ("ar1", ar1),
        ("linear_gaussian_ssm", linear_gaussian_ssm),
        ("stochastic_volatility", stochastic_volatility),
        ("logistic_regression", logistic_regression),
        ("poisson_regression", poisson_regression),
        ("annotation", annotation),
        ("multivariate_regression", multivariate_regression),
        ("baseball", baseball),
        ("log_mix", log_mix),
        ("gp", gp),
        ("ucbadmit", ucbadmit),
    ]
}

__all__ = ["ZOO", "ZooModel"]
