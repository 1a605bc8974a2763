"""The shared engine: trace, choose estimators, build the core, run, wrap the result.

Engines hold configuration only (numpyro ``SVI`` without its mutation of
``self``): ``run`` traces the model, builds the functional core and returns
everything it made inside the result, so an engine is reusable across data
sets.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from blrppl.blr.build import averaged, build_blr, mean_params
from blrppl.blr.driver import run as run_algorithm
from blrppl.blr.schedules import as_schedule
from blrppl.blr.variational import VariableQ, variable_q
from blrppl.engines.init import initial_natural
from blrppl.engines.mstep import build_m_step
from blrppl.engines.blocks import as_blocks
from blrppl.engines.points import as_point_estimates
from blrppl.errors import ModelError
from blrppl.estimators.base import FactorEstimator, example_latents, q_space_examples
from blrppl.estimators.conjugacy import record_verdicts
from blrppl.estimators.exact import exact_estimator
from blrppl.estimators.hybrid import hybrid_estimator
from blrppl.estimators.nonconjugate import nonconjugate_estimator
from blrppl.graph.chains import discrete_loop_chain
from blrppl.graph.nodes import Edge, FactorGraph
from blrppl.graph.trace import build_graph
from blrppl.results import BLRResult
from blrppl.symbolic.terms import NonConjugate

ESTIMATORS = ("exact", "auto", "delta", "mc", "quadrature")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything ``run`` builds for one model: static, reusable for a resume."""

    graph: FactorGraph
    qs: dict[str, VariableQ]
    estimators: tuple[FactorEstimator, ...]
    init_params: dict[str, Any]
    param_transforms: dict[str, Any]
    subsample: Any = None  # SVI: the subsampled plate and its local variables


