"""Reparameterised Monte Carlo natural gradients for Gaussian q.

Samples x_s = m + L ε_s (L L ᵀ = Σ; √v elementwise for a diagonal q) give
E_q[log f] ≈ mean_s log f(x_s) and E_q[g] ≈ mean_s g(x_s); E_q[H] comes from one
of three estimators, then Bonnet and Price assemble the natural gradient
(Khan & Rue, Eqs. 10-11):

- ``"reparam"``: the exact Hessian blocks at every sample (Price's theorem).
- ``"hvp"``: one Hessian-vector product per sample along an independent
  Rademacher probe z (Bekas, Kokiopoulou & Saad 2007): diag(H) ≈ z ⊙ Hz for a
  diagonal q; for a full block, sym((Hz)_b z_bᵀ). Unbiased, any dimension, no
  separability needed; more variance.
- ``"first_order"``: gradients only, by Stein's lemma,
  E[H] = E[Σ⁻¹ (x - m) gᵀ], symmetrised (Khan & Rue, App. D; Lin et al. 2019);
  elementwise E[(x_i - m_i) g_i] / v_i for a diagonal q.

With ``antithetic=True`` the samples come in pairs m ± Lε (num_samples must be
even): every odd moment of ε cancels, which removes the leading noise of E[g]
for near-quadratic log f and makes ``"first_order"`` a symmetric difference
Σ⁻¹Lε (g(m + Lε) - g(m - Lε))ᵀ / 2. Unbiasedness is unaffected.

``mean`` may be one Gaussian block or a pytree of blocks (mean-field across
them; see :mod:`~blrppl.estimators.gaussian`): all blocks are sampled jointly
and each gets its own natural gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from blrppl._types import Array, PRNGKey
from blrppl.estimators.gaussian import (
    GaussianEstimator,
    GaussianStats,
    block_hessian,
    conditional,
    flatten_blocks,
    is_full,
    joint_log_factor,
    loc_scale,
    natural_gradient,
    scale_noise,
)
from blrppl.families import common

HESSIAN_OPTIONS = ("reparam", "hvp", "first_order")


def monte_carlo(
    num_samples: int,
    hessian: str = "reparam",
    *,
    antithetic: bool = False,
    separable: bool = False,
    sequential: bool = False,
) -> GaussianEstimator:
    """Build the reparameterised Monte Carlo estimator (Khan & Rue, Eqs. 10-11).

    Args:
      num_samples: S, the number of samples per call (even with ``antithetic``).
      hessian: ``"reparam"`` (exact Hessian blocks per sample), ``"hvp"`` (one
        Hessian-vector product per sample with a Rademacher probe) or
        ``"first_order"`` (Stein's lemma, gradients only).
      antithetic: draw ε in pairs ±ε.
      separable: with ``hessian="reparam"``, promise that log f is a sum of terms
        each touching one element (``NormalStats``) or one block (``MVNStats``),
        so each sample's Hessian blocks cost 1 (resp. d) Hessian-vector
        products rather than a full n x n Hessian. Ignored otherwise.
      sequential: evaluate the samples one at a time (``lax.map``) instead
        of batched (``vmap``), for log factors that call LAPACK: a vmapped
        Cholesky over the samples is a batched LAPACK call, which jaxlib
        0.10.x may deadlock on (:func:`blrppl.graph.jaxpr.lapack_primitives`).

    Returns:
      A :class:`GaussianEstimator` with ``method="mc"``. ``estimate(rng_key,
      mean, log_factor)`` returns the sample mean of log f and the natural
      gradient in the layout of ``mean``.

    Raises:
      ValueError: for a bad ``num_samples`` or ``hessian``.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(
            f"num_samples must be a positive integer, got {num_samples!r}."
        )
    if hessian not in HESSIAN_OPTIONS:
        raise ValueError(f"hessian must be one of {HESSIAN_OPTIONS}, got {hessian!r}.")
    if antithetic and num_samples % 2:
        raise ValueError(
            f"antithetic sampling needs an even num_samples, got {num_samples}."
        )

    def estimate(
        rng_key: PRNGKey, mean: Any, log_factor: Callable[[Any], Array]
    ) -> tuple[Array, Any]:
        blocks, treedef = flatten_blocks(mean)
        total = joint_log_factor(log_factor, treedef)
        noise_key, probe_key = jax.random.split(rng_key)
        num_draws = num_samples // 2 if antithetic else num_samples
        scales, eps, xs = [], [], []
        for block, key in zip(blocks, jax.random.split(noise_key, len(blocks))):
            loc, scale = loc_scale(block)
            noise = jax.random.normal(key, (num_draws,) + loc.shape, dtype=loc.dtype)
            if antithetic:
                noise = jnp.concatenate([noise, -noise])
            scales.append(scale)
            eps.append(noise)
            xs.append(loc + scale_noise(block, scale, noise))
        over = (lambda f, *a: jax.lax.map(lambda b: f(*b), a)) if sequential else (lambda f, *a: jax.vmap(f)(*a))
        values, grads = over(jax.value_and_grad(total), xs)
        if hessian == "reparam":

            def sample_hessians(x: list[Array]) -> list[Array]:
                return [
                    block_hessian(conditional(total, x, i), x[i], is_full(b), separable)
                    for i, b in enumerate(blocks)
                ]

            hessians = over(sample_hessians, xs)
        elif hessian == "hvp":
            # One joint HVP: (Hz)_v = Σ_u H_vu z_u, and E[z_u z_vᵀ] = 0 for u ≠ v,
            # so E[(Hz)_v z_vᵀ] = H_vv for every block at once.
            keys = jax.random.split(probe_key, len(blocks))
            probes = [
                jax.random.rademacher(k, x.shape, dtype=x.dtype)
                for k, x in zip(keys, xs)
            ]
            hvps = over(lambda x, z: jax.jvp(jax.grad(total), (x,), (z,))[1], xs, probes)
            hessians = [
                common.symmetrize(_outer(h, z)) if is_full(b) else z * h
                for b, h, z in zip(blocks, hvps, probes)
            ]
        else:
            hessians = [
                _first_order(b, scale, e, g)
                for b, scale, e, g in zip(blocks, scales, eps, grads)
            ]
        nat_grads = [
            natural_gradient(b, jnp.mean(g, axis=0), jnp.mean(h, axis=0))
            for b, g, h in zip(blocks, grads, hessians)
        ]
        return jnp.mean(values), jax.tree.unflatten(treedef, nat_grads)

    return GaussianEstimator(estimate=estimate, method="mc")


def _first_order(block: GaussianStats, scale: Array, eps: Array, grads: Array) -> Array:
    """Per-sample Stein estimates Σ⁻¹ (x - m) gᵀ, symmetrised, with Σ⁻¹ (x - m) = L⁻ᵀ ε."""
    if not is_full(block):
        return eps / scale * grads
    white = common.solve_draws(scale, eps)
    return common.symmetrize(_outer(white, grads))


def _outer(a: Array, b: Array) -> Array:
    """Return a bᵀ over the last axis, batched."""
    return a[..., :, None] * b[..., None, :]
