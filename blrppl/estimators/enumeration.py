"""Finite discrete q in factors without exact site parameters: enumeration.

A Bernoulli or Categorical neighbour of a non-conjugate factor needs no
sampler: its expectation is a finite sum, exactly what NumPyro's enumeration
computes. With q(z) = Π_p π_p(z_p) (mean-field over positions p),

    E_q[log f] = Σ_c w_c(π) E_q(u)[log f_c(u)],

a sum over *configurations* c of the discrete neighbours (values 0..K-1) with weights
w_c(π) that are products of their probabilities, and the expectation over the
continuous neighbours u by their own estimator (Bonnet/Price for Gaussians,
Khan & Rue, Eqs. 10-11). The expected log factor is multilinear in the
probabilities, so its gradient with respect to them, the mean parameters of
Bernoulli (p) and Categorical (π) q, is the natural gradient (Khan & Rue,
Sec. 2): autodiff of the enumerated expectation.

Two layouts of the sum, chosen once per factor (:func:`plan_enumeration`):

- *separable*: each element i of the factor (one observation) reads one
  position p_v(i) of each discrete neighbour v (``y_n ~ f(loc[z_n])``), found
  by probing the factor's per-element log densities and checked on random
  configurations. Then c ranges over the Π_v K_v joint categories, every
  position of v set to c_v, and element i is weighted by
  Π_v π_v(p_v(i), c_v): cost Π_v K_v evaluations, whatever the plate sizes.
- *joint*: otherwise, every joint configuration of the neighbours' positions,
  while there are at most :data:`ENUMERATION_BUDGET` of them.

Past the budget, a factor that is not separable raises
:class:`~blrppl.errors.ModelError` naming it (write one observation per
position, or marginalise the variable in the model).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

ENUMERATION_BUDGET = 100_000
"""The most configurations a factor's discrete neighbours are enumerated over."""

PROBE_TRIALS = 3


class Enumeration(NamedTuple):
    """How one factor's discrete neighbours are enumerated (static).

    Attributes:
      variables: the discrete neighbours.
      configs: variable -> integer category indices of each configuration,
        shape ``(C,) + value shape``.
      positions: separable layout: variable -> the flat position each element
        of the factor reads, shape (M,); None for the joint layout.
      dtypes: variable -> the dtype of its values in the model.
    """

    variables: tuple[str, ...]
    configs: dict
    positions: Optional[dict]
    dtypes: dict

    @property
    def num_configs(self) -> int:
        return int(next(iter(self.configs.values())).shape[0])


def is_enumerable(q: Any) -> bool:
    """Whether the variable's q is finite discrete (not a chain): it is enumerated."""
    return q.family.support_probs is not None and not q.family.chain


def num_categories(q: Any) -> int:
    """K of a finite discrete q."""
    return q.num_categories if q.num_categories else 2


def joint_size(qs: Mapping[str, Any], variables: Sequence[str]) -> float:
    """The number of joint configurations of ``variables`` (a float: it may be huge)."""
    return math.prod(float(num_categories(qs[v])) ** math.prod(qs[v].shape) for v in variables)


def joint_enumeration(qs: Mapping[str, Any], variables: Sequence[str], dtypes: Mapping[str, str]) -> Enumeration:
    """Every joint configuration of ``variables``' positions (at most the budget)."""
    shapes = [tuple(qs[v].shape) for v in variables]
    ranges = [range(num_categories(qs[v])) for v, shape in zip(variables, shapes) for _ in range(math.prod(shape))]
    table = np.array(list(itertools.product(*ranges)), dtype=np.int32).reshape(-1, sum(math.prod(s) for s in shapes))
    configs, start = {}, 0
    for v, shape in zip(variables, shapes):
        size = math.prod(shape)
        configs[v] = table[:, start : start + size].reshape((-1,) + shape)
        start += size
    return Enumeration(tuple(variables), configs, None, dict(dtypes))


def plan_enumeration(
    qs: Mapping[str, Any],
    variables: Sequence[str],
    elements: Callable[[Mapping[str, Any]], jax.Array],
    examples: Mapping[str, Any],
    seed: int = 0,
) -> Optional[Enumeration]:
    """The enumeration of a factor's discrete ``variables`` (module docstring), or None.

    Args:
      qs: every variable's q.
      variables: the factor's discrete neighbours.
      elements: ``values -> (M,)`` per-element log densities of the factor,
        ``values`` holding every neighbour (discrete ones as category values).
      examples: a value of every neighbour (continuous ones in q's space);
        probing moves the continuous ones to random nearby values so that
        different categories give different densities.

    Returns:
      The separable layout when the probes find one, else the joint layout
      within the budget, else None.
    """
    rng = np.random.default_rng(seed)
    values = dict(examples)
    for v, x in examples.items():
        if v not in variables and jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
            x = np.asarray(x)
            values[v] = jnp.asarray(x + rng.normal(size=x.shape) * (0.3 + 0.3 * np.abs(x)), x.dtype)
    dtypes = {v: str(jnp.asarray(examples[v]).dtype) for v in variables}

    def evaluate(assignment: Mapping[str, np.ndarray]) -> np.ndarray:
        chosen = {v: jnp.asarray(assignment[v], dtypes[v]) for v in variables}
        return np.asarray(elements({**values, **chosen}))

    positions = _probe_positions(qs, variables, evaluate, rng)
    if positions is not None:
        combos = list(itertools.product(*[range(num_categories(qs[v])) for v in variables]))
        if len(combos) <= ENUMERATION_BUDGET:
            configs = {
                v: np.broadcast_to(
                    np.array([c[j] for c in combos], np.int32).reshape((-1,) + (1,) * len(qs[v].shape)),
                    (len(combos),) + tuple(qs[v].shape),
                ).copy()
                for j, v in enumerate(variables)
            }
            return Enumeration(tuple(variables), configs, positions, dtypes)
    if joint_size(qs, variables) <= ENUMERATION_BUDGET:
        return joint_enumeration(qs, variables, dtypes)
    return None


