"""Where q starts: the prior, pushed through the graph in trace order.

Each variable starts at its prior factor's site parameter evaluated at the
starting q of its parents (a hierarchical prior ``theta ~ N(mu, 1/sqrt(tau))``
starts at N(E[mu], 1/E[tau])). Categorical latents break the symmetry of
exchangeable priors (mixture components), which would otherwise leave VMP at
the symmetric fixed point forever: when the latent indexes observations
(``y_n ~ f(mu[z_n])``), its responsibilities start from greedy k-means++ seeding
on those observations (Arthur & Vassilvitskii 2007; the best of a few candidates
per centre, as scikit-learn) with the rng_key, refined by Lloyd's steps to
convergence (on a random sample of at most ``KMEANS_POINTS`` of them), its clusters
labelled by their first coordinate (restarts relabel them: the reverse order, rotations); otherwise
from random responsibilities.

The data a start reads (a prior's parameters, the observations k-means
seeds on) are gathered once per plan by :func:`start_arrays` into the plan's
arrays; :func:`initial_natural` is then a pure function of the key and the
arrays, compiled once with the rest of a fit.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from blrppl.compile_mode import probe, to_device
from blrppl.errors import ModelError
from blrppl.estimators.base import FactorEstimator, PlanArrays, owner


def _prior_factors(graph: Any, v: str) -> list[str]:
    return [f for f in graph.factors if owner(graph, f) == v]


def start_arrays(graph: Any, qs: Mapping[str, Any], estimators: tuple, init: Mapping[str, Any]) -> dict:
    """The data-dependent pieces of every variable's start (plan time, eager).

    Per variable, a dict with any of: ``"placeholder"`` (a valid λ with the
    right shapes, from the prior), ``"gaussian"`` (the start of a Gaussian
    whose prior factor has no exact site parameter: the prior's moments),
    ``"points"`` (observations for k-means responsibilities).
    """
    methods = {est.factor: est.method for est in estimators}
    out: dict = {}
    for v, q in qs.items():
        node = graph.variables[v]
        entry: dict = {}
        if q.family.layout.example is None:
            entry["placeholder"] = _from_prior(q, node)
        reader = points_reader(graph, v, q) if q.family.index_valued else None
        if reader is not None:
            entry["points"] = to_device(reader.read(lambda node: node.value, np))
        priors = _prior_factors(graph, v)
        if q.family.gaussian and not q.family.chain and any(methods[f].estimated for f in priors):
            entry["gaussian"] = _gaussian_from_prior(q, node)
        out[v] = entry
    return out


def initial_natural(
    rng_key: jax.Array,
    graph: Any,
    qs: Mapping[str, Any],
    estimators: tuple[FactorEstimator, ...],
    arrays: PlanArrays,
    init: Optional[Mapping[str, Any]] = None,
    shift: Any = 0,
) -> dict:
    """Natural parameters to start from (module docstring); a pure function.

    ``init`` maps sites to a numpyro distribution (q starts there) or a value
    (q keeps the spread it has from the prior but is centred at the value); ``shift``: the
    restart's index (traced or not), by which k-means labels are permuted (:func:`_relabelling`).
    """
    natural = placeholder_natural(qs, arrays)
    by_factor = {est.factor: est for est in estimators}
    for i, (v, q) in enumerate(qs.items()):
        key = jax.random.fold_in(rng_key, i)
        starts = arrays.starts[v]
        if q.family.index_valued:
            natural[v] = _categorical_start(key, q, starts.get("points"), shift)
            continue
        if "gaussian" in starts:
            natural[v] = starts["gaussian"]
            continue
        priors = _prior_factors(graph, v)
        if not priors:
            continue
        # The means of the prior factors' neighbours only: another variable's (a chain's
        # forward-backward) would be traced, and compiled, once per variable started.
        mean = {u: qs[u].family.mean_params(natural[u]) for f in priors for u in by_factor[f].neighbours}
        messages = [by_factor[f].estimate(key, mean, arrays.params, arrays)[1][v] for f in priors]
        natural[v] = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *messages)
    for v, start in (init or {}).items():
        natural[v] = user_start(qs[v], natural[v], start)
    return natural


def placeholder_natural(qs: Mapping[str, Any], arrays: PlanArrays) -> dict:
    """A valid λ of every variable's family and shapes, made without a pass over the data (the
    plan's placeholder from the prior, else the family's example): where the start does not
    matter (an exact run's step, :func:`blrppl.blr.driver._lean`), and before the real start."""
    return {
        v: arrays.starts[v]["placeholder"] if "placeholder" in arrays.starts[v] else q.example_natural()
        for v, q in qs.items()
    }


def start_tests(qs: Mapping[str, Any]) -> tuple:
    """``(name, is_valid)`` per variable: a start outside the family (an improper prior
    pushed through the graph) fails its test (:func:`blrppl.blr.driver.checked_init`)."""
    return tuple((v, q.family.is_valid) for v, q in qs.items())


def raise_invalid_start(qs: Mapping[str, Any], valid: Any) -> None:
    """Raise for the first variable whose start failed its test (``valid``: one flag per variable).

    Raises:
      ModelError: naming the first variable whose start is not a valid q.
    """
    for (v, q), ok in zip(qs.items(), valid):
        if not ok:
            raise ModelError(
                f"site {v!r}: its prior does not define a proper starting q ({q.family.name}); "
                "give the site a proper prior, or start it with init={site: value}."
            )


def user_start(q: Any, natural: Any, start: Any) -> Any:
    """q's natural parameters from a user's ``init`` entry (a distribution or a value)."""
    if isinstance(start, dist.Distribution):
        if q.transform is not None:
            raise ModelError(
                f"site {q.name!r}: its q is a Gaussian on the unconstrained space; pass a value in "
                "the site's support as init, not a distribution."
            )
        try:
            new = q.family.from_numpyro(start)
        except Exception as error:  # noqa: BLE001 - re-raised with the site named
            raise ModelError(f"site {q.name!r}: init distribution is not a {q.family.name} ({error}); pass one.") from None
        return jax.tree.map(lambda a, old: jnp.broadcast_to(a, jnp.shape(old)), new, natural)
    if q.family.start_at is None:
        raise ModelError(f"site {q.name!r}: init by value is not available for {q.family.name}; pass a distribution.")
    value = jnp.asarray(start, jnp.result_type(float))
    if q.transform is not None:
        value = q.transform.inv(value)
    value = q.value_to_family(jnp.broadcast_to(value, q.shape))
    return q.family.start_at(natural, value)


def prior_member(q: Any, prior: Any) -> Any:
    """The natural parameters of ``prior`` in q's family, broadcast to q's batch shape."""
    natural = q.family.from_numpyro(prior)
    num_batch = len(q.family.batch_shape(natural))
    return jax.tree.map(lambda a: jnp.broadcast_to(a, q.batch_shape + jnp.shape(a)[num_batch:]), natural)


def _from_prior(q: Any, node: Any) -> Any:
    """A valid member of the variable's family with the right shapes, from its prior.

    One compiled program (:func:`~blrppl.compile_mode.probe`, once per structure), where
    its few ``jnp`` operations run eagerly would compile one program each; eagerly where
    the family reads the prior's values (a ``Uniform(0, 1)`` is a Beta(1, 1)).
    """

    def placeholder(prior: Any) -> Any:
        return prior_member(q, prior)

    try:
        return probe(placeholder)(node.prior)
    except Exception:  # noqa: BLE001 - e.g. a family that recognises the prior by its values
        pass
    try:
        return placeholder(node.prior)
    except Exception as error:  # noqa: BLE001 - re-raised with the site named
        raise ModelError(
            f"site {q.name!r}: cannot start q ({q.family.name}) from the prior {type(node.prior).__name__} "
            f"({error}); pass init= or choose another family."
        ) from None


def _gaussian_from_prior(q: Any, node: Any) -> Any:
    """A Gaussian start for a site whose prior factor has no exact site parameter.

    The prior's mean and variance where numpyro has them (at the starting
    values of the site's parents), mapped to q's space; else the centre of
    the support with unit variance on the unconstrained space.
    """
    loc, var = None, None
    if q.transform is None:
        try:
            loc, var = np.asarray(node.prior.mean), np.asarray(node.prior.variance)
        except (NotImplementedError, AttributeError):
            loc = None
    # On the host in numpy, then one compiled conversion: eager jnp calls here would each
    # compile a one-operation program at every first plan.
    if loc is None or not bool(np.all(np.isfinite(loc)) & np.all(np.isfinite(var)) & np.all(var > 0)):
        dtype = jnp.result_type(float)
        loc, var = np.zeros(q.shape, dtype), np.ones(q.shape, dtype)
    loc = np.broadcast_to(loc, q.shape)
    var = np.broadcast_to(var, q.shape)
    if q.family.event_ndim == 0:
        return _from_usual(q.family.from_usual, False, loc, var)
    d = jax.eval_shape(q.example_natural).x.shape[-1]
    flat_loc = np.reshape(loc, q.batch_shape + (d,))
    flat_var = np.reshape(var, q.batch_shape + (d,))
    return _from_usual(q.family.from_usual, True, flat_loc, flat_var)


def _from_usual(from_usual: Any, matrix: bool, loc: np.ndarray, var: np.ndarray) -> Any:
    """λ of the Gaussian with mean ``loc`` and variances ``var`` (diagonal ``covariance_matrix`` if
    ``matrix``): a probe (:func:`~blrppl.compile_mode.probe`), in numpy where its rules cover it."""
    return probe(functools.partial(_natural_from_usual, from_usual, matrix))(loc, var)


def _natural_from_usual(from_usual: Any, matrix: bool, loc: jax.Array, var: jax.Array) -> Any:
    if not matrix:
        return from_usual(loc, jnp.sqrt(var))
    return from_usual(loc, covariance_matrix=var[..., None] * jnp.eye(loc.shape[-1]))


class PointsReader(NamedTuple):
    """How a categorical latent's k-means points are read from its observations.

    ``read(value_of, xp)`` builds the points with ``xp`` (numpy on the host, where an
    eager ``jax.numpy`` call would compile a program, or ``jax.numpy``) from
    ``value_of(factor node)``, the factor's observed value: the traced one (the plan's
    start) or one replayed on new data (a compiled replan, :mod:`blrppl.blr.replan`).
    ``replayable``: choosing the factor read no value (no factor was skipped for
    non-finite observations), so new data of the same shapes, with finite
    observations, are read the same way.
    """

    read: Callable[..., Any]
    factors: tuple[str, ...]
    replayable: bool


def points_reader(graph: Any, var: str, q: Any) -> Optional[PointsReader]:
    """Where ``var``'s k-means points come from (:class:`PointsReader`), or None (random starts)."""
    if q.family.chain:
        return _chain_points(graph, var, q)
    if len(q.shape) != 1:
        return None
    size = q.shape[0]
    skipped = False
    for node in graph.factors.values():
        if node.kind != "likelihood" or var not in node.neighbours or node.value is None:
            continue
        data = _as_float(np.asarray(node.value))
        if data.ndim == 0 or data.shape[0] != size:
            continue
        if not np.all(np.isfinite(data)):
            skipped = True
            continue
        layout = lambda xp, x: xp.reshape(x, (size, -1))  # noqa: E731
        return PointsReader(_reader(graph, (node.name,), layout), (node.name,), not skipped)
    return None


def _chain_points(graph: Any, var: str, q: Any) -> Optional[PointsReader]:
    """A discrete chain's observations, one row per sequence and step: (B..., T or T - 1, D).

    Read from one likelihood factor whose value has the sequences and steps
    as leading axes (in either order), or, for a chain written as a Python
    loop, from one factor per step.
    """
    batch, length = q.batch_shape, q.shape[q.num_batch]
    nb = len(batch)
    node = graph.variables[var]
    finite, skipped = [], False
    for factor in graph.factors.values():
        if factor.kind != "likelihood" or var not in factor.neighbours or factor.value is None:
            continue
        data = _as_float(np.asarray(factor.value))
        if not np.all(np.isfinite(data)):
            skipped = True
            continue
        finite.append((factor.name, data.shape))
        for steps in (length, length - 1):
            if data.shape[: nb + 1] == batch + (steps,):
                layout = functools.partial(lambda steps, xp, x: xp.reshape(x, batch + (steps, -1)), steps)
            elif data.shape[: nb + 1] == (steps,) + batch:
                layout = functools.partial(
                    lambda steps, xp, x: xp.reshape(xp.moveaxis(x, 0, nb), batch + (steps, -1)), steps
                )
            else:
                continue
            return PointsReader(_reader(graph, (factor.name,), layout), (factor.name,), not skipped)
    if node.chain is not None and node.chain.kind == "markov":
        steps = tuple(name for name, shape in finite if shape[:nb] == batch)
        if len(steps) in (length, length - 1) and len({shape for name, shape in finite if name in steps}) == 1:
            layout = lambda xp, *xs: xp.reshape(xp.stack(xs, axis=nb), batch + (len(steps), -1))  # noqa: E731
            return PointsReader(_reader(graph, steps, layout), steps, not skipped)
    return None


def _as_float(data: np.ndarray) -> np.ndarray:
    return np.asarray(data, dtype=np.result_type(float, data.dtype))


def _reader(graph: Any, factors: tuple[str, ...], layout: Callable[..., jax.Array]) -> Callable:
    def read(value_of: Callable[[Any], Any], xp: Any = jnp) -> Any:
        values = [xp.asarray(value_of(graph.factors[f]), jnp.result_type(float)) for f in factors]
        return layout(xp, *values)

    return read


def _categorical_start(rng_key: jax.Array, q: Any, points: Optional[jax.Array], shift: Any = 0) -> Any:
    """Responsibilities: k-means on the indexed observations, else random (Dirichlet(1)).

    k-means labels its clusters in a canonical order (:func:`_kmeans`), relabelled for restart
    ``shift`` (:func:`_relabelling`: the order, its reverse, and their rotations), so that
    restarts start the components on the clusters in different labellings: where the
    components' priors differ, a labelling against them is a worse optimum that VB does not
    leave (Stan's ``log_mix``: 15 nats), and random seeding alone put all four default
    restarts there one time in four.

    A chain starts with independent marginals (no pair potentials); its
    k-means marginals (one k-means over every sequence's steps) are aligned
    at the end of the chain (a scan chain joined with its initial state has
    one state more than observations; that state starts uniform).
    """
    num = q.num_categories
    if points is not None and q.family.chain:
        batch, length = q.batch_shape, q.shape[q.num_batch]
        steps = points.shape[len(batch)]
        probs = _kmeans(rng_key, jnp.reshape(points, (-1, points.shape[-1])), num)
        probs = jnp.reshape(probs, batch + (steps, num))
        uniform = jnp.full(batch + (length - steps, num), 1.0 / num)
        probs = jnp.concatenate([uniform, probs], axis=len(batch))
    elif points is not None:
        probs = _kmeans(rng_key, points, num)
    else:
        shift = 0  # random already
        # Dirichlet(1, ..., 1): normalised exponential draws (exact, and no rejection loop to compile)
        exponentials = -jnp.log(jax.random.uniform(rng_key, q.shape + (num,), minval=jnp.finfo(jnp.result_type(float)).tiny))
        probs = exponentials / jnp.sum(exponentials, -1, keepdims=True)
    if not (isinstance(shift, int) and shift == 0):
        probs = jnp.take(probs, _relabelling(shift, num), axis=-1)
    if q.family.chain:  # the example's pair potentials: zero
        return q.example_natural()._replace(one_hot=jnp.log(probs))
    return q.family.stats_type(one_hot=jnp.log(probs))


def _relabelling(index: Any, num: int) -> jax.Array:
    """Restart ``index``'s labelling of ``num`` clusters in canonical order, as the categories
    each category's responsibilities come from: even restarts take the canonical order, odd ones
    its reverse (ordered priors run either way), each rotated by ``index // 2``
    (``num = 2``: the two labellings alternate; 3: ascending, descending, then their rotations)."""
    order = jnp.arange(num)
    order = jnp.where(index % 2 == 1, num - 1 - order, order)
    return jnp.argsort((order + index // 2) % num)  # cluster j takes label perm[j]: labels read perm⁻¹


LLOYD_MAX_STEPS = 100
"""Lloyd steps run until no assignment changes, at most this many (scikit-learn's ``KMeans``
runs to convergence too, at most 300): k-means stopped after a fixed 10 left some
starts of a well-separated mixture unconverged, and restarts from them ended VB in
different optima (20-80 nats apart on 100,000 points) after twice the steps."""

LLOYD_TOL = 1e-4
"""Lloyd's steps also stop once the centres move by at most this, squared and summed, per
dimension of the standardised points (scikit-learn's ``KMeans(tol=1e-4)``)."""


KMEANS_POINTS = 8192
"""k-means runs on at most this many of the points, drawn at random (with replacement), and
every point then takes its nearest centre: on 100,000 points the four restarts' k-means
took 0.4 s of a mixture's start (compiled cheaply, as a start is) for the same partition."""


@functools.partial(jax.jit, static_argnums=2)
def _kmeans(rng_key: jax.Array, points: jax.Array, num: int) -> jax.Array:
    """Greedy k-means++ seeding and Lloyd steps to convergence; soft-hard responsibilities (N, num).

    The seeding draws its random numbers at once (the first centre's index, then one
    uniform per later centre, picked by inverting the cumulative squared distances to
    the nearest centre so far) and is one ``fori_loop``: the compiled start does not
    grow with ``num`` (each draw of its own would be a separate hash to compile).
    Lloyd's steps are one ``while_loop``, until no point changes its centre or the centres
    settle (``LLOYD_TOL``, ``LLOYD_MAX_STEPS``), on at most ``KMEANS_POINTS`` of the points.
    """
    every = (points - points.mean(0)) / (points.std(0) + 1e-12)
    points = every
    if every.shape[0] > KMEANS_POINTS:
        points = every[jax.random.randint(jax.random.fold_in(rng_key, 1), (KMEANS_POINTS,), 0, every.shape[0])]
    size = points.shape[0]
    first_key, rest_key = jax.random.split(rng_key)
    first = points[jax.random.randint(first_key, (), 0, size)]
    trials = 2 + int(math.log(num))  # scikit-learn's greedy k-means++
    uniforms = jax.random.uniform(rest_key, (num - 1, trials), points.dtype)

    def seed(k, carry):
        centres, nearest = carry
        cumulative = jnp.cumsum(nearest)
        index = jnp.searchsorted(cumulative, uniforms[k - 1] * cumulative[-1], side="right")
        candidates = points[jnp.minimum(index, size - 1)]  # (trials, D)
        closer = jnp.minimum(nearest, jnp.sum((points[None] - candidates[:, None]) ** 2, -1))
        best = jnp.argmin(jnp.sum(closer, -1))
        return centres.at[k].set(candidates[best]), closer[best]

    centres = jnp.zeros((num, points.shape[1]), points.dtype).at[0].set(first)
    centres, _ = jax.lax.fori_loop(1, num, seed, (centres, jnp.sum((points - first) ** 2, -1)))

    def nearest(x, centres):  # argmin_k |x - c_k|²: |x|² is the same for every k
        return jnp.argmin(jnp.sum(centres**2, -1) - 2.0 * x @ centres.T, -1)

    def lloyd(carry):
        centres, labels, _, step = carry
        hard = jax.nn.one_hot(labels, num, dtype=points.dtype)
        counts = hard.sum(0)
        moved = (hard.T @ points) / jnp.maximum(counts, 1.0)[:, None]
        moved = jnp.where(counts[:, None] > 0, moved, centres)
        new = nearest(points, moved)
        still = jnp.any(new != labels) & (jnp.sum((moved - centres) ** 2) > LLOYD_TOL * points.shape[1])
        return moved, new, still, step + 1

    carry = (centres, nearest(points, centres), jnp.ones((), bool), jnp.zeros((), jnp.int32))
    centres, labels, _, _ = jax.lax.while_loop(lambda c: c[2] & (c[3] < LLOYD_MAX_STEPS), lloyd, carry)
    if points is not every:
        labels = nearest(every, centres)
    # Labels in the order of the centres' first (standardised) coordinate, not of the random
    # seeding: component 0 starts on the leftmost cluster, as ordered priors (Stan's log_mix,
    # mu ~ Normal((-2, 2), 1)) expect; restarts relabel them (:func:`_relabelling`).
    labels = jnp.argsort(jnp.argsort(centres[:, 0]))[labels]
    hard = jax.nn.one_hot(labels, num, dtype=points.dtype)
    return 0.9 * hard + 0.1 / num

