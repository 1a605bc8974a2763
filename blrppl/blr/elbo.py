"""The evidence lower bound of q: E_q[log p(x, y)] + H[q]."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp

from blrppl.estimators.gaussian import point_mass
from blrppl.families import entropy, mean_and_log_normalizer


def mean_params(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> dict:
    """μ = ∇A(λ) for every variable."""
    return {v: qs[v].family.mean_params(natural[v]) for v in natural}


def moments(qs: Mapping[str, Any], natural: Mapping[str, Any]) -> dict:
    """``(μ, A(λ))`` for every variable, from one pass where the family shares one
    (a chain's forward-backward): what the M-step and the ELBO of one step both read."""
    return {v: mean_and_log_normalizer(qs[v].family, natural[v]) for v in natural}


def elbo_terms(
    rng_key: jax.Array,
    qs: Mapping[str, Any],
    estimators: Sequence[Any],
    natural: Mapping[str, Any],
    params: Mapping[str, Any],
    arrays: Any,
    batch: Optional[jax.Array] = None,
    plate_factors: frozenset = frozenset(),
    local_axes: Optional[Mapping[str, int]] = None,
    scale: float = 1.0,
    skip: frozenset = frozenset(),
    rows: Optional[Mapping[str, Any]] = None,
    known: Optional[Mapping[str, Any]] = None,
    estimates: Optional[Sequence[Any]] = None,
    with_scale: bool = False,
    values: Optional[Mapping[str, jax.Array]] = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """ELBO = Σ_f E_q[log f] + Σ_v H[q_v].

    Every factor is in the sum, priors included, so this equals
    E_q[log p(x, y)] + H[q] (for a Gaussian q on an unconstrained space the
    Jacobian sits in the variable's prior factor). Point estimates (EM) have
    no entropy: their constant delta-method entropy is left out, as in the
    usual EM bound (Khan & Rue, Sec. 5.2). With a minibatch ``batch`` of a
    subsampled plate, the factors in the plate and the entropies of the
    plate's local variables are read on the batch and rescaled by
    ``scale`` = N / M: an unbiased estimate of the ELBO. Variables in
    ``skip`` (integrated-out missing data) leave out their own prior factor
    and their entropy: together they contribute nothing to the evidence.
    ``rows`` (variable -> boolean mask of its batch shape) keeps only those
    rows' entropies (orphan rows are integrated out, :mod:`blrppl.blr.orphans`).
    ``known``: :func:`moments` of ``natural`` when the caller has them.
    ``estimates``: per estimator, the function to call for ``est.estimate`` (the step's
    jitted ones: their traces are then shared with the site parameters').
    ``with_scale``: also return Σ_f |E_q[log f]| + Σ_v |H[q_v]|, the size of the terms
    whose sum the ELBO is (its rounding noise is that times the dtype's epsilon:
    :func:`blrppl.blr.checks.unresolved_elbo_error`).
    ``values``: factor -> E_q[log f] at ``params`` already computed (EM's M-step), used as is
    for factors outside the minibatch.
    """
    rows = rows or {}
    local_axes = local_axes or {}
    known = moments(qs, natural) if known is None else known
    mean = {v: m for v, (m, _) in known.items()}
    terms = []
    estimates = [est.estimate for est in estimators] if estimates is None else estimates
    for i, (est, estimate) in enumerate(zip(estimators, estimates)):
        key = jax.random.fold_in(rng_key, i)
        if est.factor in skip:
            continue
        if batch is not None and est.factor in plate_factors:
            value, _ = estimate(key, mean, params, arrays, batch=batch)
            terms.append(scale * value)
        elif values and est.factor in values:
            terms.append(values[est.factor])
        else:
            terms.append(estimate(key, mean, params, arrays)[0])
    for v, h in entropy_terms(qs, natural, known).items():
        if v in skip:
            continue
        if v in rows:
            h = jnp.where(jnp.asarray(rows[v]), h, 0.0)
        if batch is not None and v in local_axes:
            terms.append(scale * jnp.sum(jnp.take(h, batch, axis=local_axes[v])))
        else:
            terms.append(jnp.sum(h))
    total, size = total_and_size(terms)
    return (total, size) if with_scale else total


def exact_evidence(
    qs: Mapping[str, Any], estimators: Sequence[Any], natural: Mapping[str, Any], params: Mapping[str, Any],
    arrays: Any, known: Mapping[str, Any],
) -> tuple[jax.Array, jax.Array]:
    """The ELBO where every E_q[log f] is affine in μ and λ = Σ_f λ̃_f (an exact run's step):

        ELBO = Σ_f (<λ̃_f, μ> + c_f) - <λ, μ> - E_q[log h] + A(λ) = Σ_f c_f + A(λ) - E_q[log h],

    the log evidence (Khan & Rue, Sec. 5.1), with ``c_f`` each estimator's ``constant``. It reads
    no data beyond the terms that do not touch q, and the inner products that cancel are not
    formed: no pass over μ, and no rounding of their large, opposite sums (float32).
    ``known``: :func:`moments` of ``natural``. Returns the ELBO and the size of its terms
    (as :func:`elbo_terms` with ``with_scale``).
    """
    terms = [est.constant(params, arrays) for est in estimators]
    for v, lam in natural.items():
        log_norm = known[v][1]
        terms.append(jnp.sum(log_norm - qs[v].family.expected_log_base_measure(lam)))
    return total_and_size(terms)


def total_and_size(terms: Sequence[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(Σ t, Σ |t|)`` of an ELBO's terms: the ELBO and the size of what it sums (``BLRState.elbo_scale``)."""
    zero = jnp.zeros((), jnp.result_type(float))
    return sum(terms, zero), sum((jnp.abs(t) for t in terms), zero)


def log_joint_at_mean(
    rng_key: jax.Array,
    qs: Mapping[str, Any],
    estimators: Sequence[Any],
    natural: Mapping[str, Any],
    params: Mapping[str, Any],
    arrays: Any,
    estimates: Optional[Sequence[Any]] = None,
) -> jax.Array:
    """log p̄(m) = Σ_f log f(m): delta-method values at q's mean with no spread.

    The objective of a Newton step (every factor by the delta method, every q
    Gaussian: ``Laplace``), whose ascent its guard judges. The delta ELBO,
    log p̄(m) + ½ tr(H(m) Σ) + H[q], is Laplace's evidence at the fixed point, but
    where log p̄ is skewed it peaks away from the mode (Khan & Rue, Sec. 4.4).
    ``estimates``: as :func:`elbo_terms`.
    """
    mean = {v: point_mass(m) for v, m in mean_params(qs, natural).items()}
    estimates = [est.estimate for est in estimators] if estimates is None else estimates
    total = jnp.zeros((), jnp.result_type(float))
    for i, estimate in enumerate(estimates):
        total = total + estimate(jax.random.fold_in(rng_key, i), mean, params, arrays)[0]
    return total


def entropy_terms(qs: Mapping[str, Any], natural: Mapping[str, Any], known: Optional[Mapping[str, Any]] = None) -> dict:
    """H[q_v] for every variable, batch shaped (one entry per independent block);
    ``known``: their :func:`moments`, if computed already."""
    known = known or {}
    return {v: entropy(qs[v].family, lam, known.get(v)) for v, lam in natural.items()}
