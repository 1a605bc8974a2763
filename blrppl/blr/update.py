"""The update rule itself: global (Eq. 58) and local (Eq. 60) modes."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp

from blrppl.compile_mode import SMALL_DATA_BYTES
from blrppl.families import checked_moments


def tree_sum(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *trees)


def global_update(natural: Any, messages: Sequence[Any], rho: Any) -> Any:
    """One global-mode BLR step for one variable (Khan & Rue, Eq. 58).

        λ ← (1 - ρ) λ + ρ Σ_f λ̃_f(μ),    λ̃_f(μ) = ∇_μ E_q[log f]

    The sum runs over every factor touching the variable, its prior
    included, so with conjugate factors and ρ = 1 this is one
    coordinate-ascent (VMP) step, and for a single latent exact Bayes.

    Args:
      natural: λ, the variable's current natural parameters.
      messages: the site parameters λ̃_f(μ), each shaped like λ.
      rho: step size ρ in (0, 1].

    Returns:
      The updated natural parameters, same structure as ``natural``.
    """
    target = tree_sum(messages)
    return jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58


def local_update(
    site_params: Mapping[str, Any], messages: Mapping[str, Any], rho: Any
) -> tuple[Any, dict]:
    """One local-mode BLR step for one variable (Khan & Rue, Eq. 60).

        λ̃_f ← (1 - ρ) λ̃_f + ρ λ̃_f(μ)   for the refreshed factors f,
        λ = Σ_f λ̃_f                     over all factors, prior included.

    Factors absent from ``messages`` keep their site parameter: refreshing
    only some sites (a minibatch, one factor at a time) is what makes the
    local mode differ from the global one.

    Args:
      site_params: factor name -> λ̃_f, every factor touching the variable.
      messages: factor name -> λ̃_f(μ) for the factors refreshed now.
      rho: step size ρ in (0, 1].

    Returns:
      ``(natural, site_params)``: the variable's new λ and its site parameters.
    """
    new_sites = dict(site_params)
    for name, message in messages.items():
        new_sites[name] = jax.tree.map(
            lambda s, g: (1.0 - rho) * s + rho * g, site_params[name], message  # Eq. 60
        )
    return tree_sum(list(new_sites.values())), new_sites


MAX_HALVINGS = 10


def _finite(natural) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(natural)]))


def is_valid_natural(family, natural) -> jax.Array:
    """Whether λ is finite and inside ``family``'s natural parameter space (a traced bool)."""
    return _finite(natural) & jnp.all(family.is_valid(natural))


def safe_global_update(
    family, natural: Any, messages: Sequence[Any], rho: Any, *, plain: bool = False
) -> tuple[Any, jax.Array]:
    """Eq. 58 with a safeguard: never leave the natural parameter space.

    A family with a ``safe_step`` (Gaussians: the improved BLR of Lin,
    Schmidt & Khan 2020, equal to the plain step wherever that is valid)
    takes it; every family then retries a step that is still invalid or not
    finite (a Monte Carlo outlier) with ρ/2, ρ/4, ...; if none of
    ``MAX_HALVINGS`` halvings is valid, λ is kept. Never a silent clip.

    With ``plain`` (an exact run: the step is the posterior or nothing), Eq. 58
    alone: a λ that fails the family's check is rejected, never replaced by a
    safe or shorter step, which would not be the posterior.

    Returns:
      ``(natural, rejected)``: the new λ and whether the step was rejected.
    """
    target = tree_sum(messages)
    if plain:
        first = jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58
        valid = is_valid_natural(family, first)
        return jax.tree.map(lambda new, old: jnp.where(valid, new, old), first, natural), ~valid

    def step(r):
        if family.safe_step is not None:
            return family.safe_step(natural, target, r)
        return jax.tree.map(lambda lam, t: (1.0 - r) * lam + r * t, natural, target)  # Eq. 58

    def cond(carry):
        k, _, valid = carry
        return (~valid) & (k < MAX_HALVINGS)

    def body(carry):
        k, _, _ = carry
        candidate = step(rho * 0.5**k)
        return k + 1, candidate, is_valid_natural(family, candidate)

    def halve(operands):
        k, candidate, valid = jax.lax.while_loop(cond, body, (jnp.ones((), jnp.int32), *operands))
        return jax.tree.map(lambda c, old: jnp.where(valid, c, old), candidate, natural), ~valid

    if family.safe_step is not None:
        # A safe step is Eq. 58 wherever that is valid: a valid Eq. 58 step is taken as it is;
        # else the safe step with ρ, ρ/2, ... in one loop. The safe step (a Gaussian's solves) is
        # written once in the program, not before the loop and again in it, and not evaluated
        # where Eq. 58 is valid (a tenth of a hierarchical model's start and step programs).
        plain = jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58
        valid = is_valid_natural(family, plain)

        def safe(operands):  # k = 0, 1, ...: the safe step with ρ, ρ/2, ...
            _, candidate, found = jax.lax.while_loop(
                cond, body, (jnp.zeros((), jnp.int32), natural, jnp.zeros((), bool))
            )
            return jax.tree.map(lambda c, old: jnp.where(found, c, old), candidate, natural), ~found

        return jax.lax.cond(valid, lambda o: (o[0], ~o[1]), safe, (plain, valid))

    # A valid first step (the rule) is taken as it is, without a select over λ.
    # (Under vmap the cond runs both branches; the loop then starts from each
    # member's own verdict, so valid members take no halving.)
    first = step(rho)
    valid = is_valid_natural(family, first)
    return jax.lax.cond(valid, lambda o: (o[0], ~o[1]), halve, (first, valid))


