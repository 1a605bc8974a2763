"""A program's floating-point work, counted on its jaxpr.

:mod:`blrppl.compile_mode` chooses how to compile a step loop over larger data
by its work per step. XLA's own count (``Lowered.cost_analysis()``) needs the
program lowered to StableHLO and converted to HLO first: 0.1-0.15 s of a first
call on the critical path (the logistic regression on 100,000 rows, the mixture
on 100,000 points), for a program whose plain lowering follows anyway. The
jaxpr is at hand once the program is traced (JAX caches the trace for every
variant), and its equations give the same count in milliseconds.

The count follows XLA's conventions (``HloCostAnalysis``): an elementwise
operation costs one per output element (transcendental ones too, which XLA
counts apart: here they are work like any other), a reduction one per input
element, a matrix product two per multiply-add; moving data (broadcasts,
reshapes, slices, gathers, concatenations) costs nothing; a loop's body (a
``while_loop``, a ``scan``) is counted once, as XLA counts it, and a ``cond``
by its dearest branch. Factorisations and triangular solves, which XLA:CPU
runs as library calls it does not count, cost what LAPACK's count says.
"""

from __future__ import annotations

import math
from typing import Any

from jax.extend import core as jex_core

_MOVES = frozenset({
    "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "iota", "copy", "copy_p", "rev", "device_put",
    "stop_gradient", "select_and_gather_add", "convert_element_type", "bitcast_convert_type", "split",
    "random_wrap", "random_unwrap", "random_seed", "random_fold_in", "random_split", "empty", "optimization_barrier",
    "sharding_constraint", "pvary", "axis_index", "full_like", "zeros_like",
})
_REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce_precision",
    "sort", "top_k",
})
_FACTORISATIONS = frozenset({
    "cholesky", "lu", "qr", "householder_product", "eigh", "eig", "svd", "triangular_solve", "tridiagonal",
    "tridiagonal_solve", "schur", "hessenberg",
})


def jaxpr_flops(jaxpr: Any) -> float:
    """The floating-point operations of one run of ``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``),
    by the conventions of the module docstring."""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    return float(sum(_equation_flops(eqn) for eqn in inner.eqns))


def _size(var: Any) -> int:
    shape = getattr(getattr(var, "aval", None), "shape", ())
    return math.prod(shape) if shape is not None else 1


def _equation_flops(eqn: Any) -> float:
    name = eqn.primitive.name
    params = eqn.params
    if name == "while":
        return jaxpr_flops(params["body_jaxpr"]) + jaxpr_flops(params["cond_jaxpr"])
    if name == "cond":
        return max((jaxpr_flops(branch) for branch in params["branches"]), default=0.0)
    if name == "dot_general":
        return _dot_flops(eqn)
    if name in _MOVES:
        return 0.0
    if name in _REDUCTIONS:
        return float(sum(_size(v) for v in eqn.invars))
    linalg = _linalg_flops(name, eqn)
    if linalg is not None:
        return linalg
    if name.startswith("scatter"):
        return float(_size(eqn.invars[-1]))  # one per update (its combiner: one operation)
    subs = [p for p in params.values() if isinstance(p, (jex_core.Jaxpr, jex_core.ClosedJaxpr))]
    subs += [q for p in params.values() if isinstance(p, tuple) for q in p
             if isinstance(q, (jex_core.Jaxpr, jex_core.ClosedJaxpr))]
    if subs:  # a call (jit, custom derivatives, checkpoint) or a scan: its body once
        return sum(jaxpr_flops(sub) for sub in subs)
    return float(sum(_size(v) for v in eqn.outvars))  # elementwise


def _dot_flops(eqn: Any) -> float:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    contracted = math.prod(lhs_shape[d] for d in lhs_contract)
    return 2.0 * _size(eqn.outvars[0]) * contracted


def _linalg_flops(name: str, eqn: Any) -> Any:
    """LAPACK's operation counts for the factorisations (per matrix, times the batch), or None."""
    if name not in _FACTORISATIONS or not eqn.invars or len(eqn.invars[0].aval.shape) < 2:
        return None
    shape = eqn.invars[0].aval.shape
    n = shape[-1]
    batch = math.prod(shape[:-2])
    if name == "triangular_solve":
        rhs = eqn.invars[1].aval.shape
        return float(batch * n * n * (rhs[-1] if eqn.params.get("left_side", True) else rhs[-2]))
    if name in ("tridiagonal", "tridiagonal_solve"):
        return float(batch * 10 * n * n)
    per_matrix = {"cholesky": n**3 / 3, "lu": 2 * n**3 / 3, "qr": 4 * n**3 / 3, "householder_product": 4 * n**3 / 3}
    return float(batch * per_matrix.get(name, 10 * n**3))  # eigen and singular values: about 10 n^3