def _probe_positions(qs, variables, evaluate, rng) -> Optional[dict]:
    """Which position of each discrete variable each element reads, or None.

    One variable at a time (the others at a base configuration): flipping the
    positions whose bit t is set changes exactly the elements whose position
    has bit t set, which spells each element's position in binary. Random
    half-and-half configurations then check that every element depends on
    that one position only.
    """
    base = {v: rng.integers(0, num_categories(qs[v]), size=qs[v].shape) for v in variables}
    reference = evaluate(base)
    if reference.ndim != 1:
        return None
    positions = {}
    for v in variables:
        k = num_categories(qs[v])
        size = math.prod(qs[v].shape)
        other = (base[v] + rng.integers(1, k, size=qs[v].shape)) % k
        flat_index = np.arange(size).reshape(qs[v].shape)
        code = np.zeros(reference.shape, np.int64)
        for bit in range(max(1, (size - 1).bit_length())):
            flip = ((flat_index >> bit) & 1).astype(bool)
            changed = evaluate({**base, v: np.where(flip, other, base[v])}) != reference
            code |= changed.astype(np.int64) << bit
        if np.any(code >= size):
            return None
        for _ in range(PROBE_TRIALS):
            a = rng.integers(0, k, size=qs[v].shape)
            b = (a + rng.integers(1, k, size=qs[v].shape)) % k
            take = rng.random(qs[v].shape) < 0.5
            mixed = evaluate({**base, v: np.where(take, a, b)})
            from_a, from_b = evaluate({**base, v: a}), evaluate({**base, v: b})
            predicted = np.where(take.reshape(-1)[code], from_a, from_b)
            if not np.array_equal(mixed, predicted, equal_nan=True):
                return None
        positions[v] = code
    return positions


def config_weights(
    qs: Mapping[str, Any], enumeration: Enumeration, mean: Mapping[str, Any], positions: Optional[Mapping[str, Any]]
) -> jax.Array:
    """w, shape (C, M) (separable) or (C, 1) (joint): the configurations' probabilities under q.

    ``positions`` are the separable layout's (an argument: they may come from
    data, e.g. a latent indexed by a data column), None for the joint one.
    """
    total = None
    for v in enumeration.variables:
        q = qs[v]
        probs = q.family.support_probs(q, mean[v])
        probs = jnp.reshape(probs, (-1, probs.shape[-1]))  # (positions, K)
        configs = jnp.asarray(enumeration.configs[v]).reshape(enumeration.num_configs, -1)  # (C, positions)
        if positions is None:
            picked = jnp.take_along_axis(probs[None], configs[..., None], axis=-1)[..., 0]  # (C, positions)
            w = jnp.prod(picked, axis=1, keepdims=True)
        else:
            rows = probs[jnp.asarray(positions[v])]  # (M, K)
            w = rows[:, configs[:, 0]].T  # every position of v holds the same category in config c
        total = w if total is None else total * w
    return total


def enumerated_expectation(
    qs: Mapping[str, Any],
    enumeration: Enumeration,
    continuous: Callable,
    *,
    sequential: bool = False,
) -> Callable:
    """``(rng_key, mean, log_elements, positions) -> (E_q[log f], site parameters)`` by enumeration.

    Args:
      qs: every variable's q.
      enumeration: the factor's :class:`Enumeration`.
      continuous: ``(rng_key, mean, log_f) -> (value, site parameters)`` over
        the factor's continuous neighbours
        (:func:`~blrppl.estimators.nonconjugate.expectation_over`), or None
        when every neighbour is discrete.
      sequential: evaluate configurations one at a time (``lax.map``) rather
        than batched (``vmap``), for factors whose code calls LAPACK.

    ``log_elements(values) -> (elements, extra)``: the per-element log
    densities (shape (M,); a single element for the joint layout) and a term
    that does not depend on the discrete values (a Jacobian), given the
    continuous values and the discrete ones of one configuration;
    ``positions`` is :attr:`Enumeration.positions` as arrays (None: joint).
    """
    variables = enumeration.variables
    num = enumeration.num_configs

    def estimate(rng_key, mean, log_elements, positions=None):
        chosen = {v: jnp.asarray(enumeration.configs[v], enumeration.dtypes[v]) for v in variables}
        weights, pullback = jax.vjp(lambda m: config_weights(qs, enumeration, m, positions), {v: mean[v] for v in variables})

        def expected(weights):
            def one(args):
                values, w = args

                def log_f(cont):
                    elements, extra = log_elements({**cont, **values})
                    return jnp.sum(w * elements) + extra / num

                if continuous is None:
                    return log_f({}), {}
                return continuous(rng_key, mean, log_f)

            if sequential:
                values, grads = jax.lax.map(one, (chosen, weights))
            else:
                values, grads = jax.vmap(one)((chosen, weights))
            return jnp.sum(values), jax.tree.map(lambda g: jnp.sum(g, axis=0), grads)

        (value, grads), d_weights = jax.value_and_grad(expected, has_aux=True)(weights)
        (discrete,) = pullback(d_weights)  # ∂ E_q[log f] / ∂μ of each discrete variable: its natural gradient
        return value, {**grads, **discrete}

    return estimate
