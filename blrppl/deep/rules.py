"""The deep-learning rows of Table 1: the BLR with a diagonal Gaussian q.

q(u) = N(u | m, diag(s)^-1) over the flat unconstrained vector u of
:mod:`blrppl.deep.flat`. The BLR (Eq. 46, the Newton form of Eq. 12 with
minibatch estimates) in total units (s is q's precision, ĝ and ĥ estimate
the gradient and diagonal Hessian of ℓ̄, the N/M-scaled loss):

    s ← (1 - ρ_s) s + ρ_s ĥ,        m ← m - α ḡ / s,     ḡ = momentum(ĝ)

The rows differ only in where ĝ, ĥ are taken and what ĥ is:

====================  =============  ===============================================
row (Table 1)         ĝ, ĥ taken at  ĥ
====================  =============  ===============================================
``"rmsprop"``/adam    m (delta)      N (ĝ / N)²: squared gradient (Eq. 38, sqrt scaling)
``"ogn"``             m (delta)      Gauss-Newton: (N/M) Σ_i (∇ℓ_i)² + diag ∇²R (Eq. 45)
``"vogn"``            u ~ q          Gauss-Newton at a sample (Eq. 46 + Eq. 45)
``"ivon"``            u ~ q          reparameterisation: ĝ ⊙ (u - m) ⊙ s (Shen et al. 2024)
====================  =============  ===============================================

IVON's precision update keeps s positive whatever ĥ (its Eq. for h with
the correction ½ ρ_s² (s - ĥ)² / s); the others floor s at a small fraction
of its previous value. diag ∇²R of the non-observation terms (priors,
log-Jacobians) uses Rademacher probes z ⊙ (∇²R z) (exact when ∇²R is
diagonal, as for independent priors; unbiased otherwise). The momentum is
Adam's (β1, with bias correction), the mirror-descent momentum of App. F.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from blrppl.blr.minibatch import minibatch
from blrppl.deep.flat import FlatModel


class Rule(NamedTuple):
    """One Table 1 row: where the estimates are taken and which curvature."""

    name: str
    perturb: bool  # ĝ, ĥ at samples u ~ q (variational) or at m (delta method)
    curvature: str  # "squared_gradient", "gauss_newton" or "reparameterisation"
    positive_update: bool  # IVON's positivity-preserving precision update
    sqrt_scaling: bool  # RMSprop/Adam's m-step, α ĝ / (sqrt(N s) + N c)
    calibrated: bool  # whether 1 / s estimates a posterior variance


RULES = {
    "rmsprop": Rule("rmsprop", False, "squared_gradient", False, True, False),
    "adam": Rule("adam", False, "squared_gradient", False, True, False),
    "ogn": Rule("ogn", False, "gauss_newton", False, False, True),
    "vogn": Rule("vogn", True, "gauss_newton", False, False, True),
    "ivon": Rule("ivon", True, "reparameterisation", True, False, True),
}


class Hyper(NamedTuple):
    """The rule's settings (static; closed over by the compiled step)."""

    learning_rate: Callable  # step (from 1) -> α
    beta1: float  # momentum of ĝ
    beta2: float  # 1 - ρ_s, smoothing of ĥ
    num_samples: int  # draws of u per step (perturbed rules)
    epsilon: float  # RMSprop/Adam's c
    clip: Optional[float]  # largest |Δm| per coordinate, or None


#: The averaging window is split into this many batches (batch means: Monte Carlo error of the average).
AVERAGE_BATCHES = 8


class Average(NamedTuple):
    """Running sums of the iterates (m, s) in each of ``AVERAGE_BATCHES`` parts of the window (Polyak averaging)."""

    mean: jax.Array  # (AVERAGE_BATCHES, d)
    precision: jax.Array  # (AVERAGE_BATCHES, d)
    count: jax.Array  # (AVERAGE_BATCHES,)


class DiagonalState(NamedTuple):
    """q's mean and precision, the momentum of ĝ, iterate averages, the step count and the run's key.

    The step counts from 0 (no step taken); step t uses ``fold_in(rng_key, t)``.
    """

    mean: jax.Array
    precision: jax.Array
    momentum: jax.Array
    average: Average
    step: jax.Array
    rng_key: jax.Array

    def averaged(self) -> tuple[jax.Array, jax.Array]:
        """(m, s): the averages of the iterates where there are any, else the last iterate."""
        count = jnp.sum(self.average.count)
        some = count > 0
        mean = jnp.where(some, jnp.sum(self.average.mean, 0) / jnp.maximum(count, 1), self.mean)
        precision = jnp.where(some, jnp.sum(self.average.precision, 0) / jnp.maximum(count, 1), self.precision)
        return mean, precision

    def batch_means(self) -> tuple[jax.Array, jax.Array]:
        """((K, d), (K, d)): the average of m and of s within each part of the window."""
        count = jnp.maximum(self.average.count, 1)[:, None]
        return self.average.mean / count, self.average.precision / count


