"""``VMP``: variational message passing (Khan & Rue, Sec. 5.3, Eq. 57)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from blrppl.engines import presets
from blrppl.engines.base import Engine


class VMP(Engine):
    """Variational message passing: ρ = 1 for every node, coordinate-wise.

    Each step updates every variable in turn to the sum of its factors' site
    parameters at the current q of its neighbours (Winn & Bishop 2005); with
    exact site parameters that is coordinate ascent, so the ELBO never
    decreases.
    """

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        families: Optional[Mapping[str, str]] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__(model, presets.vmp(mode=mode, families=families, order=order, init=init))
