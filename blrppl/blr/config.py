"""A Table 1 row as a value: the options of one BLR fit.

Every engine of blrppl is a :class:`Config`: which q (families, joint blocks,
point estimates), how site parameters are computed (exact, or estimated by the
delta method, Monte Carlo or quadrature), the update mode (Eq. 58 or 60), the
schedule over variables, the learning rate, minibatches. Presets are functions
that fill some options (:mod:`blrppl.engines.presets`); the core
(:func:`blrppl.blr.plan.make_plan`, :func:`blrppl.blr.build.build_blr`)
reads the options and knows no preset.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

from blrppl.estimators.base import ESTIMATORS
from blrppl.estimators.select import EstimatorOptions

MODES = ("global", "local")
AUTO_NOISY_RATE = 0.2
"""ρ of ``learning_rate="auto"`` where some site parameter is a Monte Carlo estimate (else 1, guarded)."""
MAX_JOINT_SIZE = 400
"""The largest joint Gaussian block (scalars) ``joint_gaussians`` forms."""
SCHEDULES = ("sequential", "parallel")


class Config(NamedTuple):
    """The options of one BLR fit (see ``shared/API.md`` for their meaning).

    Attributes:
      mode: ``"global"`` (Eq. 58) or ``"local"`` (Eq. 60).
      schedule: ``"sequential"`` (coordinate-wise over q blocks, VMP) or
        ``"parallel"`` (every block from the same q).
      learning_rate: ρ, a float in (0, 1] or a schedule ``step -> ρ`` (steps
        count from 1), or ``"auto"``: 1 when every estimated site parameter
        is deterministic (quadrature, cubature, delta: the ELBO guard then
        halves a step that lowers the ELBO; in global mode, where the steps
        oscillate around their fixed point, ρ = 1 / (1 - e) from the estimated
        eigenvalue e < 0, :mod:`blrppl.blr.damping`; in local mode only with
        the cubature or ``blocks="all"``), else 0.2 (with iterate averaging
        for Monte Carlo).
      estimators: how factors get their site parameters.
      families: site -> q family name overrides.
      blocks: joint Gaussian blocks over sites, or ``"all"``: one block over
        every continuous latent (Laplace).
      point_estimates: latent sites estimated by the delta method (EM).
      init: site -> value or distribution to start q from.
      order: the sequential order of variables (default: trace order, with the discrete
        variables that a factor exact given them sums over last: :func:`blrppl.blr.build.default_order`).
      average: iterate averaging (None: automatic, with Monte Carlo site
        parameters and ρ < 1).
      minibatch: fit one subsampled plate by minibatches (stochastic VI,
        Sec. 5.3): plate-local latents take ρ = 1 on their batch rows.
      posterior_in_family: every factor must touch at most one q block, so
        that one ρ = 1 step is the exact posterior (conjugate Bayes, Sec. 5.1).
      point_params: ``numpyro.param`` sites are allowed (as point estimates).
      continuous_only: every latent must be continuous and not a chain
        (Laplace's one Gaussian block).
      joint_gaussians: Gaussian latents on the real line that share a factor
        get one joint block (up to ``MAX_JOINT_SIZE`` scalars), so that their
        exact q is joint, not mean-field (EM's exact E-step).
      joint_hyperparameters: scalar latents with a Gaussian q on an
        unconstrained space (LogNormal, HalfCauchy, ... priors) that share a
        factor estimated by cubature get one full-covariance block (a
        Gaussian process's amplitude, noise and length scale: mean-field
        misses their correlation).
      strict_guard: with the ELBO guard, retry every step that lowers the
        ELBO (not only collapses): monotone ascent to a settled optimum
        (one full Gaussian: ``blocks="all"``, Integrated's VI inner fits).
      gaussian_fallback: a continuous latent whose q is its prior's non-Gaussian
        family (Gamma for an ``Exponential`` scale, Beta, ...) but that some
        factor could update only by Monte Carlo gets a Gaussian q on its
        unconstrained space instead, where that factor takes quadrature (unless
        ``families`` names it): a hierarchical regression with ``Exponential``
        priors on its scales then fits deterministically in tens of steps, not
        by hundreds of noisy ones (:mod:`blrppl.blr.fallback`).
      newton: with the ELBO guard and no point estimates, each step also
        tries damped Newton steps on the deterministic ELBO in natural
        parameters and keeps the better (:mod:`blrppl.blr.newton`; one full
        Gaussian: ``NonConjugateVI(blocks="all")``).
      name: the preset's name, for messages.
    """

    mode: str = "global"
    schedule: str = "sequential"
    learning_rate: Union[float, Callable, str] = 1.0
    estimators: EstimatorOptions = EstimatorOptions()
    families: Mapping[str, str] = {}
    blocks: Union[str, Sequence[Sequence[str]]] = ()
    point_estimates: Sequence[str] = ()
    init: Mapping[str, Any] = {}
    order: Optional[Sequence[str]] = None
    average: Optional[bool] = None
    minibatch: bool = False
    posterior_in_family: bool = False
    point_params: bool = True
    continuous_only: bool = False
    joint_gaussians: bool = False
    joint_hyperparameters: bool = False
    strict_guard: bool = False
    gaussian_fallback: bool = False
    newton: bool = False
    name: str = "BLR"


def make_config(**options: Any) -> Config:
    """Validate options and return a :class:`Config` (plain ``ValueError`` for bad values).

    Raises:
      ValueError: for an unknown mode, schedule or estimator, a learning rate
        outside (0, 1], or a non-positive number of samples.
    """
    config = Config(**options)
    if config.mode not in MODES:
        raise ValueError(f"mode must be 'global' (Eq. 58) or 'local' (Eq. 60), got {config.mode!r}.")
    if config.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'sequential' or 'parallel', got {config.schedule!r}.")
    rate = config.learning_rate
    if isinstance(rate, str):
        if rate != "auto":
            raise ValueError(f"learning_rate must lie in (0, 1], be a schedule or 'auto', got {rate!r}.")
    elif not callable(rate) and not 0.0 < float(rate) <= 1.0:
        raise ValueError(f"learning_rate must lie in (0, 1] or be a schedule, got {rate}.")
    est = config.estimators
    choices = est.choice.values() if isinstance(est.choice, Mapping) else [est.choice]
    for choice in list(choices) + [c for c in (est.fallback, est.forced) if c is not None]:
        if choice not in ("exact", "auto") + ESTIMATORS:
            raise ValueError(f"estimator must be one of {('exact', 'auto') + ESTIMATORS}, got {choice!r}.")
    if int(est.num_samples) != est.num_samples or est.num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {est.num_samples}.")
    blocks = config.blocks if config.blocks == "all" else tuple(tuple(b) for b in config.blocks)
    return config._replace(
        families=dict(config.families or {}),
        blocks=blocks,
        point_estimates=tuple(config.point_estimates or ()),
        init=dict(config.init or {}),
        order=tuple(config.order) if config.order is not None else None,
    )
