"""``DiagonalBLR``: the deep-learning rows of Table 1 (IVON, VOGN, OGN, RMSprop/Adam)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer import init_to_uniform

from blrppl.blr.schedules import as_schedule
from blrppl.compile_mode import ONE_SHOT_BYTES, SizeDependentJit, fast_compile, full_precision, probe, to_device, to_host
from blrppl.deep.checks import averaging_flags, convergence_flags, data_share, prior_flags, raise_if_diverged
from blrppl.deep.flat import FlatModel, flat_model
from blrppl.deep.result import DiagonalResult
from blrppl.graph.data import content_digest, split_model_data
from blrppl.deep.rules import RULES, DiagonalState, Hyper, init_state, make_step

#: Steps per compiled chunk: a run compiles one loop (of its length up to CHUNK, else of CHUNK).
CHUNK = 1000

CHEAP_LOOP_LATENTS = 256
"""Models with at most this many latents (and small data) compile their step loop cheaply."""

#: Default α and β2 by row: Newton-like rows take steps α ĝ / s, RMSprop/Adam
#: are the optimizers (α ĝ / sqrt(.)); β2 sets how many steps ĥ is averaged over.
DEFAULTS = {
    "ivon": (0.1, 0.999),
    "vogn": (0.1, 0.999),
    "ogn": (0.1, 0.999),
    "rmsprop": (1e-3, 0.999),
    "adam": (1e-3, 0.999),
}


class DiagonalBLR:
    """The BLR with a diagonal Gaussian over every continuous latent (Khan & Rue, Sec. 4).

    For models with many latents (a neural network's weights), where q over
    the flat unconstrained vector u of all latents is N(m, diag(s)^-1) and the
    whole model is one loss (:mod:`blrppl.deep.flat`). ``rule`` picks the
    Table 1 row (:mod:`blrppl.deep.rules`): ``"ivon"`` (Shen et al. 2024:
    reparameterisation Hessians, the positivity-preserving update, momentum;
    the default), ``"vogn"`` (Gauss-Newton at a sample of q), ``"ogn"``
    (Gauss-Newton at the mean: a running Laplace), ``"rmsprop"`` and
    ``"adam"`` (squared gradients with square-root scaling: optimizers whose
    1 / s is *not* a posterior variance; the result says so in ``flags``).
    Minibatches come from ``numpyro.plate(..., subsample_size=M)`` with the
    N / M scaling. ``SVI(model, estimator=<row>)`` is this engine.

    Args:
      model: the NumPyro model.
      rule: the Table 1 row.
      learning_rate: α, a float or ``callable(step) -> α`` (step from 1).
      beta1: momentum of the gradient (Adam's β1; 0 turns it off).
      beta2: smoothing of the curvature estimates (ρ_s = 1 - β2).
      num_samples: draws of u per step for the perturbed rows.
      hess_init: the starting precision per observation: s = N * hess_init.
      epsilon: RMSprop/Adam's c.
      clip: the largest change of a coordinate of m per step, or None.
      average: q is the average of the iterates (m, s) over this last
        fraction of the run's steps (Polyak averaging: the stochastic
        iterates scatter around the optimum); 0 keeps the last iterate.
      init: {site: value in its support}, or a NumPyro init strategy; the
        default draws u uniformly in (-2, 2) like NumPyro's ``init_to_uniform``.
    """

    def __init__(
        self,
        model: Callable,
        *,
        rule: str = "ivon",
        learning_rate: Optional[Union[float, Callable]] = None,
        beta1: float = 0.9,
        beta2: Optional[float] = None,
        num_samples: int = 1,
        hess_init: float = 1.0,
        epsilon: float = 1e-8,
        clip: Optional[float] = None,
        average: float = 0.5,
        init: Optional[Union[Mapping[str, Any], Callable]] = None,
    ):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}.")
        if not 0.0 <= beta1 < 1.0 or (beta2 is not None and not 0.0 <= beta2 < 1.0):
            raise ValueError(f"beta1 and beta2 must lie in [0, 1), got {beta1} and {beta2}.")
        if int(num_samples) != num_samples or num_samples < 1 or hess_init <= 0:
            raise ValueError(f"num_samples must be a positive integer and hess_init positive, got {num_samples}, {hess_init}.")
        default_rate, default_beta2 = DEFAULTS[rule]
        self.model = model
        self.rule = RULES[rule]
        self.hyper = Hyper(
            learning_rate=as_schedule(default_rate if learning_rate is None else learning_rate),
            beta1=float(beta1),
            beta2=float(default_beta2 if beta2 is None else beta2),
            num_samples=int(num_samples),
            epsilon=float(epsilon),
            clip=clip,
        )
        if not 0.0 <= average < 1.0:
            raise ValueError(f"average must lie in [0, 1), got {average}.")
        self.hess_init = float(hess_init)
        self.average = float(average)
        self.init = init
        # Memo, the only state an engine keeps: the flat model and its compiled chunks by data signature.
        self._compiled: dict = {}
        self._constant_data: set = set()  # signatures of data the model reads as values

    @property
    def mode(self) -> str:
        """Always ``"global"`` (Eq. 58): one q, refreshed from each minibatch."""
        return "global"

    @full_precision
    def run(
        self,
        rng_key: jax.Array,
        num_steps: int,
        *model_args: Any,
        progress_bar: bool = True,
        init_state: Optional[DiagonalState] = None,
        **model_kwargs: Any,
    ) -> DiagonalResult:
        """Run ``num_steps`` steps; ``progress_bar`` is accepted and ignored.

        Raises:
          ModelError: for models the flat view cannot fit (see
            :func:`~blrppl.deep.flat.flat_model`) and for runs that diverged.
        """
        del progress_bar
        if int(num_steps) != num_steps or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps}.")
        flat, run_chunk = self._compile(model_args, model_kwargs)
        arrays = flat.data.arrays
        if init_state is None:
            state = probe(functools.partial(self._start, flat))(rng_key, tuple(arrays))  # one program
        else:  # this run's iterates only
            state = init_state._replace(average=jax.tree.map(jnp.zeros_like, init_state.average))
        num_steps = int(num_steps)
        length = int(round(self.average * num_steps))
        step = int(np.asarray(state.step))
        window = to_device(np.asarray([step + num_steps - length, length], np.asarray(state.step).dtype))
        # Every chunk has one length (its last steps skipped where the run ends inside it): one
        # compiled loop per run length up to CHUNK, and one for all longer runs.
        size = min(CHUNK, num_steps)
        traces = []
        for start in range(0, num_steps, size):
            active = to_device(np.asarray(min(size, num_steps - start), np.int32))
            state, elbo = run_chunk(size)(state, arrays, window, active)
            traces.append(elbo)
        elbo = to_device(np.concatenate(to_host(traces))[:num_steps])
        raise_if_diverged(flat, state, self.rule.name)
        share = run_chunk("share")(state, arrays, rng_key)
        flags = convergence_flags(self.rule, elbo) + averaging_flags(flat, state) + prior_flags(share)
        return DiagonalResult(flat, self.rule, state, elbo, flags)

    def _compile(self, model_args: tuple, model_kwargs: dict) -> tuple[FlatModel, Callable]:
        data = split_model_data(model_args, model_kwargs)
        signature = data.signature
        if signature in self._constant_data:  # compiled per data set: the model reads the values
            signature = (signature, content_digest(data.arrays))
        memo = self._compiled.get(signature)
        if memo is None:
            flat = flat_model(self.model, model_args, model_kwargs, f"DiagonalBLR(rule={self.rule.name!r})")
            if flat.constant:
                self._constant_data.add(signature)
                signature = (signature, content_digest(data.arrays))
            step = make_step(flat, self.rule, self.hyper)
            chunks: dict = {}
            # Cheap compiler settings (blrppl.compile_mode) for the loop where a step costs
            # microseconds (small data and few latents: not a network's thousands of weights),
            # and for the check that runs once per fit wherever the data allow it. Not for the
            # Gauss-Newton rules: their per-example gradients ran 5x slower per step compiled
            # cheaply, and compiled no faster (OGN on 500 x 5: 1.2 vs 0.25 ms a step).
            cheap_loop = (
                fast_compile(data.arrays) and flat.dim <= CHEAP_LOOP_LATENTS and self.rule.curvature != "gauss_newton"
            )
            cheap_check = fast_compile(data.arrays, ONE_SHOT_BYTES)

            def run_chunk(length: Union[int, str]) -> Callable:
                if length == "share" and length not in chunks:
                    chunks[length] = SizeDependentJit(
                        lambda state, arrays, key: data_share(flat, *state.averaged(), arrays, jax.random.fold_in(key, 1)),
                        fast=cheap_check,
                    )
                if length not in chunks:
                    chunks[length] = SizeDependentJit(functools.partial(_scan_steps, step, length), fast=cheap_loop)
                return chunks[length]

            memo = (flat, run_chunk)
            self._compiled[signature] = memo
        flat, run_chunk = memo
        # The data of this call (same shapes as the memo's), as arguments.
        return flat._replace(data=data), run_chunk

    def _start(self, flat: FlatModel, rng_key: jax.Array, arrays: tuple) -> DiagonalState:
        """m from ``init`` (or uniform in (-2, 2)), s = N * hess_init (run as one compiled program:
        eagerly, each draw and operation of the model compiled a program of its own)."""
        values = self._initial_values(flat, jax.random.fold_in(rng_key, 0), arrays)
        mean = flat.ravel({s.name: s.transform.inv(jnp.asarray(values[s.name])) for s in flat.sites})
        precision = jnp.full_like(mean, flat.subsample.size * self.hess_init)
        return init_state(mean, precision, rng_key)

    def _initial_values(self, flat: FlatModel, key: jax.Array, arrays: tuple) -> dict:
        given = dict(self.init) if isinstance(self.init, Mapping) else {}
        strategy = self.init if callable(self.init) else init_to_uniform(radius=2.0)
        args, kwargs = flat.data.rebuild(None if flat.constant else arrays)
        if flat.subsample.batch_size < flat.subsample.size:  # fixed rows: an eager subsample would compile each run
            given.setdefault(flat.subsample.name, jnp.arange(flat.subsample.batch_size))
        model = handlers.substitute(handlers.seed(flat.model, key), data=given)
        model = handlers.substitute(model, substitute_fn=strategy)
        trace = handlers.trace(model).get_trace(*args, **kwargs)
        return {s.name: trace[s.name]["value"] for s in flat.sites}

    def guide(self, result: DiagonalResult) -> Callable:
        """A NumPyro guide that samples from the fitted q (for ``Predictive``)."""
        return result.guide()


def _scan_steps(step: Callable, length: int, state: DiagonalState, arrays: tuple, window: jax.Array, active: jax.Array):
    """``length`` steps of the rule, the first ``active`` of them taken (the others leave the state
    as it is and record NaN): ``(state, ELBO per step)``."""

    def body(state, i):
        return jax.lax.cond(
            i < active, lambda s: step(s, arrays, window), lambda s: (s, jnp.full((), jnp.nan, s.mean.dtype)), state
        )

    return jax.lax.scan(body, state, jnp.arange(length))
