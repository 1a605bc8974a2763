"""``Laplace``: the delta method with one full Gaussian (Khan & Rue, Sec. 4.4)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from blrppl.engines.base import Engine, Plan
from blrppl.errors import ModelError
from blrppl.graph.trace import build_graph


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
        init: Optional[dict] = None,
    ):
        super().__init__(model, mode="global", schedule="sequential", learning_rate=learning_rate, init=init)
        self.forced = "delta"

    def plan(self, *model_args: Any, **model_kwargs: Any) -> Plan:
        graph = build_graph(self.model, model_args, model_kwargs)
        for name, node in graph.variables.items():
            if node.discrete or node.chain is not None:
                raise ModelError(
                    f"site {name!r}: Laplace needs continuous latents without chains; marginalise or "
                    "fix the site, or use another engine."
                )
        if not graph.variables:
            raise ModelError(f"site {getattr(self.model, '__name__', 'model')!r}: the model has no latent sites to approximate.")
        return self._plan_graph(graph, blocks=[tuple(graph.variables)])