def init_state(mean: jax.Array, precision: jax.Array, rng_key: jax.Array) -> DiagonalState:
    """The state before the first step."""
    zeros = jnp.zeros((AVERAGE_BATCHES,) + mean.shape, mean.dtype)
    average = Average(zeros, zeros, jnp.zeros((AVERAGE_BATCHES,), mean.dtype))
    return DiagonalState(mean, precision, jnp.zeros_like(mean), average, jnp.zeros((), jnp.int32), rng_key)


def entropy(precision: jax.Array) -> jax.Array:
    """H(q) of the diagonal Gaussian."""
    return 0.5 * jnp.sum(1.0 + jnp.log(2.0 * jnp.pi) - jnp.log(precision))


def rademacher_diagonal(hvp: Callable, key: jax.Array, dim: int, dtype) -> jax.Array:
    """z ⊙ (H z), z uniform on {-1, 1}^d: diag(H) when H is diagonal, unbiased for it otherwise."""
    z = jax.random.rademacher(key, (dim,), dtype=dtype)
    return z * hvp(z)


def make_step(flat: FlatModel, rule: Rule, hyper: Hyper) -> Callable:
    """The pure step ``(state, arrays, window) -> (state, elbo_estimate)`` of one rule."""
    sub = flat.subsample
    scale = sub.size / sub.batch_size

    def estimates(u, mean, precision, rows, key, arrays):
        """(ℓ̄(u), ĝ, ĥ) at one u."""
        if rule.curvature == "gauss_newton":
            def rest(v):
                return flat.split_loss(v, rows, arrays)[1]

            per_row = jax.jacrev(lambda v: flat.split_loss(v, rows, arrays)[0])(u)  # (M, d)
            loss, grad = jax.value_and_grad(lambda v: flat.loss(v, rows, arrays))(u)
            hvp = lambda z: jax.jvp(jax.grad(rest), (u,), (z,))[1]
            hess = scale * jnp.sum(per_row**2, axis=0) + rademacher_diagonal(hvp, key, u.shape[0], u.dtype)  # Eq. 45
            return loss, grad, hess
        loss, grad = jax.value_and_grad(lambda v: flat.loss(v, rows, arrays))(u)
        if rule.curvature == "reparameterisation":
            return loss, grad, grad * (u - mean) * precision  # E_q[ĝ (u - m) s] = E_q[diag ∇²ℓ̄] (Stein)
        return loss, grad, grad**2 / sub.size  # N (ĝ / N)² (Eq. 38)

    def step(state: DiagonalState, arrays: tuple, window: jax.Array) -> tuple[DiagonalState, jax.Array]:
        """One step; iterates after step ``window[0]`` enter the averages (a window of ``window[1]`` steps)."""
        t = state.step + 1
        key = jax.random.fold_in(state.rng_key, t)
        k_noise, k_probe, k_batch = jax.random.split(key, 3)
        rows = None
        if sub.batch_size < sub.size:
            rows = minibatch(k_batch, t, sub.size, sub.batch_size)
        m, s = state.mean, state.precision
        if rule.perturb:
            noise = jax.random.normal(k_noise, (hyper.num_samples,) + m.shape, m.dtype)
            us = m + noise / jnp.sqrt(s)
        else:
            us = m[None]
        probe_keys = jax.random.split(k_probe, us.shape[0])
        loss, grad, hess = jax.vmap(lambda u, k: estimates(u, m, s, rows, k, arrays))(us, probe_keys)
        loss, grad, hess = loss.mean(), grad.mean(0), hess.mean(0)
        momentum = hyper.beta1 * state.momentum + (1.0 - hyper.beta1) * grad
        g_bar = momentum / (1.0 - hyper.beta1 ** t.astype(m.dtype))
        rho_s = 1.0 - hyper.beta2
        if rule.positive_update:  # Shen et al. (2024), Alg. 1: stays positive for any ĥ
            s_new = s + rho_s * (hess - s) + 0.5 * rho_s**2 * (s - hess) ** 2 / s
        else:  # Eq. 46; a Gauss-Newton ĥ is positive up to the probes of ∇²R
            s_new = jnp.maximum((1.0 - rho_s) * s + rho_s * hess, 1e-3 * s)
        alpha = hyper.learning_rate(t)
        if rule.sqrt_scaling:
            n = float(sub.size)
            delta = alpha * g_bar / (jnp.sqrt(n * s_new) + n * hyper.epsilon)  # Eq. 38
        else:
            delta = alpha * g_bar / s_new  # Eq. 46
        if hyper.clip is not None:
            delta = jnp.clip(delta, -hyper.clip, hyper.clip)
        m_new = m - delta
        after, length = window[0], jnp.maximum(window[1], 1)
        keep = (t > after).astype(m.dtype)
        part = jnp.clip((t - after - 1) * AVERAGE_BATCHES // length, 0, AVERAGE_BATCHES - 1)
        average = Average(
            state.average.mean.at[part].add(keep * m_new),
            state.average.precision.at[part].add(keep * s_new),
            state.average.count.at[part].add(keep),
        )
        elbo = -loss + entropy(s)  # a one-sample (minibatch) estimate of the ELBO of q before the step
        return DiagonalState(m_new, s_new, momentum, average, t, state.rng_key), elbo

    return step
