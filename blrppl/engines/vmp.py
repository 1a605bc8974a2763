"""``VMP``: variational message passing (Khan & Rue, Sec. 5.3, Eq. 57)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from blrppl.engines import presets
from blrppl.engines.base import Engine


class VMP(Engine):
    """Variational message passing: ρ = 1 for every node, coordinate-wise.

    Each step updates every variable in turn to the sum of its factors' site
    parameters at the current q of its neighbours (Winn & Bishop 2005); with
    exact site parameters that is coordinate ascent, so the ELBO never
    decreases. ``blocks="gaussian"`` joins the Gaussian latents on the real
    line that share a factor into one block each (a regression's intercept and
    slopes: their posterior correlation, which mean-field drops; what
    :func:`blrppl.choose` picks where there are such latents); a list of site
    groups joins those.
    """

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        families: Optional[Mapping[str, str]] = None,
        order: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
        blocks: Union[None, str, Sequence[Sequence[str]]] = None,
    ):
        super().__init__(model, presets.vmp(mode=mode, families=families, order=order, init=init, blocks=blocks))
