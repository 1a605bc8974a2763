"""Table 1 of Khan & Rue as configuration values.

Each function returns a :class:`~blrppl.blr.config.Config`: the row's choice of
q, natural-gradient approximation, learning rate and schedule, composed from
the same building blocks (optax builds its aliases over ``chain`` the same
way). The engine classes in this package only call these.

==========================  ================================================
Table 1 row                 configuration
==========================  ================================================
Conjugate Bayes (Sec. 5.1)  exact site parameters, ρ = 1, all blocks at once,
                            every factor on one q block
Laplace (Sec. 4.4)          one Gaussian block over every latent, delta method
Expectation-Maximisation    exact site parameters for q, delta method for
(Sec. 5.2)                  point estimates (M-step), ρ = 1, coordinate-wise
Stochastic VI (Sec. 5.3)    minibatches of one plate, local ρ = 1, global ρ_t
VMP (Sec. 5.3)              exact site parameters, ρ = 1, coordinate-wise
Non-conjugate VI (Sec. 5.4) exact where conjugate, estimated elsewhere, ρ < 1;
                            scalar hyperparameters sharing a factor joint
Non-conjugate VI (New)      a mixture over a grid of hyperparameters h of
                            exact (ConjugateBayes) or Laplace q(c | h)
==========================  ================================================
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.blr.config import Config, make_config
from blrppl.blr.integrate.options import IntegratedConfig, make_integrated_config
from blrppl.blr.schedules import robbins_monro
from blrppl.estimators.select import EstimatorOptions

EXACT = EstimatorOptions(choice="exact", exact_only=True)
"""Every factor exact (symbolic) or an error that names the edge."""


def blr(
    *,
    mode: str = "global",
    schedule: str = "sequential",
    learning_rate: Union[float, Callable] = 1.0,
    estimator: Union[str, Mapping[str, str]] = "exact",
    num_samples: int = 16,
    families: Optional[Mapping[str, str]] = None,
    blocks: Optional[Sequence[Sequence[str]]] = None,
    point_estimates: Optional[Sequence[str]] = None,
    init: Optional[Mapping[str, Any]] = None,
    order: Optional[Sequence[str]] = None,
    average: Optional[bool] = None,
) -> Config:
    """The general rule: every option of ``shared/API.md``.

    ``estimator="exact"`` keeps exact site parameters and refuses
    non-conjugate factors; any other choice estimates the factors that are
    not conjugate with it (``"auto"``, ``"delta"``, ``"mc"``, ``"quadrature"``),
    and a dict sets it per factor.
    """
    if isinstance(estimator, Mapping):
        options = EstimatorOptions(choice=dict(estimator), num_samples=num_samples)
    elif estimator == "exact":
        options = EstimatorOptions(choice="exact", num_samples=num_samples)
    else:
        options = EstimatorOptions(choice="exact", fallback=estimator, num_samples=num_samples)
    return make_config(
        mode=mode,
        schedule=schedule,
        learning_rate=learning_rate,
        estimators=options,
        families=families or {},
        blocks=blocks or (),
        point_estimates=point_estimates or (),
        init=init or {},
        order=order,
        average=average,
    )


def conjugate_bayes(*, mode: str = "global", families: Optional[Mapping[str, str]] = None) -> Config:
    """Exact Bayes: one ρ = 1 step of every block from the prior (Sec. 5.1, Eq. 54)."""
    return make_config(
        name="ConjugateBayes",
        mode=mode,
        schedule="parallel",
        learning_rate=1.0,
        estimators=EXACT,
        families=families or {},
        posterior_in_family=True,
        point_params=False,
        joint_gaussians=True,
    )


def vmp(
    *,
    mode: str = "global",
    families: Optional[Mapping[str, str]] = None,
    order: Optional[Sequence[str]] = None,
    init: Optional[Mapping[str, Any]] = None,
    blocks: Union[None, str, Sequence[Sequence[str]]] = None,
) -> Config:
    """Variational message passing: ρ = 1 for every node, coordinate-wise (Sec. 5.3).

    ``blocks``: None, mean-field over the model's sites; ``"gaussian"``, the Gaussian latents
    on the real line that share a factor in one joint block each (as ``EM``'s E-step);
    or the groups of sites to join."""
    joint = blocks == "gaussian"
    if isinstance(blocks, str) and not joint:
        raise ValueError(f"VMP's blocks must be None, 'gaussian' or groups of site names; got {blocks!r}.")
    return make_config(
        name="VMP", mode=mode, schedule="sequential", learning_rate=1.0, estimators=EXACT,
        families=families or {}, order=order, init=init or {}, joint_gaussians=joint,
        blocks=() if joint or blocks is None else tuple(tuple(group) for group in blocks),
    )


def em(
    *,
    mode: str = "global",
    families: Optional[Mapping[str, str]] = None,
    point_estimates: Optional[Sequence[str]] = None,
    order: Optional[Sequence[str]] = None,
    init: Optional[Mapping[str, Any]] = None,
) -> Config:
    """EM: an exact E-step, the delta method (M-step) for point estimates (Sec. 5.2).

    Gaussian latents linked by factors form joint blocks, so the E-step's q is
    the exact conditional posterior (not mean-field) wherever the blocks stay
    small, and the bound equals the log likelihood at convergence.
    """
    return vmp(mode=mode, families=families, order=order, init=init)._replace(
        name="EM", point_estimates=tuple(point_estimates or ()), joint_gaussians=True
    )


def svi(
    *,
    mode: str = "global",
    learning_rate: Union[float, Callable] = robbins_monro(1.0, 0.7),
    estimator: Union[str, Mapping[str, str]] = "exact",
    num_samples: int = 16,
    families: Optional[Mapping[str, str]] = None,
    order: Optional[Sequence[str]] = None,
    init: Optional[Mapping[str, Any]] = None,
    average: Optional[bool] = None,
) -> Config:
    """Stochastic VI: minibatches, local ρ = 1, global ρ_t (Sec. 5.3, Hoffman et al. 2013).

    ``estimator="exact"`` (the default) keeps every factor exact and refuses
    non-conjugate ones; any other choice (``"auto"``, ``"quadrature"``,
    ``"mc"``, ``"delta"``, or a dict per factor) keeps the conjugate factors
    exact and estimates the others on each minibatch (Sec. 5.4 on
    minibatches: GLM likelihoods by Gauss-Hermite on the batch's linear
    predictors, others by Monte Carlo), with the N / M scaling.
    """
    if isinstance(estimator, Mapping):
        options = EstimatorOptions(choice=dict(estimator), fallback="auto", num_samples=num_samples)
    elif estimator == "exact":
        options = EXACT._replace(num_samples=num_samples)
    else:
        if estimator not in ("auto", "mc", "delta", "quadrature"):
            raise ValueError(
                "estimator must be 'exact', 'auto', 'mc', 'delta' or 'quadrature', or a deep-learning row of "
                f"Table 1 ('ivon', 'vogn', 'ogn', 'rmsprop', 'adam'), got {estimator!r}."
            )
        options = EstimatorOptions(choice="exact", fallback=estimator, num_samples=num_samples)
    return make_config(
        name="SVI", mode=mode, schedule="sequential", learning_rate=learning_rate, estimators=options,
        families=families or {}, order=order, init=init or {}, minibatch=True, average=average,
    )


def nonconjugate_vi(
    *,
    estimator: Union[str, Mapping[str, str]] = "auto",
    num_samples: int = 16,
    learning_rate: Union[float, Callable, str] = "auto",
    mode: str = "global",
    schedule: str = "sequential",
    families: Optional[Mapping[str, str]] = None,
    blocks: Optional[Sequence[Sequence[str]]] = None,
    order: Optional[Sequence[str]] = None,
    init: Optional[Mapping[str, Any]] = None,
    average: Optional[bool] = None,
) -> Config:
    """Non-conjugate VI: exact where conjugate, estimated natural gradients elsewhere (Sec. 5.4)."""
    if isinstance(estimator, Mapping):
        options = EstimatorOptions(choice=dict(estimator), fallback="auto", num_samples=num_samples)
    else:
        if estimator not in ("auto", "mc", "delta", "quadrature", "cubature"):
            raise ValueError(
                f"estimator must be 'auto', 'mc', 'delta', 'quadrature' or 'cubature', got {estimator!r}."
            )
        options = EstimatorOptions(choice="exact", fallback=estimator, num_samples=num_samples)
    return make_config(
        name="NonConjugateVI", mode=mode, schedule=schedule, learning_rate=learning_rate, estimators=options,
        families=families or {}, blocks=blocks or (), order=order, init=init or {}, average=average,
        joint_hyperparameters=True, newton=blocks == "all", gaussian_fallback=True,
    )


def laplace(*, learning_rate: Union[float, Callable] = 1.0, init: Optional[Mapping[str, Any]] = None) -> Config:
    """Laplace's method: one Gaussian over every latent, delta-method site parameters (Sec. 4.4)."""
    return make_config(
        name="Laplace", learning_rate=learning_rate, estimators=EstimatorOptions(forced="delta"),
        blocks="all", init=init or {}, continuous_only=True,
    )


def integrated(
    *,
    hyper: Optional[Sequence[str]] = None,
    max_dim: int = 5,
    drop: float = 15.0,
    step: Optional[float] = None,
    inner: str = "auto",
    inner_steps: int = 50,
    max_nodes: int = 50_000,
    families: Optional[Mapping[str, str]] = None,
) -> IntegratedConfig:
    """Table 1's "Non-conjugate VI (New)": exact (or Laplace) q(c | h) mixed over a grid of h.

    See :mod:`blrppl.blr.integrate` (the conditional fits are ConjugateBayes
    or Laplace configurations with h held; :mod:`blrppl.blr.integrate.hyper`).
    """
    return make_integrated_config(
        hyper=hyper, max_dim=max_dim, drop=drop, step=step, inner=inner, inner_steps=inner_steps,
        max_nodes=max_nodes, families=families or {},
    )
