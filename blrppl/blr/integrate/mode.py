"""The mode of log p(u, y) by damped Newton steps on exact evidences.

f(u) = log p(y | h(u)) + log p(h(u)) + log |det ∂h/∂u| is exact to rounding
for an exact conditional (and to the inner fit's tolerance for Laplace), and
smooth, so its gradient and Hessian come from central differences on a
stencil of 1 + 2k + 2k(k - 1) points around u (k = dim(u) ≤ 5), all
evaluated as one ``vmap`` of the compiled conditional fit: the program that
evaluates the grid, so the search compiles nothing of its own. (Autodiff
through the fit gives the same numbers but compiles a program several times
larger than the fit.) Steps are Levenberg-Marquardt damped Newton steps,
(-H + λ I) d = g, with λ = 0 where -H is positive definite and the step
raises f, and larger λ otherwise: never a step downhill. f after each step is
recorded (the result's ``elbo``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, NamedTuple

import numpy as np

#: Central-difference step on u (h's unconstrained space).
DIFFERENCE_STEP = 1e-3
#: The search stops once the Newton decrement gᵀ(-H)⁻¹g (twice the predicted
#: gain; its square root is the distance to the mode in posterior sds) is below
#: this. The mode only centres the grid, which integrates whatever its centre,
#: so 1e-4 sd is ample (and above the differences' bias, O(step²) in g).
DECREMENT_TOL = 1e-8
#: The longest step in any coordinate of u (a factor e^2 on a scale).
MAX_STEP = 2.0
#: Step lengths tried along each direction.
LINE_SEARCH = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)


class ModeSearch(NamedTuple):
    """The result of :func:`find_mode`.

    Attributes:
      u: the mode (or the last point) on h's unconstrained space, shape (k,).
      value: f(u).
      grad: ∇f(u) (central differences).
      hessian: ∇²f(u), shape (k, k).
      trace: f after each step, shape (num_steps,).
      num_steps: the number of steps taken.
      converged: the Newton decrement fell below tolerance where -H is
        positive definite.
    """

    u: np.ndarray
    value: float
    grad: np.ndarray
    hessian: np.ndarray
    trace: np.ndarray
    num_steps: int
    converged: bool


def stencil(u: np.ndarray, step: float) -> np.ndarray:
    """u, u ± s e_i, and u ± s e_i ± s e_j (i < j): the points of :func:`derivatives`."""
    k = u.shape[0]
    eye = np.eye(k)
    points = [u]
    for i in range(k):
        points += [u + step * eye[i], u - step * eye[i]]
    for i, j in itertools.combinations(range(k), 2):
        for a, b in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
            points.append(u + step * (a * eye[i] + b * eye[j]))
    return np.asarray(points)


def derivatives(values: np.ndarray, k: int, step: float) -> tuple[float, np.ndarray, np.ndarray]:
    """f, ∇f and ∇²f from f on :func:`stencil` (central differences, O(step²))."""
    f0 = values[0]
    plus, minus = values[1 : 1 + 2 * k : 2], values[2 : 2 + 2 * k : 2]
    grad = (plus - minus) / (2 * step)
    hessian = np.diag((plus - 2 * f0 + minus) / step**2)
    for n, (i, j) in enumerate(itertools.combinations(range(k), 2)):
        pp, pm, mp, mm = values[1 + 2 * k + 4 * n : 5 + 2 * k + 4 * n]
        hessian[i, j] = hessian[j, i] = (pp - pm - mp + mm) / (4 * step**2)
    return float(f0), grad, hessian


def find_mode(
    log_joint: Callable[[np.ndarray], np.ndarray], u0: Any, num_steps: int, scouts: Any = None, eps: float = 2.0**-52
) -> ModeSearch:
    """Maximise f from ``u0`` in at most ``num_steps`` steps (module docstring).

    Each step: the damped Newton direction d (``-H + λ I`` positive
    definite), shortened to at most ``MAX_STEP`` in every coordinate (far
    from the mode f is far from quadratic: a log-precision started at 0 may
    lie 10 units away); one call evaluates the stencil around u + d and f at
    u + t d for t = 1/2, ..., 1/32. The full step is taken when it does not
    lower f (its derivatives are then at hand: one call per step near the
    mode); otherwise the best shorter step that does not lower f, and the
    stencil there (a second call).

    Args:
      log_joint: f at the rows of a ``(n, k)`` array, returned as ``(n,)``
        (vmapped calls of the conditional fit).
      u0: the start, shape (k,).
      num_steps: the most steps.
      scouts: other candidate starts, shape (n, k) (prior quantiles): the
        search starts from the best of u0 and these (one call).
      eps: the machine epsilon of f's dtype: in float32 f carries rounding
        of ~eps |f|, so the difference step and the tolerances grow with it
        (``_precision``).
    """
    u = np.asarray(u0, dtype=np.float64)
    k = u.shape[0]
    step, decrement_tol = DIFFERENCE_STEP, DECREMENT_TOL
    if scouts is not None and len(scouts):
        candidates = np.concatenate([u[None], np.asarray(scouts, np.float64).reshape(-1, k)])
        values = log_joint(candidates)
        values = np.where(np.isfinite(values), values, -np.inf)
        u = candidates[int(np.argmax(values))]
    eye = np.eye(k)
    value, grad, hessian = derivatives(log_joint(stencil(u, step)), k, step)
    if np.isfinite(value):
        step, decrement_tol = _precision(eps, value)
        value, grad, hessian = derivatives(log_joint(stencil(u, step)), k, step) if step != DIFFERENCE_STEP else (value, grad, hessian)
    if not np.isfinite(value):
        raise FloatingPointError(
            "log p(y, h) is not finite at the start of the mode search (h from the prior); the model's "
            "density is probably not finite there: check the model or name other hyperparameters."
        )
    trace, converged = [], False
    lengths = np.asarray(LINE_SEARCH)
    for _ in range(int(num_steps)):
        symmetric = 0.5 * (hessian + hessian.T)
        top = float(np.max(np.linalg.eigvalsh(symmetric)))
        lam = 1.1 * top + 1e-8 * (1.0 + abs(top)) if top >= 0 else 0.0
        try:
            direction = np.linalg.solve(-symmetric + lam * eye, grad)
        except np.linalg.LinAlgError:
            direction = np.full(k, np.nan)
        if not np.all(np.isfinite(direction)):
            direction = grad / (1.0 + np.max(np.abs(grad)))
        direction = direction * min(1.0, MAX_STEP / max(float(np.max(np.abs(direction))), 1e-300))
        # One call: the stencil around the full step and the shorter steps of the line search.
        full = stencil(u + direction, step)
        shorter = u + lengths[1:, None] * direction
        values = log_joint(np.concatenate([full, shorter]))
        values = np.where(np.isfinite(values), values, -np.inf)
        tol = 64.0 * eps * (1.0 + abs(value))
        if values[0] >= value - tol:  # the Newton step is taken: its derivatives are at hand
            u = full[0]
            value, grad, hessian = derivatives(values[: len(full)], k, step)
        else:
            best = int(np.argmax(values[len(full) :]))
            if values[len(full) + best] < value - tol:
                trace.append(value)
                break  # no step along d raises f: at the mode to rounding, or stuck
            u = shorter[best]
            value, grad, hessian = derivatives(log_joint(stencil(u, step)), k, step)
        trace.append(value)
        converged = _decrement(grad, hessian) < decrement_tol
        if converged:
            break
    converged = converged or _decrement(grad, hessian) < decrement_tol
    return ModeSearch(u, value, grad, hessian, np.asarray(trace), len(trace), bool(converged))


def _precision(eps: float, value: float) -> tuple[float, float]:
    """The difference step and the decrement tolerance for f rounded to ``eps`` |f|.

    Second differences err by ~noise / step² and by ~step² from f's
    curvature, balanced at step ~ noise^(1/4): 1e-3 in float64 (the floor),
    ~0.05 in float32; the gradient's noise, ~noise / step, bounds the
    decrement a search can reach.
    """
    noise = eps * (1.0 + abs(value))
    step = max(DIFFERENCE_STEP, noise**0.25)
    return step, max(DECREMENT_TOL, 100.0 * (noise / step) ** 2 + 100.0 * noise)


def _decrement(grad: np.ndarray, hessian: np.ndarray) -> float:
    symmetric = 0.5 * (hessian + hessian.T)
    if grad.size == 0:
        return 0.0
    if np.max(np.linalg.eigvalsh(symmetric)) >= 0:
        return np.inf
    return float(grad @ np.linalg.solve(-symmetric, grad))