def checked_global_update(
    family, natural: Any, messages: Sequence[Any], rho: Any, *, plain: bool = False
) -> tuple[Any, jax.Array, tuple]:
    """:func:`safe_global_update` that also returns ``(μ, A(λ))`` of the new λ.

    For families that read their validity off their moments
    (``family.checked_moments``: a chain's pivots come out of the forward
    pass that also gives A(λ), the backward pass gives μ): each candidate is
    checked by its moments, and the step's ELBO then reads the same ones. One
    smoother per step, not a forward pass to check λ and a smoother again for
    the ELBO. The halving is a while loop that a valid step leaves at once
    (no select or copy of λ and μ; for a λ of at most ``SMALL_DATA_BYTES``, whose
    program's compilation costs more than a select, the first try is the loop's
    first iteration: one smoother in the program), and a halved plain step is the midpoint
    of λ and the previous try, so the site parameters' sum need not be kept
    alive through it.

    ``plain``: Eq. 58 alone, rejected where it fails the check (as
    :func:`safe_global_update`); the moments are then the rejected λ's.

    Returns:
      ``(natural, rejected, (μ, A(λ)))``.
    """
    target = tree_sum(messages)

    def check(candidate):
        mean, log_norm, valid = checked_moments(family, candidate)
        return (mean, log_norm), _finite(candidate) & jnp.all(valid)

    if plain:
        first = jax.tree.map(lambda lam, t: (1.0 - rho) * lam + rho * t, natural, target)  # Eq. 58
        extra, valid = check(first)
        return jax.tree.map(lambda new, old: jnp.where(valid, new, old), first, natural), ~valid, extra

    def step(r):
        if family.safe_step is not None:
            return family.safe_step(natural, target, r)
        return jax.tree.map(lambda lam, t: (1.0 - r) * lam + r * t, natural, target)  # Eq. 58

    def cond(carry):
        k, _, _, valid = carry
        return (~valid) & (k <= MAX_HALVINGS)

    def halved(k, previous):
        if family.safe_step is not None:
            return step(rho * 0.5**k)
        # The plain step with ρ/2^k is the midpoint of λ and the step with ρ/2^(k-1):
        # the target need not be kept alive through the loop (nor copied into it).
        return jax.tree.map(lambda lam, p: 0.5 * (lam + p), natural, previous)

    def body(carry):
        # ρ/2, ρ/4, ... ; the last try keeps λ (accepted as it is: the step is rejected).
        k, previous = carry[0], carry[1]
        keep = k == MAX_HALVINGS
        candidate = jax.tree.map(lambda old, new: jnp.where(keep, old, new), natural, halved(k, previous))
        extra, valid = check(candidate)
        return k + 1, candidate, extra, valid | keep

    if sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(natural)) <= SMALL_DATA_BYTES:
        # A small λ: the check (a smoother) is written once in the program, the first try being
        # the loop's first iteration (a select over λ per step; a state-space model's start and
        # step programs compile a fifth sooner: local level 0.80/0.72 -> 0.63/0.57 s).
        first = None if family.safe_step is not None else step(rho)

        def attempt(carry):
            k, previous = carry[0], carry[1]
            keep = k == MAX_HALVINGS
            tried = step(rho * 0.5**k) if first is None else jax.tree.map(
                lambda f, h: jnp.where(k == 0, f, h), first, halved(k, previous)
            )
            candidate = jax.tree.map(lambda old, new: jnp.where(keep, old, new), natural, tried)
            extra, valid = check(candidate)
            return k + 1, candidate, extra, valid | keep

        shapes = jax.eval_shape(check, natural)[0]
        blank = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        start = (jnp.zeros((), jnp.int32), natural, blank, jnp.zeros((), bool))
        k, candidate, extra, _ = jax.lax.while_loop(cond, attempt, start)
        return candidate, k > MAX_HALVINGS, extra
    # The loop starts from the first step and its verdict: a valid step (the rule)
    # takes no iteration and is returned in place, with no select or copy of λ.
    first = step(rho)
    extra, valid = check(first)
    k, candidate, extra, _ = jax.lax.while_loop(cond, body, (jnp.ones((), jnp.int32), first, extra, valid))
    return candidate, k > MAX_HALVINGS, extra