class Engine:
    """The Bayesian learning rule engine (Khan & Rue, Eqs. 58 and 60).

    Subclasses fix some options (Table 1 presets); this class checks them
    and implements ``run`` and ``guide``.
    """

    #: Whether every factor must have an exact site parameter.
    exact_only: bool = False
    #: The estimator for non-conjugate factors when ``estimator="exact"``.
    fallback: Optional[str] = None
    #: An estimator every factor uses, conjugate or not (Laplace: "delta").
    forced: Optional[str] = None

    def __init__(
        self,
        model: Callable,
        *,
        mode: str = "global",
        schedule: str = "sequential",
        learning_rate: Union[float, Callable] = 1.0,
        estimator: Union[str, Mapping[str, str]] = "exact",
        num_samples: int = 16,
        families: Optional[Mapping[str, str]] = None,
        blocks: Optional[Sequence[Sequence[str]]] = None,
        point_estimates: Optional[Sequence[str]] = None,
        init: Optional[Mapping[str, Any]] = None,
        order: Optional[Sequence[str]] = None,
        average: Optional[bool] = None,
    ):
        if mode not in ("global", "local"):
            raise ValueError(f"mode must be 'global' (Eq. 58) or 'local' (Eq. 60), got {mode!r}.")
        if schedule not in ("sequential", "parallel"):
            raise ValueError(f"schedule must be 'sequential' or 'parallel', got {schedule!r}.")
        if not callable(learning_rate) and not 0.0 < float(learning_rate) <= 1.0:
            raise ValueError(f"learning_rate must lie in (0, 1] or be a schedule, got {learning_rate}.")
        choices = estimator.values() if isinstance(estimator, Mapping) else [estimator]
        for choice in choices:
            if choice not in ESTIMATORS:
                raise ValueError(f"estimator must be one of {ESTIMATORS}, got {choice!r}.")
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples}.")
        self.model = model
        self.mode = mode
        self.schedule = schedule
        self.learning_rate = learning_rate
        self.estimator = estimator
        self.num_samples = int(num_samples)
        self.families = dict(families or {})
        self.blocks = [tuple(b) for b in (blocks or [])]
        self.point_estimates = tuple(point_estimates or ())
        self.init = dict(init or {})
        self.order = tuple(order) if order is not None else None
        self.average = average

    # -- planning ---------------------------------------------------------------

    def _estimator_choice(self, factor: str) -> str:
        if isinstance(self.estimator, Mapping):
            return self.estimator.get(factor, "exact")
        return self.estimator

    def plan(self, *model_args: Any, **model_kwargs: Any) -> Plan:
        """Trace the model and choose every factor's estimator (no compilation)."""
        graph = build_graph(self.model, model_args, model_kwargs, families=self.families or None)
        for plate in graph.plates.values():
            if plate.subsampled:
                raise ModelError(
                    f"site {plate.name!r}: the plate subsamples {plate.subsample_size} of {plate.size}; "
                    "fit minibatch models with blrppl.SVI."
                )
        return self._plan_graph(graph)

    def _plan_graph(
        self,
        graph: FactorGraph,
        observation_plates: Optional[Mapping[str, Any]] = None,
        blocks: Optional[Sequence[Sequence[str]]] = None,
    ) -> Plan:
        """Choose every factor's estimator for a traced graph."""
        observation_plates = observation_plates or {}
        graph = as_point_estimates(graph, self.point_estimates)
        graph = as_blocks(graph, self.blocks if blocks is None else blocks)
        self._check_options(graph)
        qs = {name: variable_q(node, graph.plates) for name, node in graph.variables.items()}
        transforms = {v: q.transform for v, q in qs.items() if q.transform is not None}
        examples = q_space_examples(example_latents(graph), transforms)
        init_params, param_transforms = _param_examples(graph)
        estimators = []
        for name in graph.factors:
            plate = observation_plates.get(name)
            estimators.append(self._factor_estimator(graph, name, qs, examples, init_params, plate))
        return Plan(graph, qs, tuple(estimators), init_params, param_transforms)

    def _check_options(self, graph: FactorGraph) -> None:
        for site in self.families:
            if site not in graph.variables and not any(site in (m.name for m in n.members) for n in graph.variables.values()):
                raise ModelError(f"site {site!r}: families names a site that is not a latent of the model; use one of {sorted(graph.variables)}.")
        for site in self.init:
            if site not in graph.variables:
                raise ModelError(f"site {site!r}: init names a site that is not a latent variable of the model; use one of {sorted(graph.variables)}.")
        if isinstance(self.estimator, Mapping):
            for factor in self.estimator:
                if factor not in graph.factors:
                    raise ModelError(f"site {factor!r}: estimator names a factor the model does not have; use one of {sorted(graph.factors)}.")
        linked = discrete_loop_chain(graph)
        if linked is not None:
            raise ModelError(
                f"site {linked[0]!r}: the discrete latents {', '.join(repr(s) for s in linked[:3])}"
                f"{', ...' if len(linked) > 3 else ''} form a Markov chain written one site per step "
                "(a Python loop or numpyro.markov), which blrppl does not join into one chain q; write "
                "the chain with numpyro.contrib.control_flow.scan (the initial state sampled before the "
                "scan, each step's state inside it) so that it gets a ChainCategorical q."
            )
        if self.order is not None and sorted(self.order) != sorted(graph.variables):
            raise ModelError(f"site {self.model.__name__!r}: order must list every latent variable once: {sorted(graph.variables)}; got {list(self.order)}.")

    def _factor_estimator(self, graph, name, qs, examples, init_params, plate=None) -> FactorEstimator:
        choice = self._estimator_choice(name)
        node = graph.factors[name]
        explicit = isinstance(self.estimator, Mapping) and name in self.estimator
        if self.forced is not None:
            return nonconjugate_estimator(graph, name, qs, examples, self.forced, self.num_samples, "Laplace")
        if explicit and choice != "exact" and not self.exact_only:
            return nonconjugate_estimator(graph, name, qs, examples, choice, self.num_samples, "chosen by the user")
        try:
            estimator = exact_estimator(graph, name, qs, examples, init_params, plate)
        except NonConjugate as error:
            record_verdicts(graph, name, qs, examples, init_params, error)
            var = error.var
            reason = node.edges[var].reason if var in node.edges else error.reason
            method = choice if choice != "exact" else self.fallback
            if method is None or self.exact_only:
                raise ModelError(
                    f"site {name!r}: the factor is not conjugate in {var!r} ({reason}); "
                    "use an engine with non-conjugate estimators (NonConjugateVI, or BLR with "
                    "estimator='mc', 'delta' or 'quadrature') or rewrite the model with conjugate priors."
                ) from None
            uncertain = tuple(v for v in node.neighbours if node.edges.get(v) is not None and node.edges[v].conjugate is False)
            if 0 < len(uncertain) < len(node.neighbours):
                try:
                    return hybrid_estimator(graph, name, qs, examples, init_params, uncertain, method, self.num_samples)
                except (NonConjugate, ModelError):
                    pass  # no exact part: estimate every edge
            if init_params and node.param_neighbours:
                raise ModelError(
                    f"site {name!r}: the factor is not conjugate in {var!r} ({reason}) and touches "
                    f"point estimates {list(node.param_neighbours)}; EM needs exact expected log factors."
                )
            return nonconjugate_estimator(graph, name, qs, examples, method, self.num_samples, reason)
        for v in node.neighbours:
            node.edges[v] = Edge(True, "exact site parameter")
        return estimator

    # -- running ------------------------------------------------------------------

    def _rho(self):
        return as_schedule(self.learning_rate)

    def _m_step(self, plan: Plan):
        return build_m_step(plan)

    def run(
        self,
        rng_key: jax.Array,
        num_steps: int,
        *model_args: Any,
        progress_bar: bool = True,
        init_state: Any = None,
        tol: Optional[float] = None,
        num_restarts: int = 1,
        **model_kwargs: Any,
    ) -> BLRResult:
        """Fit q to the model's posterior; see ``shared/API.md``.

        Args:
          rng_key: a JAX PRNG key (symmetry breaking, Monte Carlo estimators).
          num_steps: the maximum number of BLR steps.
          *model_args, **model_kwargs: the model's own arguments.
          progress_bar: show a tqdm bar with the ELBO, like ``SVI.run``.
          init_state: a ``result.state`` to resume from (with restarts:
            ``result.restarts.state``).
          tol: stop once the ELBO changes by less than ``tol`` in one step.
          num_restarts: fit from this many starts in one vmapped run; the
            result is the restart with the highest ELBO and keeps them all
            in ``result.restarts`` (see :mod:`blrppl.engines.restarts`).

        Returns:
          A :class:`~blrppl.results.BLRResult`.
        """
        if int(num_restarts) != num_restarts or num_restarts < 1:
            raise ValueError(f"num_restarts must be a positive integer, got {num_restarts}.")
        plan = self.plan(*model_args, **model_kwargs)
        if num_restarts > 1:
            from blrppl.engines.restarts import run_with_restarts

            return run_with_restarts(
                self, plan, rng_key, num_steps, int(num_restarts), init_state=init_state, tol=tol, progress_bar=progress_bar
            )
        algorithm = self.build(plan, rng_key)
        state, elbo = run_algorithm(
            algorithm, rng_key, num_steps, init_state=init_state, tol=tol, progress_bar=progress_bar
        )
        state = averaged(state)
        _check_finite(state, elbo)
        return BLRResult(plan=plan, state=state, elbo=elbo, mode=self.mode)

    def build(self, plan: Plan, rng_key: Optional[jax.Array] = None, *, random_start: bool = False):
        """The functional core for a plan (an ``InferenceAlgorithm``).

        ``rng_key`` is used by engines that fix randomness for a whole run
        (SVI's epoch permutations); the others ignore it. ``random_start``:
        ``init`` starts each q at a random point (restarts).
        """
        del rng_key
        order = self.order or tuple(plan.qs)
        return build_blr(
            plan.qs,
            plan.estimators,
            rho=self._rho(),
            init_natural=self._init_natural(plan, random_start),
            init_params=plan.init_params,
            mode=self.mode,
            schedule=self.schedule,
            order=order,
            m_step=self._m_step(plan) if plan.init_params else None,
            average=self._average(plan),
            guard=self._guard(plan),
        )

    def _guard(self, plan: Plan) -> bool:
        """ELBO-guarded steps where estimated site parameters are deterministic."""
        methods = {m for e in plan.estimators for m in e.method.split("+")}
        return bool(methods & {"quadrature", "delta"}) and "mc" not in methods

    def _average(self, plan: Plan) -> bool:
        """Iterate averaging where site parameters are noisy (Monte Carlo) and ρ < 1."""
        if self.average is not None:
            return bool(self.average)
        noisy = any("mc" in e.method.split("+") for e in plan.estimators)
        return noisy and (callable(self.learning_rate) or float(self.learning_rate) < 1.0)

    def _init_natural(self, plan: Plan, random_start: bool = False) -> Callable:
        """``rng_key -> natural``: where q starts (randomly re-centred for restarts)."""
        compiled: dict = {}  # the compiled starts, reused when the algorithm runs again

        def init_natural(rng_key):
            natural = initial_natural(rng_key, plan, self.init, cache=compiled)
            if random_start:
                from blrppl.engines.restarts import random_start as jitter

                natural = jitter(jax.random.fold_in(rng_key, 1), plan, natural, keep=self.init)
            return natural

        return init_natural

    def load(self, path: Any, *model_args: Any, **model_kwargs: Any) -> BLRResult:
        """A result saved with ``result.save(path)``, for this engine, model and data.

        The file holds arrays only (the state, the ELBO, restarts); the graph is
        traced again from ``model_args``/``model_kwargs``, which must be the
        data of the saved fit. See :mod:`blrppl.saving`.
        """
        from blrppl.saving import load

        return load(path, self, *model_args, **model_kwargs)

    def guide(self, result: BLRResult) -> Callable:
        """A NumPyro guide that samples from the fitted q (for ``Predictive``)."""
        return result.guide()


