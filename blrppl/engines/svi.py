"""``SVI``: stochastic variational inference on minibatches (Khan & Rue, Sec. 5.3)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.blr.schedules import robbins_monro
from blrppl.engines import presets
from blrppl.engines.base import Engine


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
    """

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        learning_rate: Union[float, Callable] = robbins_monro(1.0, 0.7),
        families: Optional[Mapping[str, str]] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__(
            model, presets.svi(mode=mode, learning_rate=learning_rate, families=families, order=order, init=init)
        )
