"""The exponential-family interface every q family implements.

A family is a value (a NamedTuple of pure functions), not a class hierarchy:

    q(x) = h(x) exp(<λ, T(x)> - A(λ)),     μ = E_q[T(x)] = ∇A(λ).

Natural parameters λ, mean parameters μ and sufficient statistics T(x) share
one NamedTuple type per family (``GammaStats(log_x, x)``), with fields named
after the statistic, so <λ, T(x)> is a tree reduction and the BLR update is a
``jax.tree.map``. Batch dimensions lead; the trailing ``event_ndim`` dimensions
of ``x`` (and the matching dimensions of each statistic) are the event.

Nothing here assumes a dense covariance: a structured family (the chain
Gaussian with block-tridiagonal precision) keeps only the statistics it needs
(marginal and lag-one second moments), never a dense T x T matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp


class ExpFamily(NamedTuple):
    """An exponential family as pure functions over per-family ``*Stats`` pytrees.

    Fields (all pure, jit- and vmap-safe):
        name: the family's name, as used in ``families={site: name}``.
        stats_type: the NamedTuple type shared by λ, μ and T(x).
        event_ndim: number of trailing event dimensions of a value ``x``.
        support: the numpyro constraint of the values ``x``.
        sufficient_stats: ``x -> T(x)``.
        log_base_measure: ``x -> log h(x)``, batch shaped.
        expected_log_base_measure: ``λ -> E_q[log h(x)]``, batch shaped (zero for
            families whose ``A`` absorbs every constant).
        log_normalizer: ``λ -> A(λ)``, batch shaped.
        mean_params: ``λ -> μ = ∇A(λ)`` in closed form.
        natural_params: ``μ -> λ``, the inverse of ``mean_params``.
        from_usual: the family's usual parameters (keyword arguments) ``-> λ``.
        to_usual: ``λ -> dict`` of usual parameters.
        from_numpyro: numpyro ``Distribution -> λ``.
        to_numpyro: ``λ -> numpyro Distribution`` with the same batch shape and
            ``.mean`` / ``.variance`` in the site's own support.
        sample: ``(rng_key, λ, sample_shape) -> x`` of shape
            ``sample_shape + batch_shape + event_shape``.
        is_valid: ``λ -> bool array`` (batch shaped): λ lies in the natural
            parameter space.
        batch_shape: ``λ -> tuple``.

    The remaining fields are what the rest of blrppl reads off a family, so
    that nothing outside ``families/`` switches on family names (one record
    per family; :mod:`blrppl.families.registry` lists them):

        kind: the symbolic vocabulary of the family (``"gaussian"``,
            ``"gamma"``, ...): which statistic a read of the value lands on.
        statistics: ``((atom kind, power), field)`` pairs: a monomial of the
            value (``("x", 1)``, ``("log", 1)``, ``("x", -1)``, ...) that *is*
            the named sufficient statistic, so its expectation is a mean
            parameter (:func:`blrppl.families.registry.statistic_name`).
        layout: how the statistics meet a variable's value layout
            (:class:`~blrppl.families.layout.Layout`).
        reparameterised: ``sample`` is differentiable in λ (Monte Carlo
            natural gradients through the mean parameters).
        gaussian: q is Gaussian in each position (a Gaussian, or a chain
            Gaussian's per-time marginals): estimated site parameters use
            Bonnet's and Price's theorems (Khan & Rue, Eqs. 10-11).
        prior_types: numpyro prior types whose default q is this family.
        accepts: a test of a prior of one of ``prior_types`` (wrappers looked
            through) narrowing them to the members of the family, for
            distributions that are the family only for some parameters
            (``Uniform(0, 1)`` is ``Beta(1, 1)``); None accepts them all.
        fixed_support: the support an override ``families={site: name}``
            must match exactly; None for families that take any continuous
            support (Gaussians on the unconstrained space) or check their own.
        start_at: ``(λ, value) -> λ`` centred at ``value`` (same batch shape,
            values shaped like ``sample``), keeping λ's spread: ``init=``
            by value and random restarts.
        random_restart: restarts re-centre q at a draw from itself
            (``False``: q keeps its default start, e.g. random
            responsibilities or a chain).
        restart_draw: ``(rng_key, λ, sample_shape) -> x`` shaped like
            ``sample``: the random point a restart re-centres q at, where a
            cheaper approximate draw than ``sample`` serves (a log-normal with
            q's mean and variance for Gamma-based families: no rejection
            loop in the restarts' start program); None: ``sample``.
        safe_step: ``(λ, λ̂, ρ) -> λ``, the BLR step (Eq. 58) kept in the
            natural parameter space (Gaussians: the improved BLR of Lin,
            Schmidt & Khan 2020); equal to Eq. 58 wherever that is valid (the
            update takes a valid Eq. 58 step without calling it); None for the
            plain step with step halving.
        index_valued: the values are category indices (Categorical and its
            chain): the symbolic layer enumerates them where they index arrays.
        support_probs: for a finite discrete family on {0, ..., K-1}, ``(q, μ)
            -> probs``: the probabilities of the K values under q (shape
            ``q.shape + (K,)``), differentiable in μ; estimators enumerate
            such variables. None for other families.
        chain: the family is a chain over a leading time axis.
        mean_and_log_normalizer: ``λ -> (μ, A(λ))`` from one pass, for
            families whose μ and A come out of the same recursion (a chain's
            forward-backward); None computes them separately. The entropy and
            KL divergence use it.
        checked_moments: ``λ -> (μ, A(λ), is_valid(λ))`` from one pass, for
            families whose validity comes out of the same recursion as μ and
            A (a chain's pivots); None computes them separately. The BLR
            step checks its new λ and reads its ELBO's moments from it.
    """

    name: str
    stats_type: type
    event_ndim: int
    support: Any
    sufficient_stats: Callable
    log_base_measure: Callable
    expected_log_base_measure: Callable
    log_normalizer: Callable
    mean_params: Callable
    natural_params: Callable
    from_usual: Callable
    to_usual: Callable
    from_numpyro: Callable
    to_numpyro: Callable
    sample: Callable
    is_valid: Callable
    batch_shape: Callable
    kind: str = ""
    statistics: tuple = ()
    layout: Any = None
    reparameterised: bool = False
    gaussian: bool = False
    prior_types: tuple = ()
    accepts: Optional[Callable] = None
    fixed_support: Any = None
    start_at: Optional[Callable] = None
    random_restart: bool = True
    restart_draw: Optional[Callable] = None
    safe_step: Optional[Callable] = None
    index_valued: bool = False
    support_probs: Optional[Callable] = None
    chain: bool = False
    mean_and_log_normalizer: Optional[Callable] = None
    checked_moments: Optional[Callable] = None


def family_inner(family: ExpFamily, natural: Any, stats: Any) -> jax.Array:
    """<λ, T> reduced over event dimensions, one value per batch element."""
    batch_ndim = len(family.batch_shape(natural))

    def field_inner(lam, t):
        prod = lam * t
        return jnp.sum(prod, axis=tuple(range(batch_ndim, prod.ndim)))

    return sum(jax.tree.leaves(jax.tree.map(field_inner, natural, stats)))


def mean_and_log_normalizer(family: ExpFamily, natural: Any) -> tuple[Any, jax.Array]:
    """``(μ, A(λ))``, from one pass where the family shares one (chains)."""
    if family.mean_and_log_normalizer is not None:
        return family.mean_and_log_normalizer(natural)
    return family.mean_params(natural), family.log_normalizer(natural)


def checked_moments(family: ExpFamily, natural: Any) -> tuple[Any, jax.Array, jax.Array]:
    """``(μ, A(λ), is_valid(λ))``, from one pass where the family shares one (chains)."""
    if family.checked_moments is not None:
        return family.checked_moments(natural)
    mean, log_norm = mean_and_log_normalizer(family, natural)
    return mean, log_norm, family.is_valid(natural)


def entropy(family: ExpFamily, natural: Any, moments: Optional[tuple[Any, jax.Array]] = None) -> jax.Array:
    """H[q] = A(λ) - <λ, μ> - E_q[log h(x)], batch shaped.

    ``moments``: ``(μ, A(λ))`` when the caller has them already
    (:func:`mean_and_log_normalizer`), so that they are not computed twice.
    """
    mean, log_norm = mean_and_log_normalizer(family, natural) if moments is None else moments
    return (
        log_norm
        - family_inner(family, natural, mean)
        - family.expected_log_base_measure(natural)
    )


def kl_divergence(family: ExpFamily, natural: Any, other_natural: Any) -> jax.Array:
    """KL(q_λ || q_λ') as the Bregman divergence of A, batch shaped.

        KL = A(λ') - A(λ) - <λ' - λ, μ>,   μ = ∇A(λ)
    """
    mean, log_norm = mean_and_log_normalizer(family, natural)
    diff = jax.tree.map(lambda a, b: a - b, other_natural, natural)
    return (
        family.log_normalizer(other_natural)
        - log_norm
        - family_inner(family, diff, mean)
    )
