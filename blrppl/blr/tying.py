"""Which discrete chains get the tied family (one pair potential for every step).

A chain Categorical q keeps (T-1, K, K) pair potentials; where every factor pairs the
chain's neighbouring states through one (K, K) log potential (a stationary HMM), the tied
family (:mod:`blrppl.families.tied_chain_categorical`) is the same posterior with (K, K)
statistics, so that updates, forward-backward and the M-step never build (T-1, K, K)
arrays. :func:`make_plan` tries it first for each such chain; the symbolic analysis says
where a factor weighs steps differently (:class:`~blrppl.symbolic.tied.UntiedChain`), or a
factor's site parameters for the chain are not exact, and the chain then keeps the untied
family (only its factors are analysed again).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from blrppl.families import CHAIN_CATEGORICAL, TIED_CHAIN_CATEGORICAL, VariableQ


def tied_candidates(graph: Any, qs: Mapping[str, VariableQ], config: Any, subsampled: bool) -> list[str]:
    """The chain Categorical variables to try with the tied family: none with a minibatch or
    estimators forced by the user, nor where ``families=`` names the chain or one of its sites."""
    if subsampled or config.estimators.forced is not None:
        return []
    named = set(config.families or {})
    out = []
    for name, q in qs.items():
        node = graph.variables[name]
        sites = {name} | set(node.chain.sites if node.chain is not None else ())
        if q.family is CHAIN_CATEGORICAL and not sites & named:
            out.append(name)
    return out


def tied(q: VariableQ) -> VariableQ:
    """``q`` with the tied family (same shapes)."""
    return VariableQ(q.name, TIED_CHAIN_CATEGORICAL, q.shape, q.num_batch, q.transform, q.num_categories, q.joint)


def not_exact(qs: Mapping[str, VariableQ], estimators: Iterable[Any]) -> list[str]:
    """Tied variables some factor's site parameters for are not exact (they keep the untied family)."""
    out = []
    for est in estimators:
        for v in est.neighbours:
            if qs[v].family is TIED_CHAIN_CATEGORICAL and v not in est.method.exact and v not in out:
                out.append(v)
    return out
