"""``SVI``: stochastic variational inference on minibatches (Khan & Rue, Sec. 5.3)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
from numpyro import handlers

from blrppl.blr.incremental import build_store
from blrppl.blr.schedules import robbins_monro
from blrppl.blr.svi import build_svi
from blrppl.engines.base import Engine, Plan
from blrppl.errors import ModelError
from blrppl.graph.nodes import FactorGraph, Plate
from blrppl.graph.trace import build_graph


@dataclasses.dataclass(frozen=True)
class Subsample:
    """The subsampled plate of an SVI plan and the variables local to it."""

    plate: Plate
    local_axes: dict
    plate_factors: frozenset


def _full_data_model(model: Callable, plate: Plate) -> Callable:
    """The model with the plate's indices fixed to all N positions."""

    def full_model(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="subsample_size does not match")
            with handlers.substitute(data={plate.name: jnp.arange(plate.size)}):
                return model(*args, **kwargs)

    full_model.__name__ = getattr(model, "__name__", "model")
    return full_model


class SVI(Engine):
    """Stochastic VI (Hoffman et al. 2013) as the BLR on minibatches.

    Minibatches come from ``numpyro.plate(..., subsample_size=M)``: blrppl
    draws its own epoch-wise permutation and substitutes the plate's indices.
    Variables inside the plate get ρ = 1 on their minibatch; global variables
    follow the schedule ρ_t (default Robbins-Monro, (t)^-0.7) towards the
    minibatch target rescaled by N / M. ``mode="local"`` is the incremental
    variant (Eq. 60): each observation keeps its latest contribution, so one
    pass at ρ = 1 is exact for a conjugate model with one global latent.
    """

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        learning_rate: Union[float, Callable] = robbins_monro(1.0, 0.7),
        families: Optional[dict] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[dict] = None,
    ):
        super().__init__(
            model,
            mode=mode,
            schedule="sequential",
            learning_rate=learning_rate,
            families=families,
            order=order,
            init=init,
        )

    def plan(self, *model_args: Any, **model_kwargs: Any) -> Plan:
        raw = build_graph(self.model, model_args, model_kwargs, families=self.families or None)
        subsampled = [p for p in raw.plates.values() if p.subsampled]
        if len(subsampled) != 1:
            names = [p.name for p in subsampled]
            site = names[1] if len(names) > 1 else getattr(self.model, "__name__", "model")
            raise ModelError(
                f"site {site!r}: SVI needs exactly one plate with subsample_size, found {names or 'none'}; "
                "subsample one data plate (use VMP for full-data fits)."
            )
        plate = subsampled[0]
        graph = build_graph(_full_data_model(self.model, plate), model_args, model_kwargs, families=self.families or None)
        plate_factors = frozenset(f for f, node in graph.factors.items() if plate.name in node.plates)
        full_plate = dataclasses.replace(plate, subsample_size=plate.size)
        plan = self._plan_graph(graph, {f: full_plate for f in plate_factors})
        local_axes = {}
        for v, node in graph.variables.items():
            if plate.name in node.plates:
                q = plan.qs[v]
                axis = len(q.batch_shape) + plate.dim
                if axis < 0:
                    raise ModelError(f"site {v!r}: cannot locate the plate {plate.name!r} axis of its q; declare the plate's dim.")
                local_axes[v] = axis
        return dataclasses.replace(plan, subsample=Subsample(plate, local_axes, plate_factors))

    def build(self, plan: Plan, rng_key: Optional[jax.Array] = None, *, random_start: bool = False):
        """The functional core; ``rng_key`` seeds the epoch permutations."""
        sub = plan.subsample
        batch_key = jax.random.fold_in(jax.random.key(0) if rng_key is None else rng_key, 1)
        incremental = None
        if self.mode == "local":
            incremental = build_store(plan.qs, plan.estimators, sub.plate_factors, sub.local_axes, sub.plate.size)
        return build_svi(
            plan.qs,
            plan.estimators,
            plate=sub.plate,
            local_axes=sub.local_axes,
            plate_factors=sub.plate_factors,
            rho=self._rho(),
            init_natural=self._init_natural(plan, random_start),
            batch_key=batch_key,
            init_params=plan.init_params,
            order=self.order,
            incremental=incremental,
        )
