"""The options of an integrated fit (the ``Integrated`` engine's configuration value)."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

INNER = ("auto", "exact", "laplace", "vi")


class IntegratedConfig(NamedTuple):
    """How hyperparameters are chosen and integrated (see :mod:`blrppl.blr.integrate`).

    Attributes:
      hyper: the hyperparameter sites h, or None to choose them.
      max_dim: the largest total dimension of h (on its unconstrained space)
        that is integrated on a grid; larger h is a ``ModelError``.
      drop: the grid extends in every direction until log p(h, y) has dropped
        by this much below its mode (15: the mass left out is below ~1e-6
        for tails that decay at least exponentially).
      step: the grid step in the Hessian-standardised coordinates z (None:
        0.5 for one dimension, then coarser as the dimension grows).
      inner: the conditional fit q(c | h): ``"exact"`` (ConjugateBayes, its
        ELBO the exact log p(y | h)), ``"laplace"`` (Laplace's method on one
        Gaussian over c, its evidence the Laplace approximation: INLA-like),
        ``"vi"`` (one full Gaussian over c fitted by non-conjugate VI with
        deterministic site parameters, its ELBO standing in for log p(y | h):
        INLA with variational inner fits), or ``"auto"`` (exact where the
        model allows it).
      inner_steps: the most steps of an iterative inner fit (Laplace, VI).
      inner_tol: an iterative inner fit stops once its ELBO changes by less
        than this (relative to its scale).
      max_nodes: the most grid nodes evaluated; reaching it is reported.
      families: site -> q family overrides for the conditional fit.
      name: the preset's name, for messages.
    """

    hyper: Optional[tuple] = None
    max_dim: int = 5
    drop: float = 15.0
    step: Optional[float] = None
    inner: str = "auto"
    inner_steps: int = 50
    inner_tol: float = 1e-10
    max_nodes: int = 50_000
    families: Mapping[str, str] = {}
    name: str = "Integrated"


def make_integrated_config(**options) -> IntegratedConfig:
    """Validate options and return an :class:`IntegratedConfig` (plain ``ValueError`` for bad values)."""
    config = IntegratedConfig(**options)
    if config.inner not in INNER:
        raise ValueError(f"inner must be one of {INNER}, got {config.inner!r}.")
    if int(config.max_dim) != config.max_dim or config.max_dim < 0:
        raise ValueError(f"max_dim must be a non-negative integer, got {config.max_dim}.")
    if not config.drop > 0:
        raise ValueError(f"drop must be positive, got {config.drop}.")
    if config.step is not None and not config.step > 0:
        raise ValueError(f"step must be positive, got {config.step}.")
    if int(config.inner_steps) != config.inner_steps or config.inner_steps < 1:
        raise ValueError(f"inner_steps must be a positive integer, got {config.inner_steps}.")
    hyper = config.hyper
    if isinstance(hyper, str):
        hyper = (hyper,)
    return config._replace(
        hyper=None if hyper is None else tuple(hyper),
        families=dict(config.families or {}),
        max_dim=int(config.max_dim),
        inner_steps=int(config.inner_steps),
    )
