"""The estimator interface, and a factor's log density as a function of latents.

An estimator turns one factor into ``estimate(rng_key, mean, params, arrays,
batch=None) -> (value, site_params)``: ``value`` estimates E_q[log f] and
``site_params`` maps each neighbouring variable to ∇_μ E_q[log f] in that
variable's natural parameter layout. Differentiating with respect to the mean
parameters μ (not λ) is what makes the gradient natural (Khan & Rue, Sec. 2);
no Fisher matrix is ever formed.

``arrays`` is the plan's data (:class:`PlanArrays`): estimators read their
data from it, never from closed-over constants, so that compiled code takes
the data as an argument and a new data set of the same shapes reuses it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from blrppl.compile_mode import probe
from blrppl.graph.nodes import FactorGraph
from blrppl.graph.replay import replay, safe_observation
from blrppl.symbolic import canonical
from blrppl.symbolic.expectation import VarInfo


ESTIMATORS = ("delta", "mc", "quadrature", "cubature")
"""Estimators of non-conjugate site parameters (the option strings of DESIGN.md)."""


class Method(NamedTuple):
    """How one factor's site parameters are computed.

    Attributes:
      exact: neighbours whose site parameters are exact (symbolic).
      estimated: neighbours whose site parameters are estimated.
      estimator: ``"delta"``, ``"mc"``, ``"quadrature"`` or ``"cubature"``
        for the estimated continuous ones, ``"enumeration"`` when every
        estimated one is discrete (``""`` when every edge is exact).
      enumerated: the estimated neighbours with a finite discrete q, whose
        expectations are exact sums over their support
        (:mod:`~blrppl.estimators.enumeration`).
    """

    exact: tuple[str, ...] = ()
    estimated: tuple[str, ...] = ()
    estimator: str = ""
    enumerated: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``"exact"``, the estimator's name, ``"exact+<estimator>"`` (a hybrid
        factor), with ``"enumeration+"`` before the estimator of continuous
        neighbours when discrete ones are enumerated too."""
        if not self.estimated:
            return "exact"
        name = self.estimator
        if self.enumerated and name != "enumeration":
            name = f"enumeration+{name}"
        return f"exact+{name}" if self.exact else name

    @property
    def noisy(self) -> bool:
        """Whether the site parameters are Monte Carlo estimates (random)."""
        return bool(self.estimated) and self.estimator == "mc"

    @property
    def exact_given_enumerated(self) -> bool:
        """Exact in every edge: symbolic given the enumerated neighbours, summed over their values
        (``"exact+enumeration"``, :mod:`~blrppl.estimators.conditional_enumeration`)."""
        return bool(self.exact) and self.estimator == "enumeration"

    @property
    def deterministic_estimate(self) -> bool:
        """Estimated by a deterministic rule (delta method, quadrature, cubature or enumeration)."""
        return bool(self.estimated) and self.estimator in ("delta", "quadrature", "cubature", "enumeration")

    def __str__(self) -> str:
        return self.label


class PlanArrays(NamedTuple):
    """The data a compiled fit reads, passed as an argument (a pytree).

    Attributes:
      factors: factor name -> that estimator's own arrays (a symbolic
        analysis's operands, a GLM design matrix, ...), or None.
      data: the model's array arguments (:class:`~blrppl.graph.data.ModelData`
        ``.arrays``), for estimators that re-run the model.
      starts: variable name -> data-dependent starting values (see
        :mod:`blrppl.blr.starts`).
      params: ``numpyro.param`` name -> initial value.
    """

    factors: dict
    data: tuple
    starts: dict
    params: dict


