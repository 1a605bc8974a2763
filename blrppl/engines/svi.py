"""``SVI``: stochastic variational inference on minibatches (Khan & Rue, Sec. 5.3)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.blr.schedules import robbins_monro
from blrppl.deep.rules import RULES
from blrppl.engines import presets
from blrppl.engines.base import Engine
from blrppl.engines.diagonal import DiagonalBLR


class SVI(Engine):
    """Stochastic VI (Hoffman et al. 2013) as the BLR on minibatches.

    Minibatches come from ``numpyro.plate(..., subsample_size=M)``: blrppl
    draws its own epoch-wise permutation and substitutes the plate's indices.
    Variables inside the plate get ρ = 1 on their minibatch; global variables
    follow the schedule ρ_t (default Robbins-Monro, (t)^-0.7) towards the
    minibatch target rescaled by N / M. ``mode="local"`` is the incremental
    variant (Eq. 60): each observation keeps its latest contribution, so one
    pass at ρ = 1 is exact for a conjugate model with one global latent. It is
    the same BLR step as every other engine (guards, averaging and EM's
    M-step included), with a minibatch.

    Non-conjugate likelihoods (``estimator="auto"``, or ``"quadrature"``,
    ``"mc"``, ``"delta"``, or a dict per factor; the default ``"exact"``
    refuses them): conjugate factors stay exact, the others get estimated
    site parameters on each minibatch, read by re-running the model on the
    batch's rows (O(M) per step). A GLM likelihood (``Bernoulli(logits=X @
    beta)``, ``Poisson(jnp.exp(X @ beta))``) gets Gauss-Hermite on the
    batch's linear predictors; in ``mode="local"`` each observation keeps its
    two numbers (E[ℓ'] and E[ℓ''] of its predictor, Khan & Lin 2017) and a
    minibatch swaps its own (Eq. 60), so the iterates settle at the full-data
    fixed point with a constant ρ. Gaussian q start from a Newton (Laplace)
    fit to a fixed subsample of M rows rescaled to N. ``average`` turns on
    iterate averaging (default: with Monte Carlo site parameters).

    The deep-learning rows of Table 1 (``estimator="ivon"``, ``"vogn"``,
    ``"ogn"``, ``"rmsprop"``, ``"adam"``) fit one diagonal Gaussian over all
    latents, the model being one loss: ``SVI(model, estimator="ivon", ...)``
    returns a :class:`~blrppl.engines.diagonal.DiagonalBLR` (its options
    there; ``learning_rate`` is then its α).
    """

    def __new__(cls, model: Callable, **options: Any):
        estimator = options.get("estimator")
        if isinstance(estimator, str) and estimator in RULES:
            options.pop("estimator")
            if "mode" in options and options.pop("mode") != "global":
                raise ValueError(f"SVI(estimator={estimator!r}) has one q refreshed from each minibatch: mode='global'.")
            return DiagonalBLR(model, rule=estimator, **options)
        return super().__new__(cls)

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        learning_rate: Union[float, Callable] = robbins_monro(1.0, 0.7),
        estimator: Union[str, Mapping[str, str]] = "exact",
        num_samples: int = 16,
        families: Optional[Mapping[str, str]] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
        average: Optional[bool] = None,
    ):
        super().__init__(
            model,
            presets.svi(
                mode=mode, learning_rate=learning_rate, estimator=estimator, num_samples=num_samples,
                families=families, order=order, init=init, average=average,
            ),
        )
