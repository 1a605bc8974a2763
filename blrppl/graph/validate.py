"""Checks of a traced model's observed values, in Python, before anything is compiled.

NumPyro evaluates ``fn.log_prob(value)`` wherever the shapes broadcast and
wherever the density has a formula, so three kinds of bad data run silently
or fail deep inside JAX without naming a site:

1. **Shapes.** An observation of shape ``(50, 1)`` in a plate of 50 broadcasts
   against the distribution's ``(50,)`` to ``(50, 50)``: every observation is
   counted 50 times. Here every observation must be counted exactly once: the
   value's shape must equal the distribution's shape
   (``sample_shape + batch_shape + event_shape``, after the plates' expansion),
   or extend it on the left with dimensions the distribution broadcasts over
   (``numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)`` without a plate is
   an ordinary NumPyro idiom and means the same as with one). The message
   names the latent sites the distribution depends on, so that a latent
   whose shape clashes with its data is named too.
2. **Non-finite values** outside masked positions (``obs_mask=``, ``.mask()``,
   ``handlers.mask``). Masked positions may hold anything, NaN included.
3. **Values outside the support** (a negative Poisson count, a Bernoulli
   observation of 0.5, a Gamma observation of -1): checked with the
   distribution's own ``support`` constraint (event dimensions reduced) at
   unmasked positions. A support whose bounds depend on latent or param
   values (``Uniform(0, theta)``) is not checked: its bounds at the trace's
   placeholder values say nothing about the data.

``numpyro.factor`` terms (``dist.Unit``) carry no observations and are not
checked. Sites inside ``numpyro.contrib.control_flow.scan`` are checked on
their stacked values (time first), as numpyro records them.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.primitives import Messenger

from blrppl.errors import ModelError, site_error
from blrppl.graph.families import base_distribution
from blrppl.graph.plates import subsample_indices
from blrppl.graph.replay import effective_mask, run_model


def validate_observations(
    model: Callable,
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    trace: Mapping[str, Mapping[str, Any]],
    observed: Sequence[str],
    inputs: Sequence[str],
    dist_deps: Mapping[str, frozenset],
) -> None:
    """Check every observed site's value: shape, finiteness, support.

    Args:
        model: the NumPyro model.
        model_args: its positional arguments.
        model_kwargs: its keyword arguments.
        trace: the model's trace at placeholder latent values
            (:func:`~blrppl.graph.replay.run_model` with ``placeholders=True``).
        observed: names of the sample sites whose values are data (``obs=``,
            ``condition``, ``substitute``, ``numpyro.factor``).
        inputs: names of the latent sample sites and ``numpyro.param`` sites,
            whose values the trace holds as placeholders.
        dist_deps: site name -> names in ``inputs`` its distribution's
            arguments depend on.

    Raises:
        ModelError: naming the site, for an observed value whose shape is not
            the distribution's (naming the latents the distribution depends
            on), for NaN or infinite values outside masked positions, and for
            values outside the distribution's support at unmasked positions.
    """
    checked = [
        name for name in observed if not isinstance(base_distribution(trace[name]["fn"]), dist.Unit)
    ]
    for name in checked:
        check_shape(trace[name], {n: trace[n] for n in dist_deps.get(name, ()) if n in trace})
    for name in checked:
        check_finite(trace[name])
        check_delta(trace[name])
    varying = _supports_that_vary(model, model_args, model_kwargs, trace, checked, inputs)
    for name in checked:
        if name not in varying:
            check_support(trace[name])


def distribution_shape(site: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape a sample site's value has: ``sample_shape + batch_shape + event_shape``.

    Inside a plate numpyro folds ``sample_shape`` into the batch shape, so
    ``sample_shape`` only counts outside plates.
    """
    fn = site["fn"]
    sample_shape = tuple((site.get("kwargs") or {}).get("sample_shape", ()) or ())
    return sample_shape + tuple(fn.batch_shape) + tuple(fn.event_shape)


