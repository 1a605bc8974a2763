"""The engine: a model and a configuration; ``run`` plans, compiles once, fits.

Engines hold configuration only (numpyro ``SVI`` without its mutation of
``self``): ``run`` plans the fit (:func:`~blrppl.blr.plan.make_plan`), takes
the compiled algorithm for the plan's signature from the engine's memo (or
builds it), runs the driver with the plan's data as an argument and returns
everything in the result. A second ``run`` on new data of the same shapes
neither traces the step nor compiles it again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from blrppl import importance_spread, linear_response
from blrppl.blr import driver
from blrppl.blr.ahead import idle_time
from blrppl.blr.build import build_blr, judged_by_mode
from blrppl.blr.checks import (
    boundary_estimates, drifted_average, fell_from_best, fit_error, lower_boundary_check, off_target, steady_climb,
    vanishing_sites,
)
from blrppl.blr.config import Config
from blrppl.blr.newton import PLAIN_STEPS_FIRST
from blrppl.blr.plan import Plan, make_plan
from blrppl.blr.replan import Replanner, record_plan
from blrppl.blr.restarts import (
    DETERMINISTIC_SLACK, NOISY_SLACK, best_restart, default_restarts, disagreement,
)
from blrppl.blr.serial_restarts import run_serial_restarts
from blrppl.blr.starts import raise_invalid_start, start_tests
from blrppl.blr.state import InferenceAlgorithm
from blrppl.compile_mode import full_precision, to_device
from blrppl.errors import ModelError
from blrppl.engines.batch import run_batched
from blrppl.graph.data import split_model_data
from blrppl.results import BatchResult, BLRResult, Convergence, Restarts
from blrppl.saving import load


class Engine:
    """A model with a BLR configuration (Khan & Rue, Eqs. 58 and 60).

    The Table 1 presets (``VMP``, ``EM``, ...) are this class with a
    configuration from :mod:`blrppl.engines.presets`; nothing else differs.

    Attributes:
      model: the NumPyro model.
      config: the :class:`~blrppl.blr.config.Config`.
    """

    def __init__(self, model: Callable, config: Config):
        self.model = model
        self.config = config
        # Memos, the only state an engine keeps: compiled algorithms by plan
        # signature (jax.jit caches the compiled programs per algorithm), and
        # compiled planners by the data's shapes (blrppl.blr.replan).
        self._algorithms: dict = {}
        self._replanners: dict = {}

    @property
    def mode(self) -> str:
        """``"global"`` (Eq. 58) or ``"local"`` (Eq. 60)."""
        return self.config.mode

    @full_precision
    def plan(self, *model_args: Any, **model_kwargs: Any) -> Plan:
        """Trace the model and choose every factor's estimator.

        The first plan for data of given shapes is made on the host and
        recorded; later data of the same shapes are planned by one compiled
        call, without tracing the model (:mod:`blrppl.blr.replan`), unless
        they would change the plan's structure or fail validation: those are
        planned on the host again (which says what is wrong with them).
        """
        data = split_model_data(model_args, model_kwargs)
        replanner = self._replanners.get(data.signature)
        if replanner is not None:
            plan = replanner.plan_for(data)
            if plan is not None:
                return plan
            return make_plan(self.model, model_args, model_kwargs, self.config)
        plan, replanner = record_plan(self.model, model_args, model_kwargs, self.config)
        if replanner is not None:
            self._replanners[data.signature] = replanner
        return plan

    def replanner(self, *model_args: Any, **model_kwargs: Any) -> Optional[Replanner]:
        """The compiled planner for data of these shapes, if a plan made one (else None)."""
        return self._replanners.get(split_model_data(model_args, model_kwargs).signature)

    def build(
        self, plan: Plan, *, random_starts: bool = False, fixed_params: bool = False, newton: bool = True
    ) -> InferenceAlgorithm:
        """The functional core for a plan, shared by every plan with the same signature
        (``newton=False``: without the damped Newton candidates of ``config.newton``)."""
        key = (plan.signature, random_starts, fixed_params, newton)
        algorithm = self._algorithms.get(key)
        if algorithm is None:
            config = self.config if newton else self.config._replace(newton=False)
            algorithm = build_blr(plan, config, random_starts=random_starts, fixed_params=fixed_params)
            self._algorithms[key] = algorithm
        return algorithm

    def _boundary_check(self, plan: Plan) -> Optional[Callable]:
        """``(state, arrays) -> lowered program``: the boundary check of :meth:`_flags` for point
        estimates (None without any), to compile beside the fit's programs."""
        if not plan.init_params:
            return None
        e_step = self.build(plan, fixed_params=True)
        return lambda state, arrays: lower_boundary_check(plan, e_step, state, arrays)

    def _flags(
        self, plan: Plan, state: Any, elbo: jax.Array, stopped: bool, noisy: bool = False, natural: Any = None,
        spread: Any = None, weighted: Any = None,
    ) -> tuple[str, ...]:
        """Doubts about a finished fit (see :mod:`blrppl.blr.checks`); ``noisy``: Monte Carlo site
        parameters, whose ELBO trace may fall and rise with the draws; ``natural``: the state's
        λ already on the host, if at hand; ``spread``, ``weighted``: the linear-response and
        importance-weighted checks of the state (:mod:`blrppl.linear_response`,
        :mod:`blrppl.importance_spread`), if dispatched already (:meth:`fit` starts them before
        its own checks of the run)."""
        if not len(elbo):
            return ()
        if spread is None:  # runs while the host checks
            spread = linear_response.dispatch(plan, state.natural, state.params)
        if weighted is None:
            weighted = importance_spread.dispatch(plan, state.natural, state.params)
        if plan.init_params:
            boundary = boundary_estimates(plan, self.build(plan, fixed_params=True), state, float(np.asarray(elbo)[-1]))
            if boundary:
                return boundary
        natural = jax.tree.map(np.asarray, state.natural if natural is None else natural)  # read once
        # (Newton steps climb log p̄(m), not the ELBO: their ELBO may fall on the way to the mode.)
        ascent = not noisy and plan.subsample is None and not judged_by_mode(plan)
        fell = fell_from_best(plan.qs, natural, elbo) if ascent else ()
        return off_target(state) + drifted_average(plan.qs, state) + (
            fell or (steady_climb(elbo, stopped) + vanishing_sites(plan.qs, natural))
        ) + linear_response.understated_spread_flag(None if spread is None else spread.read()) + (
            importance_spread.understated_spread_flag(None if weighted is None else weighted.read())
        )

    def batch_member_flags(
        self, plan: Plan, state: Any, elbo: np.ndarray, stopped: bool, noisy: bool, natural: Any = None
    ) -> tuple[tuple[str, ...], bool]:
        """``(flags, failed)`` for one data set of a batched fit (:mod:`blrppl.engines.batch`).

        What :meth:`fit` raises for a single data set (a divergence, an improper
        posterior: :func:`check_finite`) fails only that member here: its
        result carries the error's message as a flag, and ``failed`` is True.
        ``natural``: the member's λ on the host, where its fit may have failed;
        None where it cannot have (:func:`blrppl.blr.checks.sound_members`).
        """
        if natural is not None:
            algorithm = self.build(plan)
            error = fit_error(plan.qs, natural, elbo, algorithm.exact, algorithm.exact_targets, None, state.elbo_scale)
            if error is not None:
                return (f"this data set's fit failed: {error}",), True
        return self._flags(plan, state, elbo, stopped, noisy, natural), False

    @full_precision
    def run(
        self,
        rng_key: jax.Array,
        num_steps: int,
        *model_args: Any,
        progress_bar: bool = True,
        init_state: Any = None,
        tol: Optional[float] = None,
        num_restarts: Optional[int] = None,
        **model_kwargs: Any,
    ) -> BLRResult:
        """Fit q to the model's posterior; see ``shared/API.md``.

        Args:
          rng_key: a JAX PRNG key (symmetry breaking, Monte Carlo estimators).
          num_steps: the maximum number of BLR steps.
          *model_args, **model_kwargs: the model's own arguments.
          progress_bar: show a tqdm bar with the ELBO, like ``SVI.run``.
          init_state: a ``result.state`` to resume from (with restarts:
            ``result.restarts.state``); its random stream continues.
          tol: stop once a step changes the ELBO by at most ``tol`` relative to its
            size, ``|ELBO_t - ELBO_(t-1)| <= tol * |ELBO_t|``, and no more than that is left
            to gain by Aitken's extrapolation of shrinking steps, twice in a row (Monte
            Carlo site parameters: once the averaged q moves by at most KL ``tol``).
          num_restarts: fit from this many starts, one after another
            (:mod:`blrppl.blr.serial_restarts`); the
            result is the restart with the highest ELBO, keeps them all in
            ``result.restarts`` (see :mod:`blrppl.blr.restarts`) and says in
            ``result.flags`` when they ended in different optima. None (the
            default): ``DEFAULT_RESTARTS`` for models whose posterior is
            typically multimodal (discrete latents, mixtures), else 1.

        Returns:
          A :class:`~blrppl.results.BLRResult`.
        """
        with idle_time():  # what the fit does not need waits for idle time (blrppl.blr.ahead)
            plan = self.plan(*model_args, **model_kwargs)
            return self.fit(
                plan, rng_key, num_steps, progress_bar=progress_bar, init_state=init_state, tol=tol,
                num_restarts=num_restarts,
            )

    @full_precision
    def fit(
        self,
        plan: Plan,
        rng_key: jax.Array,
        num_steps: int,
        *,
        progress_bar: bool = True,
        init_state: Any = None,
        tol: Optional[float] = None,
        num_restarts: Optional[int] = None,
    ) -> BLRResult:
        """:meth:`run` on a plan already made (by :meth:`plan`, or :func:`blrppl.choose`).

        The plan must come from this engine's options (``engine.plan``), or
        from options that plan the same fit; ``run`` is ``fit(plan(...))``.
        """
        if num_restarts is None:
            num_restarts = 1 if init_state is not None else default_restarts(plan)
        if int(num_restarts) != num_restarts or num_restarts < 1:
            raise ValueError(f"num_restarts must be a positive integer, got {num_restarts}.")
        with idle_time():
            return self._fit(plan, rng_key, num_steps, progress_bar, init_state, tol, int(num_restarts))

    def _fit(self, plan, rng_key, num_steps, progress_bar, init_state, tol, num_restarts) -> BLRResult:
        linear_response.prepare(plan)  # the checks' programs compile beside the fit's, when idle
        importance_spread.prepare(plan)
        if num_restarts > 1:
            return self._run_restarts(plan, rng_key, num_steps, num_restarts, init_state, tol, progress_bar)
        algorithm = self.build(plan)
        if init_state is None:  # the start, its tests and the run without a wait between them
            # An exact run's step does not read its start (λ = Σ_f λ̃_f from any q, the prior's
            # factor included): it is not tested (a forward pass over a chain: a third of a local
            # level's run), and an invalid posterior is the step's own error.
            tests = () if algorithm.exact else start_tests(plan.qs)
            # Newton candidates only where plain steps did not converge (blrppl.blr.newton).
            tiered = algorithm.newton and num_steps > PLAIN_STEPS_FIRST
            first = self.build(plan, newton=False) if tiered else algorithm
            state, elbo, stopped, valid = driver.checked_run(
                first, rng_key, PLAIN_STEPS_FIRST if tiered else num_steps, plan.arrays, tests, tol=tol,
                progress_bar=progress_bar, after=self._boundary_check(plan),
            )
            raise_invalid_start(plan.qs, valid)
            if tiered and not stopped and len(elbo):
                state, more, stopped = driver.run(
                    algorithm, rng_key, num_steps - PLAIN_STEPS_FIRST, plan.arrays, init_state=state, tol=tol,
                    progress_bar=progress_bar,
                )
                elbo = to_device(np.concatenate([np.asarray(elbo), np.asarray(more)]))
        else:
            state, elbo, stopped = driver.run(
                algorithm, rng_key, num_steps, plan.arrays, init_state=init_state, tol=tol, progress_bar=progress_bar
            )
        # The linear-response check runs on the device while the host checks the run.
        spread = linear_response.dispatch(plan, state.natural, state.params) if len(elbo) else None
        weighted = importance_spread.dispatch(plan, state.natural, state.params) if len(elbo) else None
        check_finite(plan, state, elbo, algorithm)
        convergence = Convergence.of(stopped, tol, len(elbo), algorithm.noisy, algorithm.exact, elbo.dtype)
        flags = self._flags(plan, state, elbo, bool(stopped), algorithm.noisy, spread=spread, weighted=weighted)
        return BLRResult(plan=plan, state=state, elbo=elbo, mode=self.mode, convergence=convergence, flags=flags)

    def _run_restarts(self, plan, rng_key, num_steps, num_restarts, init_state, tol, progress_bar) -> BLRResult:
        algorithm = self.build(plan)
        if init_state is not None:
            steps = jnp.shape(init_state.step)
            if steps != (num_restarts,):
                raise ValueError(
                    f"init_state must hold {num_restarts} stacked restarts (result.restarts.state) when "
                    f"num_restarts={num_restarts}; got a state whose step has shape {steps}. Resume a "
                    "single fit with num_restarts=1."
                )
        # One restart after another, each with the single fit's programs (blrppl.blr.serial_restarts).
        random_algorithm = self.build(plan, random_starts=True) if algorithm.finish is None else None
        states, elbo, num_run, stopped = run_serial_restarts(
            algorithm, random_algorithm, rng_key, num_restarts, num_steps, plan.arrays, start_tests(plan.qs),
            tol=tol, progress_bar=progress_bar, after=self._boundary_check(plan), init_states=init_state,
            check_start=lambda valid: raise_invalid_start(plan.qs, valid),
        )
        result = self.best_of_restarts(plan, states, np.asarray(elbo), np.asarray(num_run), np.asarray(stopped), tol)
        if result is None:  # every restart diverged: say why, for the first
            num_run = np.asarray(num_run)
            check_finite(plan, jax.tree.map(lambda a: a[0], states), elbo[0, : num_run[0]], algorithm)
            raise ModelError(f"site {next(iter(plan.qs))!r}: every restart diverged; check the model and data.")
        check_finite(plan, result.state, result.elbo, algorithm)  # the best is the answer: as a single run's
        return result

    def best_of_restarts(
        self, plan: Plan, states: Any, elbo: np.ndarray, num_run: np.ndarray, stopped: np.ndarray,
        tol: Optional[float], checks: Optional[Callable] = None,
    ) -> Optional[BLRResult]:
        """The result of a fit with restarts (C stacked final states, their ELBO traces, steps
        and stops, on the host): the best restart's, with every restart in ``restarts``; None
        where every restart diverged. ``checks``: ``(index, state, elbo, stopped) -> flags`` of
        the best restart (default: :meth:`_flags`)."""
        algorithm = self.build(plan)
        num_run = num_run.tolist()  # one read (iterating a device array compiles an unstack)
        best, finite = best_restart(states, elbo, num_run)
        if best < 0:
            return None
        state = driver.take(states, best)
        restarts = Restarts(
            state=states, elbo=to_device(elbo), num_steps=to_device(np.asarray(num_run)), best=best,
            finite=to_device(np.asarray(finite)),
        )
        best_stopped = bool(stopped[best])
        best_elbo = to_device(elbo[best, : num_run[best]])  # cut on the host: nothing compiles
        convergence = Convergence.of(best_stopped, tol, num_run[best], algorithm.noisy, algorithm.exact, best_elbo.dtype)
        if checks is None:
            flags = self._flags(plan, state, best_elbo, best_stopped, algorithm.noisy)
        else:
            flags = checks(best, state, elbo[best, : num_run[best]], best_stopped)
        return BLRResult(
            plan=plan, state=state, elbo=best_elbo, mode=self.mode, restarts=restarts, convergence=convergence,
            flags=flags + disagreement(
                elbo, num_run, finite, NOISY_SLACK if algorithm.noisy else DETERMINISTIC_SLACK
            ),
        )

    @full_precision
    def run_batched(
        self,
        rng_key: jax.Array,
        num_steps: int,
        *model_args: Any,
        tol: Optional[float] = None,
        progress_bar: bool = False,
        num_restarts: Optional[int] = None,
        shared: Sequence[str] = (),
        **model_kwargs: Any,
    ) -> BatchResult:
        """Fit B data sets in one compiled, vmapped run (see :mod:`blrppl.engines.batch`).

        Every array argument carries a leading axis B, but those named in
        ``shared`` (the model's parameter names, e.g. ``shared=("X",)`` for a
        design matrix every data set shares: broadcast, each reads the same);
        data set i runs with key ``fold_in(rng_key, i)`` (data set 0 with
        ``rng_key``), from ``num_restarts`` starts as :meth:`run` (None: its
        default, ``DEFAULT_RESTARTS`` for discrete latents, else 1), and stops
        on its own with ``tol``: ``result[i]`` equals ``run`` on data set i.

        Returns:
          A :class:`~blrppl.results.BatchResult`: ``result[i]`` is data set i's
          :class:`~blrppl.results.BLRResult`.
        """
        return run_batched(
            self, rng_key, num_steps, model_args, model_kwargs, tol=tol, progress_bar=progress_bar,
            num_restarts=num_restarts, shared=shared,
        )

    def load(self, path: Any, *model_args: Any, **model_kwargs: Any) -> BLRResult:
        """A result saved with ``result.save(path)``, for this engine, model and data.

        The file holds arrays only (the state, the ELBO, restarts); the graph is
        traced again from ``model_args``/``model_kwargs``, which must be the
        data of the saved fit. See :mod:`blrppl.saving`.
        """
        return load(path, self, *model_args, **model_kwargs)

    def guide(self, result: BLRResult) -> Callable:
        """A NumPyro guide that samples from the fitted q (for ``Predictive``)."""
        return result.guide()


