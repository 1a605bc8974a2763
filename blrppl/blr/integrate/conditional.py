"""The conditional fit q(c | h) as one pure function of h's unconstrained value u.

h lives on the unconstrained space of its support (numpyro ``biject_to``),
flattened into a vector u of dimension k. :class:`HyperSpace` packs and
unpacks it and gives log |det ∂h/∂u|. :func:`build_conditional` closes over
the conditional plan and its algorithm (:func:`~blrppl.blr.build.build_blr`)
and returns :class:`Conditional`, whose ``fit(u, arrays)`` starts q, runs the
BLR (one ρ = 1 step for an exact conditional; Newton steps until the ELBO
settles for Laplace) and returns the state and

    log_joint(u) = log p(y | h(u)) + log p(h(u)) + log |det ∂h/∂u|,

the log density of u and y that the grid integrates. For an exact conditional
the ELBO is log p(y | h) + log p(h) exactly (Khan & Rue, Sec. 5.1); for
Laplace it is Laplace's approximation of it, log p(y, m | h) + log p(h) +
½ log det(2π Σ) (the delta method's E_q[log f] is log f(m) + ½ tr(H Σ)).
Everything is differentiable in u (forward mode through the inner loop), and
u enters only through ``arrays.params``, so ``jax.vmap`` over u evaluates a
grid with one compiled program.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from blrppl.blr.build import build_blr
from blrppl.blr.config import Config
from blrppl.blr.plan import Plan
from blrppl.blr.state import BLRState, InferenceAlgorithm

#: The conditional fits are deterministic; their key only feeds ``init``.
FIT_SEED = 0


class HyperSpace(NamedTuple):
    """h's sites on their unconstrained space, flattened into one vector u.

    Attributes:
      sites: the hyperparameter sites, in order.
      shapes: each site's constrained shape.
      transforms: each site's numpyro transform from the unconstrained space.
      inverse_shapes: each site's unconstrained shape.
    """

    sites: tuple
    shapes: tuple
    transforms: tuple
    inverse_shapes: tuple

    @property
    def sizes(self) -> tuple:
        return tuple(int(math.prod(s)) for s in self.inverse_shapes)

    @property
    def dim(self) -> int:
        """k, the length of u."""
        return int(sum(self.sizes))

    def split(self, u: jax.Array) -> dict:
        """u ``(..., k)`` -> site -> unconstrained value ``(..., *shape)``."""
        out, offset = {}, 0
        lead = jnp.shape(u)[:-1]
        for site, shape, size in zip(self.sites, self.inverse_shapes, self.sizes):
            out[site] = jnp.reshape(u[..., offset : offset + size], lead + tuple(shape))
            offset += size
        return out

    def unpack(self, u: jax.Array) -> dict:
        """u -> site -> value in the site's support."""
        parts = self.split(u)
        return {site: t(parts[site]) for site, t in zip(self.sites, self.transforms)}

    def pack(self, values: dict) -> jax.Array:
        """Site values (constrained) -> u."""
        flat = [jnp.ravel(t.inv(jnp.asarray(values[site]))) for site, t in zip(self.sites, self.transforms)]
        if not flat:
            return jnp.zeros((0,), jnp.result_type(float))
        return jnp.concatenate(flat).astype(jnp.result_type(float))

    def log_jacobian(self, u: jax.Array) -> jax.Array:
        """log |det ∂h/∂u| (for one u)."""
        parts = self.split(u)
        total = jnp.zeros((), jnp.result_type(float))
        for site, t in zip(self.sites, self.transforms):
            x = parts[site]
            total = total + jnp.sum(t.log_abs_det_jacobian(x, t(x)))
        return total

    def site_slices(self) -> dict:
        """Site -> its slice of u."""
        out, offset = {}, 0
        for site, size in zip(self.sites, self.sizes):
            out[site] = slice(offset, offset + size)
            offset += size
        return out


def hyper_space(plan: Plan, sites: tuple) -> HyperSpace:
    """The :class:`HyperSpace` of h's sites in a conditional plan (they are its point estimates)."""
    transforms = tuple(plan.param_transforms[s] for s in sites)
    shapes = tuple(tuple(jnp.shape(plan.init_params[s])) for s in sites)
    inverse = tuple(tuple(t.inverse_shape(shape)) for t, shape in zip(transforms, shapes))
    return HyperSpace(tuple(sites), shapes, transforms, inverse)


@dataclasses.dataclass(frozen=True, eq=False)
class Conditional:
    """The compiled-once conditional fit (static: jitted functions take it as a static argument,
    hashed by identity, so an engine that keeps it reuses its compiled programs).

    Attributes:
      plan: the conditional plan (h as held point estimates).
      algorithm: its BLR algorithm.
      space: h's :class:`HyperSpace`.
      num_steps: the most BLR steps per fit (1 for an exact conditional).
      tol: an iterative fit stops once its ELBO changes by less than
        ``tol * (1 + |ELBO|)``.
    """

    plan: Plan
    algorithm: InferenceAlgorithm
    space: HyperSpace
    num_steps: int
    tol: float

    def with_hyper(self, u: jax.Array, arrays: Any) -> Any:
        """The plan's arrays with h(u) as the held point estimates."""
        return arrays._replace(params={**arrays.params, **self.space.unpack(u)})

    def start(self, u: jax.Array, arrays: Any) -> BLRState:
        """The BLR's initial state for h(u)."""
        return self.algorithm.init(jax.random.key(FIT_SEED), self.with_hyper(u, arrays))

    def fit(self, u: jax.Array, arrays: Any, state: Any = None) -> tuple[BLRState, jax.Array, jax.Array]:
        """q(c | h(u)): ``(state, log_joint(u), num_steps run)`` (module docstring); from
        ``state`` (:meth:`start`'s) when given."""
        if state is None:
            state = self.start(u, arrays)
        arrays = self.with_hyper(u, arrays)
        state, elbo = self.algorithm.step(state, arrays)
        elbo, steps = elbo.elbo, jnp.ones((), jnp.int32)
        if self.num_steps > 1:

            def cond(carry):
                i, _, value, previous = carry
                settled = jnp.abs(value - previous) <= self.tol * (1.0 + jnp.abs(value))
                return (i < self.num_steps) & ~settled

            def body(carry):
                i, state, value, _ = carry
                state, info = self.algorithm.step(state, arrays)
                return i + 1, state, info.elbo, value

            start = (steps, state, elbo, jnp.asarray(jnp.inf, elbo.dtype))
            steps, state, elbo, _ = jax.lax.while_loop(cond, body, start)
        return state, elbo + self.space.log_jacobian(u), steps

    def log_joint(self, u: jax.Array, arrays: Any) -> jax.Array:
        """log p(y, u): the evidence of the conditional fit plus log p(h) and the log-Jacobian."""
        return self.fit(u, arrays)[1]


def build_conditional(plan: Plan, config: Config, sites: tuple, inner: str, num_steps: int, tol: float) -> Conditional:
    """The :class:`Conditional` of a conditional plan (see :mod:`.hyper`)."""
    algorithm = build_blr(plan, config, fixed_params=True)
    space = hyper_space(plan, sites)
    if inner == "exact":
        return Conditional(plan, algorithm, space, 1, tol)
    # Laplace: its ELBO is Laplace's evidence; VI: the ELBO itself stands in for log p(y | h)
    return Conditional(plan, algorithm, space, int(num_steps), float(tol))
