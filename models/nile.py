"""Nile river flow 1871-1970 (T = 100): a local level model written with ``scan``.

level_0 ~ Normal(1000, 1000^2)                    (a broad "integrated" start)
level_t ~ Normal(level_{t-1}, level_var),   y_t ~ Normal(level_t, obs_var),   t = 1..T

The data are the annual flow volumes of the Nile at Aswan in 10^8 m^3, the
standard series of Durbin & Koopman, *Time Series Analysis by State Space
Methods* (2nd ed., 2012), Ch. 2 (R's ``Nile``, statsmodels'
``sm.datasets.nile``; the numbers below were checked against statsmodels' copy).

Three ways to treat the two noise variances, in two functions:

* :func:`model` (the zoo's): ``numpyro.param`` sites ``obs_var`` and
  ``level_var``; ``blrppl.EM`` gives their maximum-likelihood estimates
  (Khan & Rue, Sec. 5.2): 15101.5 and 1467.0 for this model, within 0.2% of
  Durbin & Koopman's diffuse MLE (15099 and 1469.1), which the broad
  N(1000, 1000^2) start approximates.
* :func:`model` with ``obs_var=`` and ``level_var=`` given: known variances;
  ``blrppl.ConjugateBayes`` is then the exact Kalman smoother (Sec. 5.1).
* :func:`vb_model`: Gamma priors on the precisions; ``blrppl.VMP`` gives the
  mean-field VB posterior q(levels) q(prec_obs) q(prec_level).
* :func:`scales_model`: half-normal priors on both noise sds;
  ``blrppl.Integrated`` integrates them over exact Kalman smoothers.

Both take ``future=h`` to extend the chain h steps past the last observation
(sites ``level_future`` and ``y_future``), so that
``numpyro.infer.Predictive(model, guide=engine.guide(result), params=result.params)``
forecasts. ``mask`` (booleans, shape (T,)) drops observations: masked entries
of ``y`` may be NaN, and the smoother fills the gaps.
"""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan

YEARS = tuple(range(1871, 1971))
"""Calendar year of each observation."""

FLOW = (
    1120, 1160, 963, 1210, 1160, 1160, 813, 1230, 1370, 1140,
    995, 935, 1110, 994, 1020, 960, 1180, 799, 958, 1140,
    1100, 1210, 1150, 1250, 1260, 1220, 1030, 1100, 774, 840,
    874, 694, 940, 833, 701, 916, 692, 1020, 1050, 969,
    831, 726, 456, 824, 702, 1120, 1100, 832, 764, 821,
    768, 845, 864, 862, 698, 845, 744, 796, 1040, 759,
    781, 865, 845, 944, 984, 897, 822, 1010, 771, 676,
    649, 846, 812, 742, 801, 1040, 860, 874, 848, 890,
    744, 749, 838, 1050, 918, 986, 797, 923, 975, 815,
    1020, 906, 901, 1170, 912, 746, 919, 718, 714, 740,
)  # fmt: skip
"""Annual flow volume of the Nile at Aswan, 10^8 m^3, 1871-1970."""

INITIAL_MEAN, INITIAL_SD = 1000.0, 1000.0
"""The broad prior of the level before the first observation."""


def _local_level(length, y, mask, obs_sd, level_sd, future):
    level0 = numpyro.sample("level0", dist.Normal(INITIAL_MEAN, INITIAL_SD))

    def transition(prev, inputs):
        y_t, m_t = inputs
        level = numpyro.sample("level", dist.Normal(prev, level_sd))
        obs = dist.Normal(level, obs_sd)
        numpyro.sample("y", obs if m_t is None else obs.mask(m_t), obs=y_t)
        return level, level

    last, _ = scan(transition, level0, (y, mask), length=length)
    if future:
        _forecast(last, obs_sd, level_sd, future)


def _forecast(last, obs_sd, level_sd, future):
    """The chain continued ``future`` steps past the data: ``level_future``, ``y_future``."""

    def transition(prev, _):
        level = numpyro.sample("level_future", dist.Normal(prev, level_sd))
        numpyro.sample("y_future", dist.Normal(level, obs_sd))
        return level, None

    scan(transition, last, None, length=future)


def model(num_steps=None, *, y=None, mask=None, obs_var=None, level_var=None, future=0):
    """The local level; ``obs_var``/``level_var`` are ``numpyro.param`` sites unless given."""
    length = num_steps if y is None else y.shape[0]
    if obs_var is None:
        obs_var = numpyro.param("obs_var", 10000.0, constraint=dist.constraints.positive)
    if level_var is None:
        level_var = numpyro.param("level_var", 1000.0, constraint=dist.constraints.positive)
    _local_level(length, y, mask, jnp.sqrt(obs_var), jnp.sqrt(level_var), future)


def vb_model(
    num_steps=None, *, y=None, mask=None, concentration=1e-3, rate=1e-3, future=0
):
    """The local level with Gamma(concentration, rate) priors on both noise precisions."""
    length = num_steps if y is None else y.shape[0]
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(concentration, rate))
    prec_level = numpyro.sample("prec_level", dist.Gamma(concentration, rate))
    _local_level(length, y, mask, 1.0 / jnp.sqrt(prec_obs), 1.0 / jnp.sqrt(prec_level), future)


def scales_model(num_steps=None, *, y=None, mask=None, obs_scale=200.0, level_scale=100.0, future=0):
    """The local level with half-normal priors on both noise scales (sds, in flow units).

    obs_sd ~ HalfNormal(obs_scale), level_sd ~ HalfNormal(level_scale). Given
    the two scales the model is the conjugate chain Gaussian, so
    ``blrppl.Integrated`` integrates them on a 2-D grid over exact Kalman
    smoothers.
    """
    length = num_steps if y is None else y.shape[0]
    obs_sd = numpyro.sample("obs_sd", dist.HalfNormal(obs_scale))
    level_sd = numpyro.sample("level_sd", dist.HalfNormal(level_scale))
    _local_level(length, y, mask, obs_sd, level_sd, future)


def data():
    """The 100 annual flows as ``y`` (float)."""
    return (), {"y": jnp.asarray(np.asarray(FLOW, dtype=float))}