def check_shape(site: Mapping[str, Any], inputs: Mapping[str, Mapping[str, Any]]) -> None:
    """An observed value is counted exactly once by ``fn.log_prob``.

    Args:
        site: a numpyro trace entry of an observed sample site.
        inputs: latent or param sites its distribution depends on, by name
            (named in the message).

    Raises:
        ModelError: when the value's event dimensions differ from the
            distribution's, or broadcasting the value against the
            distribution's shape would repeat observations or fails.
    """
    fn = site["fn"]
    name = site["name"]
    value_shape = tuple(np.shape(site["value"]))
    expected = distribution_shape(site)
    event_shape = tuple(fn.event_shape)
    event_ok = len(value_shape) >= len(event_shape) and (
        value_shape[len(value_shape) - len(event_shape) :] == event_shape
    )
    try:
        joint = tuple(np.broadcast_shapes(value_shape, expected))
    except ValueError:
        joint = None
    if event_ok and joint == value_shape:
        return
    if not event_ok:
        consequence = f"the value's trailing dimensions must be the event shape {event_shape}"
    elif joint is None:
        consequence = "the two shapes do not broadcast"
    else:
        copies = int(np.prod(joint)) // max(int(np.prod(value_shape)), 1)
        consequence = (
            f"numpyro would broadcast them to {joint} and count every observation "
            f"{copies} times"
        )
    shaped = {n: tuple(np.shape(s["value"])) for n, s in inputs.items() if np.ndim(s["value"])}
    described = _shape_sources(site)
    if shaped:
        described += ", which depends on " + ", ".join(
            f"{'param' if inputs[n]['type'] == 'param' else 'latent'} site {n!r} of shape {shape}"
            for n, shape in sorted(shaped.items())
        )
    remedy = f"pass observations of shape {expected}"
    if np.prod(value_shape, dtype=int) == np.prod(expected, dtype=int):
        remedy += f" (value.reshape({expected}))"
    if site.get("cond_indep_stack"):
        remedy += ", or size the plates to the data"
    if shaped:
        names = ", ".join(repr(n) for n in sorted(shaped))
        remedy += f", or change the shape of {names} to match the observations"
    raise site_error(
        name,
        f"the observed value has shape {value_shape} but the distribution has shape "
        f"{expected} ({described}), and {consequence}",
        remedy,
    )


def check_finite(site: Mapping[str, Any]) -> None:
    """Observations must be finite outside masked positions.

    Raises:
        ModelError: naming the site and counting the non-finite observations.
    """
    fn = site["fn"]
    value = np.asarray(site["value"])
    if not (
        np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.complexfloating)
    ):
        return
    bad = _unmasked(site, _batch_any(~np.isfinite(value), fn.event_dim))
    if bad.any():
        count = int(bad.sum())
        raise site_error(
            site["name"],
            f"observations contain NaN or infinite values ({count} of {bad.size} "
            "outside masked positions)",
            "drop them, or pass obs_mask= (or .mask()) so those positions become missing data",
        )


def check_delta(site: Mapping[str, Any]) -> None:
    """A ``Delta`` observation must equal the Delta's value (recording a deterministic value).

    Raises:
        ModelError: naming the site, for an observation that differs from the
            Delta's value (probability zero).
    """
    base = base_distribution(site["fn"])
    if not isinstance(base, dist.Delta):
        return
    value = np.asarray(site["value"])
    held = np.broadcast_to(np.asarray(base.v), value.shape)
    if np.allclose(value, held, equal_nan=True):
        return
    raise site_error(
        site["name"],
        "a Delta observation that differs from the Delta's value has probability zero",
        "observe the value the Delta holds (numpyro.sample(name, dist.Delta(v), obs=v)), or record it "
        "with numpyro.deterministic",
    )


def check_support(site: Mapping[str, Any]) -> None:
    """Observations must lie in the distribution's support outside masked positions.

    Raises:
        ModelError: naming the site, the support, the number of values outside
            it and the first of them.
    """
    fn = site["fn"]
    support = fn.support
    base = support
    while isinstance(base, constraints._IndependentConstraint):
        base = base.base_constraint
    if support is None or isinstance(base, (constraints._Dependent, constraints._Real)):
        return  # the real line is the finite values, which check_finite has checked
    value = np.asarray(site["value"])
    try:
        inside = _inside_on_host(base, value) if _numpy_aware(base) else _inside(support, jnp.asarray(value))
        inside = np.asarray(inside, dtype=bool)
    except Exception:  # a constraint that cannot be evaluated on these values: numpyro's concern
        return
    batch_ndim = value.ndim - fn.event_dim
    outside = ~np.broadcast_to(_batch_all(inside, batch_ndim), value.shape[:batch_ndim])
    bad = _unmasked(site, outside)
    if not bad.any():
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    at = value[first]
    shown = repr(at.item()) if np.ndim(at) == 0 else np.array2string(at, threshold=6)
    count = int(bad.sum())
    family = type(base_distribution(fn)).__name__
    raise site_error(
        site["name"],
        f"{count} of {bad.size} observations lie outside the support of {family} "
        f"({describe_support(support)}), e.g. {shown} at index {first}",
        "correct the data, choose a distribution whose support contains them, or mask those "
        "positions (obs_mask= or .mask())",
    )