def check_finite(plan: Plan, state: Any, elbo: jax.Array, algorithm: Optional[InferenceAlgorithm] = None) -> None:
    """A run that diverged (q or the ELBO not finite, an ELBO without bound), an exact run
    whose posterior is not a valid q (``algorithm.exact``), or a run whose last step found the
    ELBO without a maximum (``algorithm.exact_targets``, named by ``algorithm.unbounded_sites``)
    is an error.

    Raises:
      ModelError: naming the site (see :func:`blrppl.blr.checks.improper_posterior_error`,
        :func:`~blrppl.blr.checks.invalid_exact_posterior_error` and
        :func:`~blrppl.blr.checks.unbounded_elbo_error`).
    """
    exact, targets = (algorithm.exact, algorithm.exact_targets) if algorithm is not None else (False, ())
    error = fit_error(
        plan.qs, state.natural, elbo, exact, targets, lambda: _culprits(algorithm, state, plan.arrays),
        getattr(state, "elbo_scale", None),
    )
    if error is not None:
        raise error


def _culprits(algorithm: InferenceAlgorithm, state: Any, arrays: Any) -> list:
    """The exact-target variables whose target at ``state`` is outside the family (only where the
    ELBO has no maximum: a program compiled for the error's message)."""
    verdicts = np.asarray(jax.jit(algorithm.unbounded_sites)(state, arrays))
    return [v for v, bad in zip(sorted(algorithm.exact_targets), verdicts) if bad]
