"""Find a GLM's linear predictor in a factor's own code (Khan & Lin 2017).

Many likelihoods touch their coefficients only through η = A z + o, one
scalar per observation: ``Bernoulli(logits=X @ beta)``,
``Poisson(jnp.exp(alpha + X @ beta))`` with ``(alpha, beta)`` one block,
``Normal(X @ beta, sigma)``. Then E_q[log f] needs one-dimensional
expectations only, and Gauss-Hermite on each η_n gives the exact site
parameter of the block at any dimension (the ``"quadrature"`` estimator of
:func:`~blrppl.estimators.nonconjugate.nonconjugate_estimator`).

:func:`find_linear_predictor` reads the structure off the jaxpr of
``z -> per-observation log f``: it follows which values are *affine* in z
(sums, products with constants, matrix products with data, slices,
reshapes, ...: the ``linearity`` column of
:data:`blrppl.graph.jaxpr.PRIMITIVES`, with plain calls inlined) and picks
the last affine value that every path from z to the output passes through (a
dominator in the dataflow graph). Everything after
it is ``ℓ(η)``, re-run with η substituted. The elementwise structure
(observation n depends on η_n only) is then checked numerically, so an
unusual model falls back to Monte Carlo instead of getting a wrong answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from blrppl._types import Array
from blrppl.compile_mode import ONE_SHOT_BYTES, fast_compile, probe, to_host
from blrppl.graph.host import evaluate
from blrppl.graph.jaxpr import (
    BILINEAR,
    LINEAR,
    LINEAR_IN_CASES,
    LINEAR_IN_FIRST,
    call_body,
    linearity,
    open_jaxpr,
    walk,
)


class LinearPredictor(NamedTuple):
    """η = A z + o and the per-observation log density as a function of η.

    Attributes:
      design: A, shape (n, D).
      offset: o, shape (n,).
      log_likelihood: ``(eta (..., n), data) -> (..., n)``, elementwise in η;
        ``data`` are the arrays ``fn`` was given (None: the ones it was
        analysed with), so the data can be an argument of compiled code.
      predict: ``(z, data) -> eta (n,)``, the affine map itself on other data
        of the same shapes (a minibatch's design rows are its Jacobian).
      replay: ``data -> (design, offset, ok)`` for other data of the same
        shapes, jit- and vmap-able: A and o there, and whether the checks
        that accepted the structure (affinity, η-substitution, elementwise
        ℓ) hold there too (a compiled replan, :mod:`blrppl.blr.replan`).
    """

    design: Array
    offset: Array
    log_likelihood: Callable[[Array], Array]
    predict: Callable[..., Array] = None
    replay: Callable[..., tuple] = None


class _Flat:
    """A jaxpr with calls inlined; values are integer ids, literals ("lit", value)."""

    def __init__(self) -> None:
        self.eqns: list[tuple[Any, dict, list, list]] = []
        self.consts: dict[int, Any] = {}
        self.avals: dict[int, Any] = {}
        self.count = 0

    def new(self, aval: Any) -> int:
        self.count += 1
        self.avals[self.count - 1] = aval
        return self.count - 1

    def add(self, jaxpr: Any, consts: Any, in_refs: list) -> list:
        const_refs = []
        for v, c in zip(jaxpr.constvars, consts):
            i = self.new(v.aval)
            self.consts[i] = c
            const_refs.append(i)

        def record(eqn: Any, ins: list) -> list:
            body = call_body(eqn, wrapped=False)
            if body is not None:
                return self.add(*open_jaxpr(body), ins)
            outs = [self.new(v.aval) for v in eqn.outvars]
            self.eqns.append((eqn.primitive, eqn.params, ins, outs))
            return outs

        return walk(jaxpr, const_refs, in_refs, record, literal=lambda v: ("lit", v.val, v.aval))

    def run(self, inputs: dict, outputs: list, override: dict | None = None, stop: int | None = None) -> list:
        values = dict(self.consts)
        values.update(inputs)

        def read(r: Any) -> Any:
            return r[1] if isinstance(r, tuple) else values[r]

        for k, (prim, params, ins, outs) in enumerate(self.eqns):
            if stop is not None and k > stop:
                break
            if override and outs[0] in override:
                values[outs[0]] = override[outs[0]]
                continue
            args, bind_params = [read(r) for r in ins], prim.get_bind_params(params)
            result = self._on_host(prim, bind_params, args, ins, outs)
            if result is None:
                result = prim.bind(*args, **bind_params)
            for o, r in zip(outs, result if prim.multiple_results else [result]):
                values[o] = r
        return [read(r) for r in outputs]

    def _on_host(self, prim: Any, params: dict, args: list, ins: list, outs: list) -> Any:
        """An exact primitive on concrete values, in numpy (no one-op compile); else None."""
        if prim.multiple_results or any(isinstance(a, jax.core.Tracer) for a in args):
            return None
        try:
            xs = [np.asarray(a, dtype=(r[2] if isinstance(r, tuple) else self.avals[r]).dtype) for a, r in zip(args, ins)]
            aval = self.avals[outs[0]]
            dtype, shape = np.dtype(aval.dtype), tuple(aval.shape)
        except (TypeError, ValueError, AttributeError):  # keys, exotic avals
            return None
        return evaluate(prim.name, params, xs, dtype, shape)


def _affine_flags(flat: _Flat, source: int) -> tuple[set, set]:
    """The ids that depend on ``source`` and those among them affine in it."""
    dependent, affine = {source}, {source}
    for prim, params, ins, outs in flat.eqns:
        deps = [isinstance(r, int) and r in dependent for r in ins]
        if not any(deps):
            continue
        dependent.update(outs)
        all_affine = all(r in affine for r, d in zip(ins, deps) if d)
        kind = linearity(prim.name)
        if kind == LINEAR:
            ok = all_affine
        elif kind == BILINEAR:
            ok = sum(deps) == 1 and all_affine
        elif kind == LINEAR_IN_FIRST:
            ok = deps[0] and not any(deps[1:]) and ins[0] in affine
        elif kind == LINEAR_IN_CASES:
            ok = not deps[0] and all_affine
        elif prim.name == "integer_pow":
            ok = params.get("y") == 1 and all_affine
        else:
            ok = False
        if ok:
            affine.update(outs)
    return dependent, affine


def _dominators(flat: _Flat, source: int, outputs: list, dependent: set) -> list[tuple[int, int]]:
    """(position, id) where ``id`` is the only live value depending on ``source``."""
    last_use: dict[int, float] = {}
    for k, (_, _, ins, _) in enumerate(flat.eqns):
        for r in ins:
            if isinstance(r, int):
                last_use[r] = k
    for r in outputs:
        if isinstance(r, int):
            last_use[r] = math.inf
    live = {source} if last_use.get(source, -1) >= 0 else set()
    found = []
    for k, (_, _, _, outs) in enumerate(flat.eqns):
        live.update(o for o in outs if o in dependent and last_use.get(o, -1) > k)
        live = {r for r in live if last_use.get(r, -1) > k}
        if len(live) == 1:
            found.append((k, next(iter(live))))
    return found


def find_linear_predictor(
    fn: Callable[..., Array], z0: Array, data: Any = (), *, rtol: float = 1e-6
) -> LinearPredictor | None:
    """Split ``fn(z, data) = ℓ(A z + o; data)`` with ℓ elementwise, or return None.

    Args:
      fn: ``(z, data) -> per-observation log density``, a vector (n,) for z of
        shape (D,). Its code is traced once (``jax.make_jaxpr``) with the data
        as inputs, so ``log_likelihood`` can take other data of the same shapes.
      z0: a point in z's space (the example value) for the numerical checks.
      data: a pytree of arrays, ``fn``'s second argument.
      rtol: tolerance of the elementwise and affinity checks.

    Returns:
      A :class:`LinearPredictor` (``design`` and ``offset`` computed at
      ``data``), or None when no such η exists.
    """
    z0 = jnp.asarray(z0)
    if z0.ndim != 1:
        return None
    data_leaves, data_tree = jax.tree_util.tree_flatten(data)
    closed = jax.make_jaxpr(lambda z, *leaves: fn(z, jax.tree_util.tree_unflatten(data_tree, leaves)))(z0, *data_leaves)
    flat = _Flat()
    source = flat.new(closed.jaxpr.invars[0].aval)
    data_refs = [flat.new(v.aval) for v in closed.jaxpr.invars[1:]]
    (output,) = flat.add(closed.jaxpr, closed.consts, [source] + data_refs)
    if not isinstance(output, int):
        return None
    num_obs = math.prod(flat.avals[output].shape)
    dependent, affine = _affine_flags(flat, source)
    candidates = [
        (k, r)
        for k, r in _dominators(flat, source, [output], dependent)
        if r in affine and r != source and math.prod(flat.avals[r].shape) == num_obs
        and jnp.issubdtype(flat.avals[r].dtype, jnp.floating)
    ]
    if not candidates:
        return None
    position, eta_id = candidates[-1]
    eta_shape = flat.avals[eta_id].shape

    def inputs(z: Array, leaves: Any) -> dict:
        leaves = data_leaves if leaves is None else jax.tree_util.tree_leaves(leaves)
        return {source: z, **dict(zip(data_refs, leaves))}

    def predict(z: Array, data: Any = None) -> Array:
        (eta,) = flat.run(inputs(z, data), [eta_id], stop=position)
        return jnp.reshape(eta, (num_obs,))

    def log_likelihood(eta: Array, data: Any = None) -> Array:
        def one(e: Array) -> Array:
            (out,) = flat.run(inputs(z0, data), [output], override={eta_id: jnp.reshape(e, eta_shape)})
            return jnp.reshape(out, (num_obs,))

        batch = eta.shape[:-1]
        flat_eta = jnp.reshape(eta, (-1, num_obs))
        return jnp.reshape(jax.vmap(one)(flat_eta), batch + (num_obs,))

    rng = np.random.default_rng(0)
    z1 = z0 + jnp.asarray(rng.normal(size=z0.shape), z0.dtype)
    tangent = jnp.asarray(rng.normal(size=(num_obs,)), z0.dtype)

    def design_and_offset(data: Any) -> tuple[Array, Array]:
        return jax.jacfwd(predict)(z0, data), predict(jnp.zeros_like(z0), data)

    def check_values(data: Any, design: Array, offset: Array) -> tuple:
        """What :func:`_checks_hold` compares, at z1 and along ``tangent``."""
        eta1 = predict(z1, data)
        ell = lambda eta: log_likelihood(eta, data)  # noqa: E731
        diagonal = jax.jvp(ell, (eta1,), (jnp.ones_like(eta1),))[1]
        directional = jax.jvp(ell, (eta1,), (tangent.astype(eta1.dtype),))[1]
        return eta1, design @ z1 + offset, ell(eta1), jnp.reshape(fn(z1, data), (-1,)), diagonal, directional

    def replay(data: Any) -> tuple[Array, Array, Array]:
        design, offset = design_and_offset(data)
        return design, offset, _checks_hold(check_values(data, design, offset), tangent, rtol, jnp)

    # One compiled program each (data as arguments): run eagerly, every operation of the
    # model at all N rows would compile a program of its own (seconds of a first call).
    # They run once per plan, so they compile cheaply (logistic N = 100,000: 0.9 s less),
    # and once per structure (probe), so a new plan on new data compiles nothing.
    cheap = fast_compile(data, ONE_SHOT_BYTES)
    design, offset = probe(design_and_offset, cheap=cheap)(data)
    values = to_host(probe(check_values, cheap=cheap)(data, design, offset))
    if not _checks_hold(values, np.asarray(tangent), rtol, np):
        return None
    return LinearPredictor(design, offset, log_likelihood, predict, replay)


def _checks_hold(values: tuple, tangent: Array, rtol: float, xp: Any) -> Any:
    """Affinity of the predictor, η-substitution reproducing ``fn``, elementwise ℓ.

    ``values`` from ``check_values`` in :func:`find_linear_predictor`; ``xp`` is numpy
    (a decision on the host) or jax.numpy (a replay's flag).
    """
    eta1, affine, substituted, value, diagonal, directional = values
    scale = xp.max(xp.abs(diagonal)) + 1.0
    tangent = xp.asarray(tangent).astype(diagonal.dtype)
    return (
        xp.allclose(eta1, affine, rtol=rtol, atol=rtol)
        & xp.allclose(substituted, value, rtol=rtol, atol=rtol)
        & xp.all(xp.isfinite(directional))
        & (xp.max(xp.abs(directional - diagonal * tangent)) <= rtol * scale)
    )