def _check_finite(state: Any, elbo: jax.Array) -> None:
    """An unrecoverable run (q not finite) is an error that says what happened."""
    for v, natural in state.natural.items():
        if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(natural)):
            raise FloatingPointError(
                f"site {v!r}: q's natural parameters are not finite after the run although every "
                "step was checked; the model's log density is probably not finite at q's starting "
                "point. Start elsewhere (init=...) or check the model."
            )
    if len(elbo) and not bool(jnp.isfinite(elbo[-1])):
        raise FloatingPointError(
            "the ELBO is not finite after the run: a factor's expected log density diverges "
            "under q (a Monte Carlo draw outside the support, or an improper factor); use a smaller "
            "learning_rate or more num_samples."
        )


def _param_examples(graph: FactorGraph) -> tuple[dict, dict]:
    """Initial values (constrained) and transforms of ``numpyro.param`` sites."""
    from numpyro.distributions.transforms import biject_to

    values, transforms = {}, {}
    for name, node in graph.params.items():
        values[name] = jnp.asarray(node.init_value)
        transforms[name] = biject_to(node.constraint)
    return values, transforms


def posterior_means(plan: Plan, natural: Mapping[str, Any]) -> dict:
    """Mean parameters of every variable (handy in tests and diagnostics)."""
    return mean_params(plan.qs, natural)