def describe_support(support: constraints.Constraint) -> str:
    """A short readable name for a numpyro support constraint."""
    while isinstance(support, constraints._IndependentConstraint):
        support = support.base_constraint
    c = constraints
    named = [
        (c._Boolean, "0 or 1"),
        (c._IntegerNonnegative, "non-negative integers"),
        (c._IntegerPositive, "positive integers"),
        (c._Positive, "positive values"),
        (c._Nonnegative, "non-negative values"),
        (c._UnitInterval, "values in [0, 1]"),
        (c._Simplex, "non-negative vectors summing to 1"),
        (c._PositiveDefinite, "positive definite matrices"),
        (c._LowerCholesky, "lower Cholesky factors"),
        (c._CorrCholesky, "Cholesky factors of correlation matrices"),
        (c._Real, "finite values"),
    ]
    for kind, words in named:
        if isinstance(support, kind):
            return words
    if isinstance(support, c._IntegerInterval):
        return f"integers from {_bound(support.lower_bound)} to {_bound(support.upper_bound)}"
    if isinstance(support, c._Interval):
        return f"values in ({_bound(support.lower_bound)}, {_bound(support.upper_bound)})"
    if isinstance(support, c._GreaterThan):
        return f"values above {_bound(support.lower_bound)}"
    if isinstance(support, c._Multinomial):
        return f"integer counts summing to {_bound(support.upper_bound)}"
    return type(support).__name__.lstrip("_")


# --------------------------------------------------------------------------- helpers


#: ``support(value)`` as one compiled program per constraint type and shape (a
#: constraint is a pytree): eagerly, each of its few operations compiles on its own.
_inside = jax.jit(lambda support, value: support(value))

#: Constraints whose ``__call__`` computes in numpy on numpy values (numpyro's ``xp = np``
#: branch): checked on the host, with no compilation at all.
_NUMPY_AWARE = tuple(
    cls.__call__
    for cls in (
        constraints._Boolean,
        constraints._GreaterThan,
        getattr(constraints, "_GreaterThanEq", constraints._GreaterThan),
        constraints._LessThan,
        constraints._Interval,
        getattr(constraints, "_OpenInterval", constraints._Interval),
        constraints._IntegerInterval,
        constraints._IntegerGreaterThan,
    )
)


def _numpy_aware(constraint: Any) -> bool:
    return type(constraint).__call__ in _NUMPY_AWARE


def _inside_on_host(constraint: Any, value: np.ndarray) -> np.ndarray:
    """``constraint(value)`` elementwise in numpy (its bounds read on the host)."""
    bounds = {
        name: np.asarray(getattr(constraint, name))
        for name in ("lower_bound", "upper_bound")
        if isinstance(getattr(constraint, name, None), jax.Array)
    }
    if bounds:
        constraint = copy.copy(constraint)
        for name, bound in bounds.items():
            object.__setattr__(constraint, name, bound)
    return np.asarray(constraint(value))


def _bound(x: Any) -> str:
    if np.ndim(x) == 0:
        return f"{np.asarray(x).item():g}"
    return "a bound given per position"


def _shape_sources(site: Mapping[str, Any]) -> str:
    """Where the distribution's shape comes from: plates, batch and event shapes."""
    fn = site["fn"]
    frames = sorted(site.get("cond_indep_stack", ()), key=lambda f: f.dim)
    parts = [f"batch {tuple(fn.batch_shape)}"]
    if frames:
        plates = ", ".join(f"{f.name!r} of size {f.size}" for f in frames)
        parts[0] += f" from plate {plates}"
    sample_shape = tuple((site.get("kwargs") or {}).get("sample_shape", ()) or ())
    if sample_shape:
        parts.insert(0, f"sample_shape {sample_shape}")
    parts.append(f"event {tuple(fn.event_shape)}")
    return ", ".join(parts)


def _batch_any(flags: np.ndarray, event_ndim: int) -> np.ndarray:
    if event_ndim:
        return flags.reshape(flags.shape[: flags.ndim - event_ndim] + (-1,)).any(-1)
    return flags


def _batch_all(flags: np.ndarray, batch_ndim: int) -> np.ndarray:
    if flags.ndim > batch_ndim:
        return flags.reshape(flags.shape[:batch_ndim] + (-1,)).all(-1)
    return flags


def _unmasked(site: Mapping[str, Any], flags: np.ndarray) -> np.ndarray:
    """``flags`` (one per observation) where the site's mask is on."""
    mask = effective_mask(site)
    if mask is None:
        return flags
    return flags & np.broadcast_to(np.asarray(mask), flags.shape)


