"""``EM``: exact E-step, point estimates for parameters (Khan & Rue, Sec. 5.2)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from blrppl.engines import presets
from blrppl.engines.base import Engine


class EM(Engine):
    """Expectation-Maximisation as the BLR with the delta method on parameters.

    Latent sample sites get their exact q (the E-step: ρ = 1, coordinate-wise);
    ``numpyro.param`` sites are point estimates maximising E_q[log p] (the
    M-step, in closed form when the objective is quadratic in the parameter's
    unconstrained value, else by Newton's method to convergence). The ELBO is
    the usual EM lower bound, equal to the log likelihood at convergence.
    """

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        families: Optional[Mapping[str, str]] = None,
        point_estimates: Optional[Sequence[str]] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__(
            model, presets.em(mode=mode, families=families, point_estimates=point_estimates, order=order, init=init)
        )
