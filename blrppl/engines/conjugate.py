"""``ConjugateBayes``: the exact posterior in one step (Khan & Rue, Sec. 5.1)."""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from blrppl.engines import presets
from blrppl.engines.base import Engine


class ConjugateBayes(Engine):
    """Exact Bayes: one BLR step with ρ = 1 (Khan & Rue, Sec. 5.1, Eq. 54).

    For models whose posterior lies in the q family: every factor touches at
    most one q block and has an exact site parameter. Gaussian latents on the
    real line that share a factor form one joint block (up to
    ``MAX_JOINT_SIZE`` scalars: a regression's intercept and coefficients, a
    hierarchy of Gaussian means with known scales), whose exact posterior is
    one joint Gaussian. Then λ = Σ_f λ̃_f is the exact posterior after the
    first step, and further steps are no-ops. Anything else raises
    :class:`~blrppl.ModelError` pointing to ``VMP``.
    """

    def __init__(self, model: Callable, *, mode: str = "global", families: Optional[Mapping[str, str]] = None):
        super().__init__(model, presets.conjugate_bayes(mode=mode, families=families))
