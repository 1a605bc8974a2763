"""``NonConjugateVI``: the BLR with estimated site parameters (Khan & Rue, Sec. 5.4)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.engines import presets
from blrppl.engines.base import Engine


class NonConjugateVI(Engine):
    """Non-conjugate VI: conjugate factors exact, the others estimated.

    Factors with exact site parameters keep them; the others get natural
    gradients of their expected log densities from ``estimator`` (``"auto"``,
    the default: Gauss-Hermite on GLM linear predictors and on small or
    separable factors of one Gaussian, a degree-5 cubature on factors of a
    few scalar Gaussians (total dimension <= 4; a Gaussian process's
    hyperparameters, which get one joint block), enumeration over Bernoulli
    and Categorical neighbours, Monte Carlo elsewhere; ``"mc"``:
    reparameterised Monte Carlo with ``num_samples`` draws; ``"delta"``: the
    delta method, i.e. Newton/Laplace steps; ``"quadrature"``: Gauss-Hermite
    for factors with one Gaussian neighbour), as in Khan & Lin (2017); a dict
    ``{factor: method}`` sets it per factor (``"exact"`` keeps the default for
    a conjugate factor). Latents
    whose prior has no exponential-family q (HalfCauchy, LogNormal, ...) get a
    Gaussian on the unconstrained space of their support. Steps are damped by
    ``learning_rate`` (default ``"auto"``: 1 where every estimated site
    parameter is deterministic (quadrature, cubature, delta), the ELBO
    guard retrying a step that lowers the ELBO with ρ/2, ρ/4, ..., and
    steps that oscillate around their fixed point damped by the estimated
    eigenvalue (:mod:`blrppl.blr.damping`; in local mode, which is not
    damped, only with the cubature or ``blocks="all"``); 0.2 where some are
    Monte Carlo, with iterate averaging; any constant or schedule may be given) and kept in the natural parameter
    space by the improved BLR of Lin, Schmidt & Khan (2020). With Monte Carlo
    site parameters and ρ < 1, q at the end of a run is the polynomial-decay
    average of the iterates (``average=None``: automatic; True/False force
    it); ``result.elbo`` traces the iterates themselves.
    """

    def __init__(
        self,
        model: Callable,
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
    ):
        super().__init__(
            model,
            presets.nonconjugate_vi(
                estimator=estimator,
                num_samples=num_samples,
                learning_rate=learning_rate,
                mode=mode,
                schedule=schedule,
                families=families,
                blocks=blocks,
                order=order,
                init=init,
                average=average,
            ),
        )
