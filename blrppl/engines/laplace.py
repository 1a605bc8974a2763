"""``Laplace``: the delta method with one full Gaussian (Khan & Rue, Sec. 4.4)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

from blrppl.engines import presets
from blrppl.engines.base import Engine


class Laplace(Engine):
    """Laplace's method as the BLR: delta-method site parameters, one Gaussian.

    All latent sites form one block with a full-covariance Gaussian q on the
    unconstrained space of their supports (log-Jacobians included). Every
    factor's site parameter comes from the delta method (gradient and Hessian
    at the mean), so with ``learning_rate=1`` each step is a Newton step on the
    log joint, and the fixed point is the MAP with precision equal to minus the
    Hessian there: NumPyro's ``AutoLaplaceApproximation``.
    """

    def __init__(
        self,
        model: Callable,
        *,
        learning_rate: Union[float, Callable] = 1.0,
        init: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__(model, presets.laplace(learning_rate=learning_rate, init=init))