def _supports_that_vary(
    model: Callable,
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    trace: Mapping[str, Mapping[str, Any]],
    names: Sequence[str],
    inputs: Sequence[str],
) -> frozenset:
    """Sites among ``names`` whose support bounds depend on latent or param values.

    The model runs once under ``jax.make_jaxpr`` with the inputs abstract and
    everything else evaluated eagerly (``jax.ensure_compile_time_eval``), so a
    bound is a tracer exactly when it depends on an input. Only sites with
    array-valued bounds (``Binomial(total_count=n)``, ``Uniform(a, b)``) are
    examined; if the model cannot run that way, all of them count as varying
    (not checked) rather than risk refusing good data.
    """
    candidates = [
        n for n in names if any(isinstance(x, jax.Array) for x in _leaves(trace[n]["fn"].support))
    ]
    if not candidates or not inputs:
        return frozenset()
    example = [jnp.asarray(trace[n]["value"]) for n in inputs]
    fixed = subsample_indices(trace)
    varying: list[str] = []

    def probe(*values: Any) -> None:
        with jax.ensure_compile_time_eval():
            run = run_model(model, model_args, model_kwargs, {**fixed, **dict(zip(inputs, values))})
        varying.extend(
            n
            for n in candidates
            if n in run.trace
            and any(isinstance(x, jax.core.Tracer) for x in _leaves(run.trace[n]["fn"].support))
        )

    try:
        jax.make_jaxpr(probe)(*example)
    except Exception:  # the model does not run with abstract inputs: check nothing uncertain
        return frozenset(candidates)
    return frozenset(varying)


def _leaves(support: Optional[constraints.Constraint]) -> list:
    if support is None:
        return []
    try:
        return jax.tree_util.tree_leaves(support)
    except Exception:  # a constraint that is not a pytree has no array bounds to examine
        return []


INVALID_PARAMETER = "distribution got invalid"
"""numpyro's message (``validate_args``) when a distribution's parameter is outside its constraint."""


def invalid_parameter_error(model: Callable, model_args: tuple, model_kwargs: Mapping[str, Any], error: ValueError):
    """numpyro's "X distribution got invalid p parameter" as a :class:`ModelError` naming the site:
    the model is run again without validation and each site's parameters are checked against
    their constraints on the host."""
    try:
        tr, _ = run_model(model, model_args, model_kwargs, placeholders=True, validate=False)
    except Exception:  # noqa: BLE001 - the model does not run without validation either
        tr = {}
    for name, site in tr.items():
        fn = site.get("fn") if site["type"] == "sample" else None
        while isinstance(fn, (dist.MaskedDistribution, dist.Independent, dist.ExpandedDistribution)):
            fn = fn.base_dist
        for parameter, constraint in getattr(fn, "arg_constraints", {}).items():
            try:
                value = np.asarray(getattr(fn, parameter))
                inside = np.broadcast_to(np.asarray(constraint(value), bool), value.shape)
            except Exception:  # noqa: BLE001 - a lazy, traced or dependent parameter: not checked here
                continue
            if inside.all():
                continue
            where = tuple(int(i) for i in np.argwhere(~inside)[0])
            example = value[where]
            return site_error(
                name,
                f"the {type(fn).__name__} parameter {parameter!r} is outside its constraint "
                f"{type(constraint).__name__.strip('_')} ({int((~inside).sum())} of {inside.size} values, e.g. "
                f"{example} at index {where})",
                "correct the data or arguments it is computed from",
            )
    return ModelError(f"site {getattr(model, '__name__', 'model')!r}: {error}; correct the model's data or arguments.")


class Reached(Messenger):
    """Records the names of the sample and deterministic sites a model run reaches."""

    def __init__(self, names: list):
        super().__init__()
        self.names = names

    def process_message(self, msg: dict) -> None:
        if msg["type"] in ("sample", "deterministic"):
            self.names.append(msg["name"])


def model_code_error(model: Callable, model_args: tuple, model_kwargs: dict, error: Exception) -> ModelError:
    """A :class:`ModelError` for a model whose code raises ``error`` when run on its data, naming
    the last site reached before it (a float index array gets its own remedy)."""
    reached: list = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        with Reached(reached):
            return model(*args, **kwargs)

    try:
        run_model(recorded, model_args, model_kwargs, placeholders=True)
    except Exception:  # noqa: BLE001 - the failure being explained
        pass
    problem = f"the model's code raises {type(error).__name__} when run on this data: {error}"
    if "Indexer must have integer or boolean type" in str(error):
        remedy = "index arrays must have an integer dtype: pass e.g. `g.astype(np.int32)` (not floats)"
    else:
        remedy = "check that the model runs on this data under plain NumPyro (numpyro.handlers.seed(model, 0)(*args))"
    if not reached:
        return ModelError(f"model {getattr(model, '__name__', 'model')!r}, before its first site: {problem}; {remedy}.")
    return site_error(reached[-1], f"after this site, {problem}", remedy)
