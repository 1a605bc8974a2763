"""``Integrated``: exact conditionals integrated over a few hyperparameters (Table 1, "New")."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax

from blrppl.blr.integrate import integrate
from blrppl.compile_mode import full_precision
from blrppl.engines import presets
from blrppl.errors import IntegrationWarning
from blrppl.integrated_result import IntegratedResult


class Integrated:
    """q(c) = Σ_k w_k q(c | h_k): the posterior, up to quadrature error, for models conjugate given h.

    Chooses the hyperparameters h (or takes ``hyper=[...]``): the smallest set
    of continuous latents given which every other factor is conjugate and
    ConjugateBayes is exact (joint Gaussian blocks where factors couple sites,
    a chain Gaussian for a local level), so that q(c | h) is the exact
    conditional posterior and its ELBO the exact log p(y | h). Where no small
    h does that, c is fitted by Laplace's method given h (INLA-like; the
    result says so). Then it finds the mode of log p(y | h) + log p(h) on
    h's unconstrained space by damped Newton steps (``num_steps`` bounds
    them), lays a grid in Hessian-standardised coordinates that extends until
    the log density has dropped ``drop`` in every direction, and evaluates all
    nodes with one vmapped compiled conditional fit. The result
    (:class:`~blrppl.integrated_result.IntegratedResult`) is the mixture of
    the nodes' q with weights p(y, h_k), with exact mixture moments,
    ``log_marginal_likelihood`` and diagnostics that flag an untrustworthy
    grid (also as a warning). See :mod:`blrppl.blr.integrate`.

    Args:
      model: the NumPyro model.
      hyper: the hyperparameter sites, or None to choose them.
      max_dim: the largest dimension of h (unconstrained) integrated on a
        grid; larger is a ``ModelError`` that suggests
        ``NonConjugateVI(blocks="all")``.
      drop: the grid's reach, in units of log density below the mode.
      step: the grid step in standardised coordinates (None: by dim(h)).
      inner: ``"auto"``, ``"exact"`` or ``"laplace"`` conditional fits.
      inner_steps: the most Newton steps of a Laplace conditional fit.
      max_nodes: the most grid nodes evaluated.
      families: site -> q family overrides for the conditional fit.
    """

    def __init__(
        self,
        model: Callable,
        hyper: Optional[Union[str, Sequence[str]]] = None,
        *,
        max_dim: int = 5,
        drop: float = 15.0,
        step: Optional[float] = None,
        inner: str = "auto",
        inner_steps: int = 50,
        max_nodes: int = 50_000,
        families: Optional[Mapping[str, str]] = None,
    ):
        self.model = model
        self.config = presets.integrated(
            hyper=hyper, max_dim=max_dim, drop=drop, step=step, inner=inner, inner_steps=inner_steps,
            max_nodes=max_nodes, families=families,
        )
        # Compiled conditional fits by plan signature, and the choice of h by data shapes:
        # a memo, the only state an engine keeps.
        self._conditionals: dict = {}

    @full_precision
    def run(
        self,
        rng_key: jax.Array,
        num_steps: int,
        *model_args: Any,
        progress_bar: bool = True,
        tol: Optional[float] = None,
        init_state: Any = None,
        num_restarts: Optional[int] = None,
        **model_kwargs: Any,
    ) -> IntegratedResult:
        """Fit the model; ``num_steps`` bounds the mode search (Newton steps).

        The fit is deterministic: ``rng_key`` is accepted for the common
        engine signature and not used; ``progress_bar`` is accepted and
        ignored (a fit takes a handful of compiled calls), and so is ``tol``
        (the mode search stops at its own Newton decrement; whether it did is
        ``result.converged``). ``init_state`` and ``num_restarts`` have no
        meaning here (nothing is resumed or restarted): a value other than
        None is a ``ValueError``. A fit whose grid is not to be trusted warns
        (``IntegrationWarning``) and says why in ``result.flags`` (=
        ``result.diagnostics.problems``).
        """
        del rng_key, progress_bar, tol
        for name, value in (("init_state", init_state), ("num_restarts", num_restarts)):
            if value is not None:
                raise ValueError(f"Integrated.run takes no {name}: its fit is deterministic, one quadrature grid.")
        if int(num_steps) != num_steps or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps}.")
        fit = integrate(self.model, model_args, model_kwargs, self.config, int(num_steps), self._conditionals)
        if not fit.diagnostics.ok:
            warnings.warn(
                "Integrated: the grid over " + ", ".join(repr(s) for s in fit.choice.sites) + " is not to be trusted: "
                + "; ".join(fit.diagnostics.problems) + ".",
                IntegrationWarning,
                stacklevel=2,
            )
        return IntegratedResult(fit)

    def guide(self, result: IntegratedResult) -> Callable:
        """A NumPyro guide drawing from the mixture (for ``Predictive``)."""
        return result.guide()
