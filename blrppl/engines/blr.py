"""``BLR``: the general engine, every option of ``shared/API.md``."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.engines import presets
from blrppl.engines.base import Engine


class BLR(Engine):
    """The Bayesian learning rule engine (Khan & Rue, Eqs. 58 and 60).

    Every Table 1 algorithm is a choice of options: ``learning_rate=1.0`` with
    ``schedule="sequential"`` is VMP, one step with every factor touching one
    q block is conjugate Bayes, a schedule ``rho_t < 1`` is stochastic or
    damped natural-gradient VI; ``mode="local"`` keeps one site parameter per
    factor (Eq. 60) instead of updating λ directly (Eq. 58).

    Example:
        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> def model(y):
        ...     z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        ...     with numpyro.plate("N", y.shape[0]):
        ...         numpyro.sample("y", dist.Normal(z, 0.5), obs=y)
        >>> result = BLR(model).run(jax.random.key(0), 2, jnp.array([0.3, 1.1, 0.8]),
        ...                         progress_bar=False)
        >>> round(float(result.posterior["z"].loc), 4)
        0.6769
    """

    def __init__(
        self,
        model: Callable,
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
    ):
        super().__init__(
            model,
            presets.blr(
                mode=mode,
                schedule=schedule,
                learning_rate=learning_rate,
                estimator=estimator,
                num_samples=num_samples,
                families=families,
                blocks=blocks,
                point_estimates=point_estimates,
                init=init,
                order=order,
                average=average,
            ),
        )
