"""``scan`` in the symbolic interpreter: interpreted as a scan, never unrolled.

``numpyro.contrib.control_flow.scan`` bodies carry the previous latent state,
a step counter and PRNG keys. Carries that are not random (the counter, keys)
are run concretely once; a random carry may depend on the step's inputs but
not on the previous random carry (the state is the substituted value of a
latent, not an accumulation). Then every step is one vmapped call of the body
over time, once to get the new carries and once with the shifted carries for
the outputs, and that array program is interpreted symbolically: its cost
does not grow with the number of steps T.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from blrppl.compile_mode import to_device
from blrppl.graph import tape
from blrppl.graph.jaxpr import input_dependencies
from blrppl.symbolic.terms import NonConjugate
from blrppl.symbolic.values import first_var, is_key, is_symbolic


def interpret_scan(interp: Any, eqn: Any, invals: Sequence[Any], used: Sequence[bool]) -> list:
    """The outputs of a ``scan`` equation with symbolic inputs (see the module docstring).

    Args:
      interp: the :class:`~blrppl.symbolic.interpret.Interpreter`.
      eqn: the ``scan`` equation.
      invals: its input values (constants, carries, stacked inputs).
      used: for each output, whether anything reads it. Stacked outputs
        nobody reads (e.g. the scale of another site of the body) are not
        interpreted: a non-conjugate expression there must not fail this
        factor.

    Raises:
      NonConjugate: for a reversed scan, or a random carry that accumulates.
    """
    params = eqn.params
    num_consts, num_carry, length = params["num_consts"], params["num_carry"], params["length"]
    body = params["jaxpr"]
    used_ys = list(used)[num_carry:]
    var = next((first_var(v) for v in invals if is_symbolic(v)), None)
    if params.get("reverse"):
        raise NonConjugate(var, "a reversed scan over random values")
    depends = input_dependencies(body.jaxpr)
    symbolic_in = {i for i, v in enumerate(invals) if is_symbolic(v)}
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
    # The concrete trajectory of the fixed carries reads only the inputs they depend on: data
    # on a tape (:mod:`blrppl.graph.tape`) that they do not read enter it unguarded, so a
    # replan on new data replays the symbolic program below instead of refusing all data.
    read = _fixed_carry_inputs(depends, fixed, carry_in)
    examples = [
        to_device(np.zeros(a.shape, a.dtype)) if is_symbolic(v)  # transfers: eager jnp ops compile
        else v if is_key(v)
        else to_device(v if i in read else tape.strip(v))
        for i, (v, a) in enumerate(zip(invals, avals))
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
        return finals, [y for y, keep in zip(second[num_carry:], used_ys) if keep]

    closed = jax.make_jaxpr(
        lambda consts, init, xs, fs: program(consts, init, xs, fs)
    )(consts_ex, examples[num_consts : num_consts + num_carry], xs_ex, fixed_stack)
    outs = interp.evaluate(closed.jaxpr, closed.consts, list(invals) + list(fixed_stack))
    finals = outs[: len(random_carry)]
    read_ys = iter(outs[len(random_carry) :])
    ys = [
        next(read_ys) if keep else np.zeros(v.aval.shape, v.aval.dtype)
        for keep, v in zip(used_ys, eqn.outvars[num_carry:])
    ]
    carries = []
    random_order = sorted(random_carry)
    for k in range(num_carry):
        if k in random_carry:
            carries.append(finals[random_order.index(k)])
        else:
            value = final_ex[k]
            carries.append(value if is_key(value) else np.asarray(value))
    return carries + ys


def _fixed_carry_inputs(depends: Sequence[set], fixed: Sequence[int], carry_in: dict) -> set:
    """The body inputs that the fixed (non-random) carries depend on, through each other."""
    inputs, seen, stack = set(), set(), list(fixed)
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        inputs |= depends[k]
        stack.extend(j for j in fixed if carry_in[j] in depends[k])
    return inputs
