"""Interpret a jaxpr over symbolic arrays.

The user's parameter code (latent values -> distribution arguments) and the
canonical log density are traced together into one jaxpr; this module walks
it once, at analysis time, with each input latent replaced by a symbolic
array (:func:`~blrppl.symbolic.terms.variable`). Equations whose inputs are
all constant (data, folded parameter code) are evaluated as they are; the
rest follow the rules below. Any primitive without a rule, applied to a
random value, marks the factor non-conjugate in that variable.

Index-remapping primitives (broadcast, reshape, transpose, slice, gather with
constant indices, concatenate, pad, select with a constant predicate, ...) are
handled generically: the primitive is run on an integer iota in place of each
symbolic operand, and the positions it returns say where each output element
comes from.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.extend.core import jaxpr_as_fun

from blrppl.symbolic import algebra
from blrppl.symbolic.terms import (
    Index,
    Labels,
    NonConjugate,
    Poly,
    Term,
    VarAtom,
    constant,
)
from blrppl.symbolic.terms import ravel, simplify_index, unravel

LOGDET_NAME = "blrppl_logdet"

# Primitives that only move elements around: which arguments carry data.
_STRUCTURAL = {
    "broadcast_in_dim": (0,),
    "reshape": (0,),
    "transpose": (0,),
    "squeeze": (0,),
    "expand_dims": (0,),
    "rev": (0,),
    "slice": (0,),
    "dynamic_slice": (0,),
    "gather": (0,),
    "concatenate": None,  # every argument
    "stack": None,
    "pad": (0, 1),
    "select_n": "cases",  # every argument but the predicate
    "dynamic_update_slice": (0, 1),
    "copy": (0,),
    "copy_p": (0,),
    "optimization_barrier": None,
}

_CALLS = ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


class Poisoned:
    """A value that must be discarded (e.g. ``z + K`` in index normalisation)."""

    def __init__(self, var: str | None, reason: str):
        self.var = var
        self.reason = reason


def _is_key(value: Any) -> bool:
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def _is_symbolic(value: Any) -> bool:
    return isinstance(value, (Poly, Poisoned))


def _as_poly(value: Any, space: Labels) -> Poly:
    if isinstance(value, Poisoned):
        raise NonConjugate(value.var, value.reason)
    if isinstance(value, Poly):
        return value
    return constant(np.asarray(value), space)


def _is_categorical(value: Any) -> bool:
    return (
        isinstance(value, Poly)
        and len(value.terms) == 1
        and len(value.terms[0].atoms) == 1
        and value.terms[0].atoms[0].kind == "cat"
        and not value.terms[0].operands
        and value.terms[0].coeff == 1.0
        and not value.selectors
    )


def categorical_variable(name: str, shape: tuple[int, ...], space: Labels) -> Poly:
    """The value of a categorical latent: an integer index, enumerated on use."""
    labels = tuple(space.new(n) for n in shape)
    atom = VarAtom(name, "cat", tuple(Index((lab,)) for lab in labels), sizes=tuple(shape))
    return Poly(tuple(shape), labels, (Term(1.0, (), (atom,)),))


class Interpreter:
    """Walk a jaxpr with symbolic inputs (see the module docstring).

    Args:
      space: the label space shared with the expectation step.
      categorical: categorical variable name -> (value shape, number of
        categories).
    """

    def __init__(self, space: Labels, categorical: Mapping[str, tuple[tuple[int, ...], int]]):
        self.space = space
        self.categorical = dict(categorical)

    # -- driver -------------------------------------------------------------

    def run(self, closed_jaxpr, args: Sequence[Any]) -> list[Any]:
        jaxpr = closed_jaxpr.jaxpr
        return self._eval(jaxpr, closed_jaxpr.consts, args)

    def _eval(self, jaxpr, consts, args):
        env: dict = {}

        def read(v):
            if isinstance(v, jex_core.Literal):
                return np.asarray(v.val)
            return env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = c if _is_symbolic(c) or _is_key(c) else np.asarray(c)
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        live = _live_equations(jaxpr)
        needed = {v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)}
        for eqn in live:
            needed.update(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
        for eqn in live:
            invals = [read(v) for v in eqn.invars]
            self._used = [v in needed for v in eqn.outvars]  # read by rules that can skip outputs
            outvals = self._apply(eqn, invals)
            for v, out in zip(eqn.outvars, outvals):
                env[v] = out
        return [read(v) for v in jaxpr.outvars]

    def _apply(self, eqn, invals):
        prim = eqn.primitive
        if not any(_is_symbolic(v) for v in invals):
            out = prim.bind(*[v if _is_key(v) else jnp.asarray(v) for v in invals], **eqn.params)
            outs = out if prim.multiple_results else [out]
            return [o if _is_key(o) else np.asarray(o) for o in outs]
        name = prim.name
        if name in _CALLS:
            return self._call(eqn, invals)
        rule = getattr(self, f"_rule_{name}", None)
        if rule is not None:
            out = rule(eqn, *invals)
            return out if prim.multiple_results else [out]
        if name in _STRUCTURAL:
            return [self._structural(eqn, invals)]
        var = next((_first_var(v) for v in invals if _is_symbolic(v)), None)
        raise NonConjugate(var, f"the operation {name!r} applied to {var!r}")

    def _call(self, eqn, invals):
        params = eqn.params
        if params.get("name") == LOGDET_NAME:
            return [algebra.logdet(_as_poly(invals[0], self.space))]
        inner = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
        if hasattr(inner, "jaxpr"):
            return self._eval(inner.jaxpr, inner.consts, invals)
        return self._eval(inner, (), invals)

    # -- arithmetic -----------------------------------------------------------

    def _rule_add(self, eqn, x, y):
        if _is_categorical(x) or _is_categorical(y):
            var = _first_var(x if _is_categorical(x) else y)
            return Poisoned(var, f"arithmetic on the categorical index {var!r}")
        return algebra.add(_as_poly(x, self.space), _as_poly(y, self.space), self.space)

    def _rule_sub(self, eqn, x, y):
        return algebra.sub(_as_poly(x, self.space), _as_poly(y, self.space), self.space)

    def _rule_mul(self, eqn, x, y):
        return algebra.mul(_as_poly(x, self.space), _as_poly(y, self.space), self.space)

    def _rule_neg(self, eqn, x):
        return algebra.neg(_as_poly(x, self.space))

    def _rule_div(self, eqn, x, y):
        x = _as_poly(x, self.space)
        if _is_symbolic(y):
            return algebra.mul(x, algebra.power(_as_poly(y, self.space), -1, self.space), self.space)
        return algebra.mul(x, constant(1.0 / np.asarray(y, float), self.space), self.space)

    def _rule_integer_pow(self, eqn, x):
        return algebra.power(_as_poly(x, self.space), eqn.params["y"], self.space)

    def _rule_square(self, eqn, x):
        return algebra.power(_as_poly(x, self.space), 2, self.space)

    def _rule_sqrt(self, eqn, x):
        return algebra.power(_as_poly(x, self.space), 0.5, self.space)

    def _rule_rsqrt(self, eqn, x):
        return algebra.power(_as_poly(x, self.space), -0.5, self.space)

    def _rule_pow(self, eqn, x, y):
        if _is_symbolic(y):
            var = _first_var(y)
            raise NonConjugate(var, f"a power with the random exponent {var!r}")
        exponent = np.asarray(y)
        if exponent.size != 1 and not np.all(exponent == exponent.flat[0]):
            raise NonConjugate(_first_var(x), "an elementwise-varying power of a random value")
        return algebra.power(_as_poly(x, self.space), float(exponent.flat[0]), self.space)

    def _rule_log(self, eqn, x):
        return algebra.log(_as_poly(x, self.space), self.space)

    def _rule_log1p(self, eqn, x):
        one = constant(np.ones(()), self.space)
        return algebra.log(algebra.add(one, _as_poly(x, self.space), self.space), self.space)

    def _rule_convert_element_type(self, eqn, x):
        return x

    def _rule_reduce_precision(self, eqn, x):
        return x

    def _rule_reduce_sum(self, eqn, x):
        return algebra.reduce_sum(_as_poly(x, self.space), eqn.params["axes"], self.space)

    def _rule_dot_general(self, eqn, x, y):
        return algebra.dot_general(
            _as_poly(x, self.space), _as_poly(y, self.space), eqn.params["dimension_numbers"], self.space
        )

    # -- categorical indices -----------------------------------------------------

    def _rule_lt(self, eqn, x, y):
        if _is_index(x, self.space) and not _is_symbolic(y) and np.all(np.asarray(y) <= 0):
            return np.zeros(eqn.outvars[0].aval.shape, bool)
        var = _first_var(x) or _first_var(y)
        raise NonConjugate(var, f"a comparison involving the random value {var!r}")

    def _rule_ge(self, eqn, x, y):
        if _is_index(x, self.space) and not _is_symbolic(y) and np.all(np.asarray(y) <= 0):
            return np.ones(eqn.outvars[0].aval.shape, bool)
        var = _first_var(x) or _first_var(y)
        raise NonConjugate(var, f"a comparison involving the random value {var!r}")

    def _rule_eq(self, eqn, x, y):
        if _is_categorical(y) and not _is_categorical(x):
            x, y = y, x
        if not _is_categorical(x) or _is_symbolic(y):
            var = _first_var(x) or _first_var(y)
            raise NonConjugate(var, f"an equality test involving the random value {var!r}")
        atom = x.terms[0].atoms[0]
        value = np.broadcast_to(np.asarray(y), x.shape).astype(int)
        category = simplify_index(Index(x.labels, value)) if x.shape else Index((), value)
        num = self.categorical[atom.var][1]
        one_hot = VarAtom(atom.var, "one_hot", atom.index + (category,), sizes=atom.sizes + (num,))
        return Poly(x.shape, x.labels, (Term(1.0, (), (one_hot,)),))

    def _rule_select_n(self, eqn, predicate, *cases):
        if not _is_symbolic(predicate):
            return self._structural(eqn, [predicate, *cases])
        if len(cases) != 2:
            raise NonConjugate(_first_var(predicate), "a multi-way select on a random value")
        p = _as_poly(predicate, self.space)
        on_false, on_true = (_as_poly(c, self.space) for c in cases)
        one = constant(np.ones(()), self.space)
        not_p = algebra.sub(one, p, self.space)
        return algebra.add(algebra.mul(p, on_true, self.space), algebra.mul(not_p, on_false, self.space), self.space)

    def _rule_dynamic_slice(self, eqn, operand, *starts):
        if not any(_is_symbolic(v) for v in starts):
            return self._structural(eqn, [operand, *starts])
        cats = [v for v in starts if _is_symbolic(v)]
        if len(cats) != 1 or not _is_categorical(cats[0]) or cats[0].shape != ():
            raise NonConjugate(_first_var(cats[0]), "a slice at a random position other than one scalar categorical")
        (z,) = cats
        var = z.terms[0].atoms[0].var
        _, num = self.categorical[var]
        operand_shape = tuple(eqn.invars[0].aval.shape)
        iota = jnp.arange(int(np.prod(operand_shape)), dtype=jnp.int32).reshape(operand_shape)
        positions = []
        for k in range(num):
            args = [jnp.asarray(k if _is_symbolic(v) else v, jnp.int32) for v in starts]
            positions.append(np.asarray(eqn.primitive.bind(iota, *args, **eqn.params)))
        extended = algebra.reindex(_as_poly(operand, self.space), np.stack(positions, -1), self.space)
        category = extended.labels[-1]
        selector = VarAtom(var, "one_hot", (Index((category,)),), sizes=(num,))
        shape = tuple(eqn.outvars[0].aval.shape)
        return Poly(shape, extended.labels[:-1], extended.terms, extended.selectors + (selector,))

    def _rule_scan(self, eqn, *invals):
        """A scan interpreted as a scan: carries that restart from the inputs.

        ``numpyro.contrib.control_flow.scan`` bodies carry the previous latent
        state, a step counter and PRNG keys. Carries that are not random (the
        counter, keys) are run concretely once; a random carry may depend on
        the step's inputs but not on the previous random carry (the state is
        the substituted value of a latent, not an accumulation). Then every
        step is one vmapped call of the body over time, once to get the new
        carries and once with the shifted carries for the outputs, and that
        array program is interpreted symbolically; nothing is unrolled.
        """
        params = eqn.params
        num_consts, num_carry, length = params["num_consts"], params["num_carry"], params["length"]
        body = params["jaxpr"]
        # Stacked outputs nobody reads (e.g. the scale of another site of the body) are
        # not interpreted: a non-conjugate expression there must not fail this factor.
        used_ys = list(getattr(self, "_used", [True] * len(eqn.outvars)))[num_carry:]
        var = next((_first_var(v) for v in invals if _is_symbolic(v)), None)
        if params.get("reverse"):
            raise NonConjugate(var, "a reversed scan over random values")
        depends = _output_dependencies(body.jaxpr)
        symbolic_in = {i for i, v in enumerate(invals) if _is_symbolic(v)}
        carry_in = {k: num_consts + k for k in range(num_carry)}
        random_carry = {k for k in range(num_carry) if carry_in[k] in symbolic_in}
        changed = True
        while changed:
            changed = False
            for k in range(num_carry):
                sources = symbolic_in | {carry_in[j] for j in random_carry}
                if k not in random_carry and depends[k] & sources:
                    random_carry.add(k)
                    changed = True
        for k in random_carry:
            if depends[k] & {carry_in[j] for j in random_carry}:
                raise NonConjugate(
                    var,
                    "a scan whose random carry accumulates (the next carry depends on the previous "
                    "random one); write the state as a latent sample site inside the scan",
                )
        fixed = [k for k in range(num_carry) if k not in random_carry]
        avals = [v.aval for v in eqn.invars]
        examples = [
            jnp.zeros(a.shape, a.dtype) if _is_symbolic(v) else (v if _is_key(v) else jnp.asarray(v))
            for v, a in zip(invals, avals)
        ]
        fn = jaxpr_as_fun(body)
        consts_ex = examples[:num_consts]
        xs_ex = examples[num_consts + num_carry :]

        def trajectory(carry, xs):
            out = fn(*consts_ex, *carry, *xs)
            return tuple(out[:num_carry]), tuple(carry[k] for k in fixed)

        final_ex, fixed_stack = jax.lax.scan(
            trajectory, tuple(examples[num_consts : num_consts + num_carry]), tuple(xs_ex), length=length
        )

        def program(consts, init, xs, fixed_stack):
            def step(fixed_t, random_t, xs_t):
                carry = [None] * num_carry
                for k, value in zip(fixed, fixed_t):
                    carry[k] = value
                for k, value in zip(sorted(random_carry), random_t):
                    carry[k] = value
                return fn(*consts, *carry, *xs_t)

            random_init = [init[k] for k in sorted(random_carry)]
            first = jax.vmap(step, in_axes=(0, None, 0), axis_size=length)(fixed_stack, random_init, xs)
            new = [first[k] for k in sorted(random_carry)]
            shifted = [jnp.concatenate([jnp.expand_dims(i, 0), n[:-1]], 0) for i, n in zip(random_init, new)]
            second = jax.vmap(step, in_axes=(0, 0, 0), axis_size=length)(fixed_stack, shifted, xs)
            finals = [None] * num_carry
            for k, n in zip(sorted(random_carry), new):
                finals[k] = n[-1]
            return finals, [y for y, used in zip(second[num_carry:], used_ys) if used]

        closed = jax.make_jaxpr(
            lambda consts, init, xs, fs: program(consts, init, xs, fs)
        )(consts_ex, examples[num_consts : num_consts + num_carry], xs_ex, fixed_stack)
        outs = self._eval(
            closed.jaxpr,
            closed.consts,
            list(invals[:num_consts]) + list(invals[num_consts : num_consts + num_carry]) + list(invals[num_consts + num_carry :]) + list(fixed_stack),
        )
        finals = outs[: len(random_carry)]
        read_ys = iter(outs[len(random_carry) :])
        ys = [
            next(read_ys) if used else np.zeros(v.aval.shape, v.aval.dtype)
            for used, v in zip(used_ys, eqn.outvars[num_carry:])
        ]
        carries = []
        random_order = sorted(random_carry)
        for k in range(num_carry):
            if k in random_carry:
                carries.append(finals[random_order.index(k)])
            else:
                value = final_ex[k]
                carries.append(value if _is_key(value) else np.asarray(value))
        return carries + ys

    def _rule_gather(self, eqn, operand, indices):
        if not _is_symbolic(indices):
            return self._structural(eqn, [operand, indices])
        return self._enumerate_gather(eqn, operand, indices)

    # -- index remapping ----------------------------------------------------------

    def _structural(self, eqn, invals):
        prim, params = eqn.primitive, eqn.params
        spec = _STRUCTURAL[prim.name]
        if spec is None:
            data = list(range(len(invals)))
        elif spec == "cases":
            data = list(range(1, len(invals)))
        else:
            data = list(spec)
        for i, v in enumerate(invals):
            if i not in data and _is_symbolic(v):
                raise NonConjugate(_first_var(v), f"a random index or shape in {prim.name!r}")
        out_shape = eqn.outvars[0].aval.shape
        if prim.name == "select_n":
            predicate = np.asarray(invals[0])
        result = None
        for j in data:
            value = invals[j]
            if prim.name == "select_n" and not np.any(predicate == (j - 1)):
                continue  # This case is never selected.
            args = []
            for i, v in enumerate(invals):
                shape = tuple(eqn.invars[i].aval.shape)
                if i == j:
                    args.append(jnp.arange(int(np.prod(shape)), dtype=jnp.int32).reshape(shape))
                elif i in data:
                    args.append(jnp.full(shape, -1, jnp.int32))
                else:
                    args.append(jnp.asarray(v))
            positions = np.asarray(prim.bind(*args, **_int_params(prim.name, params)))
            if np.all(positions < 0):
                continue
            piece = algebra.reindex(_as_poly(value, self.space), positions, self.space)
            result = piece if result is None else algebra.add(result, piece, self.space)
        if result is None:
            return np.zeros(out_shape)
        return _merge_categorical(result, self.space)

    def _enumerate_gather(self, eqn, operand, indices):
        """``operand[z]`` for a categorical latent z: a selector over its categories."""
        params = eqn.params
        poly = _as_poly(indices, self.space)
        cats = {a.var for t in poly.terms for a in t.atoms if a.kind == "cat"}
        if len(cats) != 1 or any(a.kind != "cat" for t in poly.terms for a in t.atoms) or poly.selectors:
            raise NonConjugate(_first_var(poly), "an index computed from random values other than one categorical latent")
        (var,) = cats
        z_value_shape, num = self.categorical[var]
        dn = params["dimension_numbers"]
        out_shape = tuple(eqn.outvars[0].aval.shape)
        offset_dims = tuple(dn.offset_dims)
        batch_dims = [d for d in range(len(out_shape)) if d not in offset_dims]
        operand_shape = np.shape(operand) if not isinstance(operand, Poly) else operand.shape
        # Which element of z each index position reads (-1: a constant component).
        element_ids = _densify_categorical(poly, var, None, z_value_shape, self.space)
        positions = []
        for k in range(num):
            idx_k = _densify_categorical(poly, var, k, z_value_shape, self.space).astype(np.int32)
            iota = jnp.arange(int(np.prod(operand_shape)), dtype=jnp.int32).reshape(operand_shape)
            positions.append(
                np.asarray(eqn.primitive.bind(iota, jnp.asarray(idx_k), **_int_params("gather", params)))
            )
        positions = np.stack(positions, axis=-1)
        extended = algebra.reindex(_as_poly(operand, self.space), positions, self.space)
        category_label = extended.labels[-1]
        labels = extended.labels[:-1]
        # The z element read at each output position, from the index batch dims.
        ids = element_ids.max(axis=-1) if element_ids.ndim else element_ids
        coords = np.indices(out_shape) if out_shape else np.zeros((0,), int)
        batch_coords = tuple(coords[d] for d in batch_dims)
        ids_out = ids[batch_coords] if batch_coords else np.broadcast_to(ids, out_shape)
        ids_out = _fill_constant_ids(ids_out)
        z_coords = unravel(ids_out, z_value_shape) if z_value_shape else ()
        z_index = tuple(
            simplify_index(Index(labels, np.asarray(c)), n) for c, n in zip(z_coords, z_value_shape)
        )
        selector = VarAtom(
            var, "one_hot", z_index + (Index((category_label,)),), sizes=tuple(z_value_shape) + (num,)
        )
        return Poly(out_shape, labels, extended.terms, extended.selectors + (selector,))


def _is_index(value: Any, space: Labels) -> bool:
    """A categorical latent as an index, possibly a constant (non-negative) one at some positions.

    The second form is a scan's previous state when the initial carry is a
    constant: ``[c, z_0, z_1, ...]``.
    """
    if _is_categorical(value):
        return True
    if not isinstance(value, Poly) or value.selectors or not value.terms:
        return False
    variables = set()
    for term in value.terms:
        if not term.atoms:
            if any(np.any(np.asarray(op.array) < 0) for op in term.operands) or term.coeff < 0:
                return False
            continue
        if len(term.atoms) != 1 or term.atoms[0].kind != "cat" or term.coeff != 1.0:
            return False
        variables.add(term.atoms[0].var)
    return len(variables) == 1


def _fill_constant_ids(ids: np.ndarray) -> np.ndarray:
    """Element ids of a gather index, with constant positions (-1) given a neighbour's id.

    Where an index is a constant, ``operand[c]`` is the same for every category
    k, and the selector ``one_hot(z_p)_k`` sums to one over k whatever p is. A
    nearby p (the next categorical position in C order, else the previous)
    keeps the term's reads of z close in time, which a chain's q needs.
    """
    flat = np.asarray(ids).reshape(-1).copy()
    known = np.flatnonzero(flat >= 0)
    if known.size == 0 or known.size == flat.size:
        return np.asarray(ids)
    missing = np.flatnonzero(flat < 0)
    after = np.searchsorted(known, missing)
    nearest = known[np.minimum(after, known.size - 1)]
    flat[missing] = flat[nearest]
    return flat.reshape(np.shape(ids))


def _merge_categorical(poly: Poly, space: Labels) -> Poly:
    """Pieces of one categorical index joined by a structural primitive, as one index.

    A scan's previous state is the initial state at step 0 and the stacked
    states after it (a concatenation): terms ``mask_i * z[positions_i]`` whose
    0/1 masks partition the output become one ``z[positions]``, so the result
    can index (``trans[z_prev]``) like the variable itself. Anything else is
    returned unchanged.
    """
    if not isinstance(poly, Poly) or len(poly.terms) < 2 or poly.selectors or not poly.shape:
        return poly
    own = set(poly.labels)
    atoms = [t.atoms for t in poly.terms]
    if any(len(a) != 1 or a[0].kind != "cat" or not a[0].labels <= own for a in atoms):
        return poly
    var, sizes = atoms[0][0].var, atoms[0][0].sizes
    if any(a[0].var != var or a[0].sizes != sizes for a in atoms):
        return poly
    total = np.zeros(poly.shape)
    for term in poly.terms:
        if any(not set(op.labels) <= own for op in term.operands):
            return poly
        dense = np.full(poly.shape, term.coeff, float)
        for op in term.operands:
            dense = dense * _operand_dense(op, poly.labels, space)
        if not np.all((dense == 0) | (dense == 1)):
            return poly
        total = total + dense
    if not np.all(total == 1):
        return poly
    ids = _densify_categorical(poly, var, None, sizes, space)
    coords = unravel(ids, sizes) if sizes else ()
    index = tuple(simplify_index(Index(poly.labels, np.asarray(c)), n) for c, n in zip(coords, sizes))
    atom = VarAtom(var, "cat", index, sizes=sizes)
    return Poly(poly.shape, poly.labels, (Term(1.0, (), (atom,)),))


def _densify_categorical(
    poly: Poly, var: str, k: int | None, value_shape: tuple[int, ...], space: Labels
) -> np.ndarray:
    """Evaluate an index Poly with z := k, or (k None) with z := its element id.

    With ``k`` None, positions that hold a constant component read -1.
    """
    out = np.zeros(poly.shape)
    for term in poly.terms:
        dense = np.full(poly.shape, term.coeff, float)
        for op in term.operands:
            dense = dense * _operand_dense(op, poly.labels, space)
        if term.atoms:
            (atom,) = term.atoms
            if k is None:
                coords = [_index_dense(idx, poly.labels, space) for idx in atom.index]
                coords = np.broadcast_arrays(*coords) if coords else []
                ids = ravel(tuple(coords), value_shape) if coords else 0
                dense = dense * (np.asarray(ids) + 1.0)
            else:
                dense = dense * float(k)
        elif k is None:
            dense = dense * 0.0
        out = out + dense
    out = np.rint(out).astype(np.int64)
    return out - 1 if k is None else out


def _operand_dense(op, labels: Sequence, space: Labels) -> np.ndarray:
    arr = np.asarray(op.array, float)
    own = list(op.labels)
    order = [own.index(lab) for lab in labels if lab in own]
    arr = np.transpose(arr, order) if arr.ndim else arr
    dims = iter(arr.shape)
    return arr.reshape([next(dims) if lab in own else 1 for lab in labels])


def _index_dense(idx: Index, labels: Sequence, space: Labels) -> np.ndarray:
    """An Index as a dense integer array over ``labels`` (broadcastable)."""
    shape = [space.size[lab] for lab in labels]
    if idx.direct:
        axis = list(labels).index(idx.labels[0])
        view = [1] * len(labels)
        view[axis] = shape[axis]
        return np.arange(shape[axis]).reshape(view)
    arr = np.asarray(idx.array)
    own = list(idx.labels)
    order = [own.index(lab) for lab in labels if lab in own]
    arr = np.transpose(arr, order) if arr.ndim else arr
    dims = iter(arr.shape)
    return arr.reshape([next(dims) if lab in own else 1 for lab in labels])


def _output_dependencies(jaxpr) -> list[set]:
    """For each output of a jaxpr, the positions of the inputs it depends on."""
    deps: dict = {v: {i} for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        sources: set = set()
        for v in eqn.invars:
            if not isinstance(v, jex_core.Literal):
                sources |= deps.get(v, set())
        for v in eqn.outvars:
            deps[v] = sources
    return [set() if isinstance(v, jex_core.Literal) else deps.get(v, set()) for v in jaxpr.outvars]


def _live_equations(jaxpr) -> list:
    """The equations the outputs depend on (dead code, e.g. unused argument
    validation in numpyro constructors, is skipped)."""
    needed = {v for v in jaxpr.outvars if not isinstance(v, jex_core.Literal)}
    live = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            live.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
    return live[::-1]


def _first_var(value: Any):
    if isinstance(value, Poisoned):
        return value.var
    if isinstance(value, Poly):
        names = sorted(value.variables)
        return names[0] if names else None
    return None


def _int_params(name: str, params: dict) -> dict:
    """Primitive parameters with dtypes switched to int32 where they are named."""
    params = dict(params)
    if "preferred_element_type" in params:
        params["preferred_element_type"] = None
    if name == "gather":
        params["fill_value"] = -1
    return params


def blrppl_logdet(x: jax.Array) -> jax.Array:
    """log |x| of symmetric positive-definite matrices; recognised symbolically.

    Canonical log densities call this (through :func:`logdet`) so that the
    interpreter sees one named call instead of a Cholesky factorisation.
    """
    chol = jnp.linalg.cholesky(x)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)


logdet = jax.jit(blrppl_logdet)
