"""The result of a fit: q, the ELBO trace, point estimates, samples and a guide."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from blrppl.blr.state import BLRState
from blrppl.compile_mode import full_precision, to_device
from blrppl.graph.replay import split_latents
from blrppl.posterior import posterior_distributions


class Restarts(NamedTuple):
    """All restarts of a ``run(..., num_restarts=C)`` fit.

    Attributes:
      state: the C final states, stacked (every leaf has a leading axis C);
        pass it as ``init_state`` with ``num_restarts=C`` to resume them all.
      elbo: ``(C, L)`` ELBO traces, NaN after a restart stopped (``tol``).
      num_steps: ``(C,)`` the number of steps each restart ran.
      best: the index of the restart with the highest final ELBO, the one
        the result reports.
      finite: ``(C,)`` bool, False for a restart whose q or ELBO is not
        finite at its end (it diverged; never the best, not in ``to_arviz``).
    """

    state: BLRState
    elbo: jax.Array
    num_steps: jax.Array
    best: int
    finite: jax.Array


class Convergence(NamedTuple):
    """Whether and why a run stopped (``result.converged``; ``bool()`` gives ``stopped``).

    Attributes:
      stopped: ``tol`` stopped the run before ``num_steps``.
      reason: in words: the criterion met, or why the run did not stop.
      num_steps: the number of steps run.
      monte_carlo: the criterion was the averaged q's movement (Monte Carlo
        site parameters), not the ELBO's relative change.
    """

    stopped: bool
    reason: str
    num_steps: int
    monte_carlo: bool = False

    def __bool__(self) -> bool:
        return bool(self.stopped)

    @classmethod
    def of(
        cls, stopped: bool, tol: Optional[float], num_steps: int, noisy: bool, exact: bool = False, elbo_dtype: Any = None
    ) -> "Convergence":
        """The record of a run (see :func:`blrppl.blr.driver.run` for the criteria; ``elbo_dtype``: the
        ELBO's, whose resolution bounds the relative change a deterministic run can be asked for)."""
        if tol is None:
            return cls(False, "no tol given: the run took every step asked for", num_steps, noisy)
        dtype = jnp.dtype(elbo_dtype if elbo_dtype is not None else jnp.result_type(float))
        criterion = _criterion(float(tol), bool(noisy), bool(exact), dtype)
        if stopped:
            return cls(True, f"converged: {criterion}", num_steps, noisy)
        return cls(False, f"not converged in {num_steps} steps: {criterion} did not hold; run longer", num_steps, noisy)


@functools.lru_cache(maxsize=256)
def _criterion(tol: float, noisy: bool, exact: bool, dtype: Any) -> str:
    """The stopping criterion of :meth:`Convergence.of` in words (made once per setting: a small
    model's refit lasts a fraction of a millisecond)."""
    from blrppl.blr.stopping import elbo_resolution

    if exact:
        criterion = (
            "one rho = 1 step with site parameters that do not depend on q is its own fixed point "
            "(conjugate Bayes, Khan & Rue Sec. 5.1), and the step was taken"
        )
    elif noisy:
        criterion = f"the averaged q moved by at most KL {tol:g} per block over two windows of steps"
    else:
        floor = elbo_resolution(dtype)
        criterion = (
            f"the ELBO changed by at most {max(tol, floor):g} relative, with no more than that left to gain "
            "by Aitken's extrapolation of its shrinking steps, two steps in a row"
        )
        if tol < floor:
            criterion += f" (tol {tol:g} is below {dtype.name}'s resolution of the ELBO and was raised to it)"
    return criterion


class BLRResult(NamedTuple):
    """What ``engine.run`` returns.

    Attributes:
      plan: the traced graph, each variable's q and each factor's estimator.
      state: the final engine state; pass it back as ``init_state`` to resume.
      elbo: the ELBO of q after each step run, shape ``(num_steps,)`` (fewer
        when ``tol`` stopped the run early).
      mode: ``"global"`` or ``"local"``.
      restarts: with ``num_restarts=C > 1``, every restart
        (:class:`Restarts`); ``state``, ``elbo`` and everything derived from
        them (``posterior``, ``params``, ``sample``, ...) are then the best
        restart's. None for a single fit.
      convergence: whether and why the run stopped (see ``converged``).
      flags: doubts about the answer found after the run, one message each
        (e.g. a point estimate whose maximum lies on its support's boundary);
        empty when none.
    """

    plan: Any
    state: BLRState
    elbo: jax.Array
    mode: str
    restarts: Optional[Restarts] = None
    convergence: Optional[Convergence] = None
    flags: tuple = ()

    @property
    def converged(self) -> Convergence:
        """Whether and why the run stopped (a :class:`Convergence`; truthy when ``tol`` stopped it)."""
        if self.convergence is None:
            return Convergence(False, "unknown (a loaded or hand-built result)", int(len(self.elbo)))
        return self.convergence

    @property
    def num_restarts(self) -> int:
        """C for a fit with restarts, else 1."""
        return 1 if self.restarts is None else int(self.restarts.elbo.shape[0])

    def restart(self, index: int) -> "BLRResult":
        """Restart ``index`` as a result of its own (``restart(0)`` without restarts is the fit)."""
        if self.restarts is None:
            if index != 0:
                raise IndexError(f"the fit has no restarts; restart({index}) does not exist.")
            return self
        r = self.restarts
        count = self.num_restarts
        if not -count <= int(index) < count:
            raise IndexError(f"restart({index}) does not exist: the fit has {count} restarts.")
        index = int(index) % count
        # One compiled take and a cut on the host: eagerly, every leaf's a[index] compiled a slice.
        from blrppl.blr.driver import take

        num_steps = int(np.asarray(r.num_steps)[index])
        return BLRResult(self.plan, take(r.state, index), to_device(np.asarray(r.elbo)[index, :num_steps]), self.mode)

    @full_precision
    def pareto_k(self, rng_key: jax.Array, num_samples: int = 1000):
        """PSIS Pareto-k of q against the model (Yao et al. 2018): is the fit any good?

        k < 0.5: q is close to the posterior; 0.5 <= k < min(1 - 1/log10 S, 0.7):
        usable, with care; above: q misses the posterior (importance weights
        are heavy-tailed). An exact q has log weights constant up to rounding
        and is reported as exact (k = -inf); a q collapsed far below the
        prior's spread is listed in ``collapsed``. Returns a
        :class:`~blrppl.diagnostics.ParetoK` (``float()`` gives k, ``str()``
        a one-line report whose label agrees with the k it prints); see
        :func:`blrppl.diagnostics.pareto_k`.
        """
        from blrppl.diagnostics import pareto_k

        return pareto_k(self, rng_key, num_samples)

    def save(self, path: Any) -> str:
        """Save the fit's arrays to an ``.npz`` file (no pickle); returns the path written.

        Load with ``engine.load(path, *model_args, **model_kwargs)`` (or
        ``blrppl.load``): the graph is not saved, so the model and data are
        needed again. See :mod:`blrppl.saving`.
        """
        from blrppl.saving import save

        return save(self, path)

    @property
    def graph(self):
        """The traced :class:`~blrppl.graph.nodes.FactorGraph`."""
        return self.plan.graph

    @property
    def estimators(self) -> dict:
        """Factor name -> how its site parameters are computed.

        ``"exact"`` (symbolic, conjugate), ``"delta"``, ``"mc"``,
        ``"quadrature"`` (Gauss-Hermite, on GLM linear predictors where the
        factor has them), or ``"exact+<estimator>"`` for a factor that is
        exact in some neighbours and estimated in the others;
        ``graph.factors[f].edges[v]`` says why.
        """
        return {est.factor: est.method.label for est in self.plan.estimators}

    @property
    def natural_params(self) -> dict:
        """Variable name -> natural parameters of its q.

        With iterate averaging (Monte Carlo site parameters), q is the
        averaged iterate; ``state`` keeps both, so a resumed run continues.
        """
        average = self.state.average
        return dict(self.state.natural if average is None else average)

    @property
    def site_params(self) -> dict:
        """Local mode: factor name -> {variable -> site parameter}; global mode: {}."""
        return dict(self.state.site_params) if self.mode == "local" else {}

    @property
    def params(self) -> dict:
        """``numpyro.param`` name -> fitted value in its constrained space."""
        return dict(self.state.params)

    @property
    @full_precision
    def posterior(self) -> dict:
        """Latent site name -> the fitted q marginal as a numpyro Distribution.

        A joint block contributes one marginal per site it joins.
        """
        return posterior_distributions(self.plan, self.natural_params)

    @full_precision
    def sample(self, rng_key: jax.Array, num_samples: int) -> dict:
        """Joint draws from q, shaped like the model's sites: site -> ``(num_samples, *site_shape)``.

        Latent and deterministic sites; a chain comes back as the sites the
        model samples (an initial state and the stacked states of a ``scan``),
        so ``numpyro.infer.Predictive(model, posterior_samples=draws)`` works.
        See :mod:`blrppl.draws`.
        """
        from blrppl.draws import draw

        return draw(self, rng_key, num_samples).sites

    @full_precision
    def get_samples(self, rng_key: Optional[jax.Array] = None, num_samples: int = 1000) -> dict:
        """NumPyro's name for :meth:`sample` (``rng_key`` defaults to ``key(0)``).

        ``Predictive(model, posterior_samples=result.get_samples(key, n),
        params=result.params)`` draws posterior predictive samples (``params``
        passes EM's point estimates).
        """
        return self.sample(jax.random.key(0) if rng_key is None else rng_key, num_samples)

    def print_summary(self, prob: float = 0.9, *, rng_key: Optional[jax.Array] = None, num_samples: int = 1000) -> None:
        """Print mean, sd, median and the central ``prob`` interval of every site, as NumPyro does.

        Computed from ``num_samples`` independent draws from q (no r-hat or
        n_eff: draws from q are independent), followed by the fitted
        ``numpyro.param`` values and the final ELBO.
        """
        from blrppl.summary import print_summary

        print_summary(self, prob, self.get_samples(rng_key, num_samples))

    @full_precision
    def to_arviz(
        self,
        rng_key: Optional[jax.Array] = None,
        num_samples: int = 1000,
        *,
        coords: Optional[dict] = None,
        dims: Optional[dict] = None,
        log_likelihood: bool = True,
        log_likelihood_thinning: int = 1,
        posterior_predictive: bool = False,
        restarts: str = "same",
    ):
        """The fit as ``arviz.InferenceData``: draws, log likelihood, data, parameters, ELBO.

        ``coords``/``dims`` as in ``az.from_numpyro``; ``log_likelihood=False``
        or ``log_likelihood_thinning=k`` for large data; ``restarts`` picks
        which restarts become chains. See :func:`blrppl.arviz_io.to_arviz`.
        """
        from blrppl.arviz_io import to_arviz

        return to_arviz(
            self,
            rng_key,
            num_samples,
            coords=coords,
            dims=dims,
            log_likelihood=log_likelihood,
            log_likelihood_thinning=log_likelihood_thinning,
            posterior_predictive=posterior_predictive,
            restarts=restarts,
        )

    @full_precision
    def influence(self, rng_key: Optional[jax.Array] = None, **options: Any):
        """Each observation's leave-one-out log predictive density and influence, without refitting.

        Removes observation i's site parameter from λ (the memory-perturbation
        equation, Nickl et al. 2023): exact for conjugate models, an
        approximation with a Pareto-k diagnostic elsewhere. Options:
        ``factor=``, ``plate=``, ``num_samples=``. See :mod:`blrppl.influence`.
        """
        from blrppl.influence import influence

        return influence(self, rng_key, **options)

    @full_precision
    def loo(self, rng_key: Optional[jax.Array] = None, **options: Any):
        """:meth:`influence` as ``arviz.ELPDData``, the output of ``az.loo`` (``az.compare`` takes it)."""
        from blrppl.influence import loo

        return loo(self, rng_key, **options)

    def guide(self) -> Callable:
        """A NumPyro guide drawing every latent site from q (for ``Predictive``).

        Fitted ``numpyro.param`` values (EM) are ``param`` sites of the guide,
        so ``Predictive(model, guide=...)`` uses them without ``params=``.
        """
        posterior = self.posterior
        graph = self.graph
        blocks = {v: q for v, q in self.plan.qs.items() if q.joint}
        natural = self.natural_params
        joint = {v: q.family.to_numpyro(natural[v]) for v, q in blocks.items()}
        members = {site for q in blocks.values() for site in q.transform.sites}

        fitted = self.params

        def guide(*args: Any, **kwargs: Any) -> None:
            del args, kwargs
            for name, value in fitted.items():  # EM's point estimates reach the model through Predictive
                numpyro.param(name, value)
            for v, q in blocks.items():
                flat = numpyro.sample(f"_blrppl_{v}", joint[v], infer={"is_auxiliary": True})
                for site, value in q.transform(flat).items():
                    numpyro.sample(site, dist.Delta(value, event_dim=jnp.ndim(value)))
            for v, d in posterior.items():
                if v in members:
                    continue
                chain = graph.variables[v].chain
                if chain is None or len(chain.sites) == 1:
                    numpyro.sample(v, d)
                    continue
                value = numpyro.sample(f"_blrppl_{v}", d, infer={"is_auxiliary": True})
                for site, part in split_latents(graph, {v: value}).items():
                    numpyro.sample(site, dist.Delta(part, event_dim=jnp.ndim(part)))

        return guide


class BatchResult(NamedTuple):
    """The fits of a batch of data sets (``engine.run_batched``), one compiled run.

    Attributes:
      results: one :class:`BLRResult` per data set, in order.
      elbo: the ELBO traces, shape ``(B, steps)`` (NaN after a fit stopped).
      num_steps: the steps each fit ran, shape ``(B,)``.
      stopped: whether ``tol`` stopped each fit, shape ``(B,)``.
      failed: whether each fit failed, shape ``(B,)``: it diverged or its
        posterior is improper, which a single ``run`` raises as a
        ``ModelError``; here the other data sets' fits stand, and the failed
        one's ``flags`` say what went wrong. Never read a failed fit's q.
    """

    results: tuple
    elbo: jax.Array
    num_steps: Any
    stopped: Any
    failed: Any = None

    @property
    def flagged(self) -> tuple[int, ...]:
        """The data sets whose fit carries a flag (failed, or doubtful: see each result's ``flags``)."""
        return tuple(i for i, result in enumerate(self.results) if result.flags)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> BLRResult:
        return self.results[index]

    def __iter__(self):
        return iter(self.results)