class FactorEstimator(NamedTuple):
    """One factor's expected log density and site parameters.

    Attributes:
      factor: the factor's name.
      neighbours: the variables it has site parameters for.
      method: a :class:`Method`.
      estimate: ``(rng_key, mean, params, arrays, batch=None) -> (value,
        site_params)`` where ``mean`` maps variable names to family mean
        parameters, ``params`` maps point-estimate names to values,
        ``arrays`` is the plan's :class:`PlanArrays` and ``batch`` (for a
        factor in a subsampled plate) selects observations.
      arrays: this estimator's entry of ``PlanArrays.factors`` (data it
        reads), or None.
      analysis: for exact site parameters, the symbolic analysis's static
        structure (:class:`~blrppl.symbolic.expectation.Analysis`); else None.
      closed_data: the estimate closes over values computed from the data
        (rather than reading them from ``arrays``): a plan holding it is
        compiled per data set (its signature includes the data's content).
      sequential: the factor's code calls LAPACK, so its samples, nodes and
        configurations are evaluated one at a time (``lax.map``), and
        restarts run one after another, never as a batched LAPACK call
        (:func:`blrppl.graph.jaxpr.lapack_primitives`).
      subsample: for an estimated factor in a subsampled plate, that
        :class:`~blrppl.graph.nodes.Plate`: ``estimate(..., batch=idx)``
        re-runs the model on the minibatch's rows only (the unscaled
        minibatch sum), and ``batch=None`` sums every row in chunks of M
        (:mod:`blrppl.estimators.minibatch`).
      observation_sites: for a GLM factor in a subsampled plate, its
        per-observation two-number sites (a
        :class:`~blrppl.estimators.glm.ObservationSites`), which local-mode
        SVI stores and swaps (Eq. 60); else None.
      replay: for ``arrays`` computed from the data by JAX code rather than
        by the symbolic analysis (a GLM's design matrix), ``model data arrays
        -> (arrays, ok)``: the same arrays for other data of the same shapes,
        jit- and vmap-able, and whether the checks that chose this estimator
        hold there (a compiled replan, :mod:`blrppl.blr.replan`); else None.
      constant: for exact site parameters whose E_q[log f] is affine in the
        neighbours' mean parameters (every term reads at most one latent
        statistic), ``(params, arrays) -> c_f = E_q[log f] - <λ̃_f, μ>``, the
        part that does not depend on q (:func:`blrppl.blr.elbo.exact_evidence`);
        else None.
      at_points: for exact site parameters, ``(mean, arrays) -> (params -> E_q[log f])``: the
        expectation as a function of the point estimates alone, with q fixed at ``mean`` and
        everything else contracted once (EM's M-step, :mod:`blrppl.blr.mstep`); else None.
      delta: for a GLM factor by quadrature on its linear predictors, the delta-method version
        on the same ``arrays`` (:mod:`blrppl.estimators.predictor`), which a Newton start takes;
        else None.
    """

    factor: str
    neighbours: tuple[str, ...]
    method: Method
    estimate: Callable[..., tuple[Any, dict]]
    arrays: Any = None
    analysis: Any = None
    closed_data: bool = False
    sequential: bool = False
    subsample: Any = None
    observation_sites: Any = None
    replay: Optional[Callable[[tuple], tuple[Any, Any]]] = None
    constant: Optional[Callable[[Any, Any], Any]] = None
    at_points: Optional[Callable[[Any, Any], Callable]] = None
    delta: Optional["FactorEstimator"] = None


def var_info(q: Any) -> VarInfo:
    """What the symbolic layer needs to know about a variable's q."""
    return VarInfo(q.family.kind, tuple(q.shape), q.num_batch, q.num_categories)


def owner(graph: FactorGraph, factor: str):
    """The variable whose own prior ``factor`` is (None for other factors)."""
    if graph.factors[factor].kind != "prior":
        return None
    for name, node in graph.variables.items():
        if name == factor or (node.chain is not None and factor in node.chain.sites):
            return name
        if any(member.name == factor for member in node.members):
            return name
    return None


