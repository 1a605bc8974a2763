"""The compiled expectation of a log factor: statistic terms, as JAX pytrees.

:func:`~blrppl.symbolic.analysis.analyse` turns ``E_q[log f]`` into an
:class:`Analysis`, a sum of :class:`StatTerm`: a coefficient, one constant
operand (the data's sufficient statistics) and reads (:class:`StatRead`) of
the variables' mean parameters.

An analysis is a pytree whose *leaves* are what the data determine (each
term's coefficient and operand array) and whose static structure is the rest
(the reads, the operands' labels, the observation label), so a jitted
function may take it as an argument: two analyses of one model on data of the
same shapes have equal tree structures, and the function is traced once for
both. Reads hold index arrays (``alpha[county]``); they are part of the
structure, compared by value.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional

import jax

from blrppl.symbolic.terms import Index, Operand


def _index_key(index: Index) -> tuple:
    if index.direct:
        return (index.labels, None)
    return (index.labels, (index.array.shape, str(index.array.dtype), index.array.tobytes()))


@dataclasses.dataclass(frozen=True, eq=False)
class StatRead:
    """A read of variable ``var``'s statistic ``stat`` at positions ``index``.

    Two reads are equal (and hash equal) when they read the same statistic
    at the same positions; index arrays are compared by value.
    """

    var: str
    stat: str
    index: tuple[Index, ...]

    def _key(self) -> tuple:
        return (self.var, self.stat, tuple(_index_key(idx) for idx in self.index))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatRead) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclasses.dataclass(frozen=True)
class StatTerm:
    """``coeff * einsum(operand, reads...)`` summed over every label.

    In a per-observation analysis (a factor in a subsampled plate), the
    observation label is kept through pre-contraction so that a minibatch
    can be read; a term that does not read it is the same for every
    observation.

    A pytree: ``coeff`` and ``operand``'s array are leaves
    (:class:`~blrppl.symbolic.terms.Operand` is a pytree too) and ``reads``
    and ``obs_label`` static.
    """

    coeff: Any
    operand: Optional[Operand]
    reads: tuple[StatRead, ...]
    obs_label: Optional[int] = None  # the kept observation label, if the term reads it


@dataclasses.dataclass(frozen=True)
class Analysis:
    """The compiled expectation of one factor: the sum of its ``terms``.

    ``obs_label``/``obs_size``: for a per-observation analysis (a factor in a
    subsampled plate), the kept observation label and the plate's full size;
    otherwise None and 0. ``residual``: a part of log f that depends only on
    variables held at a point (a normaliser such as log B(a, b) of a Beta
    prior whose a and b are held) was left out of the terms; the estimator
    that held them adds it back numerically
    (:func:`blrppl.estimators.hybrid.hybrid_estimator`). A pytree: the terms'
    leaves are its leaves.
    """

    terms: tuple[StatTerm, ...]
    obs_label: Optional[int] = None
    obs_size: int = 0
    residual: bool = False


jax.tree_util.register_dataclass(StatTerm, data_fields=["coeff", "operand"], meta_fields=["reads", "obs_label"])
jax.tree_util.register_dataclass(Analysis, data_fields=["terms"], meta_fields=["obs_label", "obs_size", "residual"])


def stats_needed(terms: Iterable[StatTerm], var: str) -> set[str]:
    """The statistic names of ``var`` that ``terms`` read."""
    return {r.stat for t in terms for r in t.reads if r.var == var}
