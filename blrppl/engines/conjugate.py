"""``ConjugateBayes``: the exact posterior in one step (Khan & Rue, Sec. 5.1)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from blrppl.engines.base import Engine, Plan
from blrppl.errors import ModelError


class ConjugateBayes(Engine):
    """Exact Bayes: one BLR step with ρ = 1 (Khan & Rue, Sec. 5.1, Eq. 54).

    For models whose posterior lies in the q family: every factor touches at
    most one q block and has an exact site parameter. Then λ = Σ_f λ̃_f is the
    exact posterior after the first step, and further steps are no-ops.
    Anything else raises :class:`~blrppl.ModelError` pointing to ``VMP``.
    """

    exact_only = True

    def __init__(self, model: Callable, *, mode: str = "global", families: Optional[dict] = None):
        super().__init__(model, mode=mode, schedule="parallel", learning_rate=1.0, families=families)

    def plan(self, *model_args: Any, **model_kwargs: Any) -> Plan:
        try:
            plan = super().plan(*model_args, **model_kwargs)
        except ModelError as error:
            raise ModelError(f"{error} ConjugateBayes needs conjugate factors; VMP fits the same model by coordinate ascent.") from None
        for name, node in plan.graph.factors.items():
            if len(node.neighbours) > 1:
                raise ModelError(
                    f"site {name!r}: the factor touches {len(node.neighbours)} q blocks "
                    f"{list(node.neighbours)}, so the posterior is not in the q family; "
                    "use blrppl.VMP (coordinate ascent) instead."
                )
        for est in plan.estimators:
            coupled = _coupled_variable(est)
            if coupled is not None:
                raise ModelError(
                    f"site {est.factor!r}: the factor couples independent positions of {coupled!r} "
                    "(more than one q block), so the posterior is not in the q family; use "
                    "blrppl.VMP instead, or give the site a joint q (declare its axes as an event "
                    "with .to_event instead of a plate)."
                )
        if plan.init_params:
            raise ModelError(
                f"site {next(iter(plan.init_params))!r}: numpyro.param sites need point estimates; "
                "use blrppl.EM instead."
            )
        return plan


def _coupled_variable(estimator) -> Optional[str]:
    """A variable two of whose independent q blocks meet in one term, if any."""
    analysis = estimator.analysis
    if analysis is None:
        return None
    for term in analysis.terms:
        seen = set()
        for read in term.reads:
            if read.var in seen:
                return read.var
            seen.add(read.var)
    return None