def factor_log_density(
    graph: FactorGraph,
    factor: str,
    transforms: Mapping[str, Any],
    fixed: Mapping[str, Any],
    *,
    use_canonical: bool = True,
    observation_plate: Any = None,
    elementwise: bool = False,
    split_jacobian: bool = False,
    subsample: Any = None,
    per_site: bool = False,
) -> Callable[[Mapping[str, Any], Mapping[str, Any]], jax.Array]:
    """``log f(values, params)``: one factor's log density summed over its plates.

    ``values`` holds the factor's neighbours in q's space (unconstrained for
    variables with a transform; the Jacobian of the transform is added to the
    variable's own prior factor); other latents are read from ``fixed``, also
    in q's space. ``transforms`` maps every transformed variable to its
    transform.
    With ``use_canonical`` the density is the canonical one that the symbolic
    analysis understands; otherwise numpyro's ``log_prob``. With an
    ``observation_plate`` (a :class:`~blrppl.graph.nodes.Plate`), the result
    is a vector over that plate's positions, summed over everything else.
    With ``elementwise``, it is the flattened array of per-element log
    densities (no Jacobian: for factors other than a variable's own prior).
    With ``split_jacobian``, it is the pair (flattened per-element log
    densities, the Jacobian term), whose sums make the log density.
    ``data`` (the model's array arguments, ``graph.data.arrays`` layout) runs
    the model on other data than it was traced with (None: the traced data).
    With a ``subsample`` plate (stochastic VI), ``indices`` (length M) re-run
    the model on those rows of the plate only, and the result is their
    *unscaled* log density (numpyro's N / M scale of the plate divided out).
    With ``per_site``, a factor joining several sites (a loop chain's steps)
    gives a tuple, one result per site (the Jacobian in the first), for the
    symbolic analysis to read apart.
    """
    node = graph.factors[factor]
    own = owner(graph, factor)
    # The prior of a missing-data latent (numpyro's obs_mask) is masked where the
    # data are observed: there the latent is a dummy; its q stays the prior.
    imputed = own is not None and graph.variables[own].observed_mask is not None

    def log_factor(
        values: Mapping[str, Any], params: Mapping[str, Any], data: Any = None, indices: Any = None
    ) -> jax.Array:
        constrained = {}
        jacobian = 0.0
        for name, value in {**fixed, **values}.items():
            transform = transforms.get(name)
            if transform is None:
                constrained[name] = value
                continue
            if hasattr(transform, "log_abs_det_jacobian_site"):  # a joint block of sites
                constrained.update(transform(value))
                if name == own:
                    jacobian = transform.log_abs_det_jacobian_site(value, factor)
                continue
            constrained[name] = transform(value)
            if name == own:
                jacobian = jnp.sum(transform.log_abs_det_jacobian(value, constrained[name]))
        plate_indices = None if indices is None else {subsample.name: indices}
        replayed = replay(graph, constrained, params, plate_indices, data=data, sites=node.site_names)
        # A factor joining a loop chain's steps sums its sites' log densities.
        log_probs = [_site_log_density(replayed[site], indices) for site in node.site_names]
        if split_jacobian:
            flat = jnp.concatenate([jnp.ravel(lp) for lp in log_probs])
            return flat, jnp.asarray(jacobian, jnp.result_type(flat))
        if elementwise:
            return jnp.concatenate([jnp.ravel(lp) for lp in log_probs])
        if observation_plate is not None:
            totals = [_per_position(lp, observation_plate) for lp in log_probs]
        else:
            totals = [jnp.sum(lp) for lp in log_probs]
        if per_site and node.sites:
            return (totals[0] + jacobian,) + tuple(totals[1:])
        return sum(totals) + jacobian

    def _site_log_density(site: Any, indices: Any) -> jax.Array:
        value = safe_observation(site)
        fn = site.fn
        while imputed and isinstance(fn, dist.MaskedDistribution):
            fn = fn.base_dist
        if use_canonical:
            log_prob = canonical.log_density(fn, value)
        else:
            log_prob = fn.log_prob(value)
        if site.mask is not None and not imputed:
            log_prob = jnp.where(site.mask, log_prob, 0.0)
        if site.scale is not None:
            log_prob = log_prob * site.scale
        if indices is not None:  # the minibatch's unscaled sum: numpyro scaled it by N / M
            log_prob = log_prob * (jnp.shape(indices)[0] / subsample.size)
        return log_prob

    def _per_position(log_prob: jax.Array, plate: Any) -> jax.Array:
        log_prob = jnp.moveaxis(log_prob, jnp.ndim(log_prob) + plate.dim, 0)
        return jnp.sum(jnp.reshape(log_prob, (log_prob.shape[0], -1)), axis=1)

    return log_factor


def q_space_examples(
    examples: Mapping[str, Any], transforms: Mapping[str, Any]
) -> dict[str, Any]:
    """Example latent values mapped into q's space (inverse transforms, in one compiled call)."""
    moved = [name for name in examples if transforms.get(name) is not None]
    inverted = probe(lambda values: {name: transforms[name].inv(values[name]) for name in moved})(
        {name: examples[name] for name in moved}
    )
    return {name: inverted.get(name, value) for name, value in examples.items()}


def as_numpy_tree(tree: Any) -> Any:
    return jax.tree.map(np.asarray, tree)
