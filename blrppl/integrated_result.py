"""The result of an ``Integrated`` fit: a mixture over grid nodes of exp-family q.

q(h, c) = Σ_k w_k δ(h - h_k) q(c | h_k): a node k (a value h_k of the
hyperparameters) with weight w_k ∝ p(y, u_k), then the conditional q(c | h_k)
fitted at that node (exact for conjugate conditionals). Marginals of c are
mixtures of the nodes' q marginals (:class:`GridMixture`); marginals of h are
the quadrature's discrete measure for moments and draws, with the exact
density of p(h | y) for ``log_prob`` (:class:`HyperMarginal`). Everything
about one node reuses :class:`~blrppl.results.BLRResult` (a conditional fit
is an ordinary BLR fit with h held), so draws, deterministic sites, guides
and moments are computed by the same code as for every other engine.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from blrppl.blr.integrate import IntegratedFit
from blrppl.blr.integrate.mixture import mix_covariance, mix_moments, site_log_density
from blrppl.graph.jaxpr import map_batch
from blrppl.results import BLRResult, Convergence


class IntegratedState(NamedTuple):
    """The arrays of an integrated fit.

    Attributes:
      mode: the mode of p(u | y) on h's unconstrained space, (k,).
      hessian: ∇² log p(u, y) at the mode, (k, k).
      u: the kept grid nodes, (K, k).
      log_weights: their normalised log weights, (K,).
      nodes: the conditional fits' states at the nodes (leading axis K).
      params: fitted ``numpyro.param`` values: none (Integrated refuses them).
    """

    mode: Any
    hessian: Any
    u: Any
    log_weights: Any
    nodes: Any
    params: dict = {}


def _supports(graph: Any) -> dict:
    """Site -> support, for latent sites and the members of joint blocks."""
    out = {}
    for name, node in graph.variables.items():
        out[name] = node.support
        for member in node.members:
            out[member.name] = member.support
    return out


#: Node counts are padded to a multiple of this (weight zero), so that compiled
#: moments, densities and draws serve grids of similar sizes.
PAD = 64


def _padded(states: Any, log_weights: jax.Array, u: Any = None) -> tuple:
    """The nodes (states, log weights and u) padded with copies of node 0 of weight zero, to a
    multiple of ``PAD``. On the host (numpy): a device op on the unpadded node count, which
    changes with the data, would compile a program for every count."""
    log_weights = np.asarray(log_weights)
    extra = -int(log_weights.shape[0]) % PAD
    index = np.concatenate([np.arange(log_weights.shape[0]), np.zeros(extra, int)])
    log_w = np.concatenate([log_weights, np.full(extra, -np.inf, log_weights.dtype)])
    padded = jax.tree.map(lambda a: jax.device_put(np.asarray(a)[index]), states), jax.device_put(log_w)
    return padded if u is None else padded + (jax.device_put(np.asarray(u)[index]),)


def _take(tree: Any, k: Any) -> Any:
    return jax.tree.map(lambda a: a[k], tree)


def _node_result(fit: IntegratedFit, state: Any) -> BLRResult:
    """Node k's conditional fit as an ordinary result (h held at h_k)."""
    return BLRResult(plan=fit.plan, state=state, elbo=jnp.zeros((1,)), mode="global")


def _moments(conditional: Any, state: Any) -> dict:
    """Site -> (mean, variance, covariance or None) of one node's q (static parts of q only)."""
    out = {}
    for site, d in BLRResult(plan=conditional.plan, state=state, elbo=jnp.zeros((1,)), mode="global").posterior.items():
        cov = None
        if len(d.event_shape) == 1:
            try:
                cov = d.covariance_matrix
            except (NotImplementedError, AttributeError):
                cov = None
        out[site] = (d.mean, d.variance, cov)
    return out


@functools.partial(jax.jit, static_argnums=0)
def _node_moments(conditional: Any, states: Any) -> dict:
    """:func:`_moments` of every node, one program per compiled conditional fit."""
    return map_batch(lambda state: _moments(conditional, state), states)


def _unpack_nodes(space: Any, u: jax.Array) -> dict:
    """h's sites (constrained) at the rows of u (padded: its shape, hence the eager ops'
    compiled programs, changes only with the bucket)."""
    return jax.vmap(space.unpack)(u)


def _marginals(conditional: Any, state: Any) -> dict:
    return BLRResult(plan=conditional.plan, state=state, elbo=jnp.zeros((1,)), mode="global").posterior


@functools.partial(jax.jit, static_argnums=(0, 1))
def _mixture_log_prob(conditional: Any, site: str, states: Any, log_weights: jax.Array, value: jax.Array) -> jax.Array:
    """log Σ_k w_k q_k(value) of one site (one program per compiled conditional fit and site)."""
    lp = map_batch(lambda state: _marginals(conditional, state)[site].log_prob(value), states)
    w = log_weights.reshape((-1,) + (1,) * (jnp.ndim(lp) - 1))
    return jax.scipy.special.logsumexp(w + lp, axis=0)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _mixture_sample(conditional: Any, site: str, num: int, rng_key: jax.Array, states: Any, log_weights: jax.Array) -> jax.Array:
    """``num`` draws of one site: a node by weight, then from that node's q."""
    node_key, draw_key = jax.random.split(rng_key)
    ks = jax.random.categorical(node_key, log_weights, shape=(num,))
    return map_batch(lambda key, k: _marginals(conditional, _take(states, k))[site].sample(key), jax.random.split(draw_key, num), ks)


class GridMixture(dist.Distribution):
    """A latent site's marginal under the grid mixture: Σ_k w_k q_k(x).

    ``mean``, ``variance`` (and ``covariance_matrix`` for vector sites with
    full-covariance components) are the exact moments of the mixture;
    ``log_prob`` is log Σ_k w_k q_k(x); ``sample`` draws a node by weight,
    then from that node's q.

    Args:
      conditional, site: the compiled conditional fit and the site.
      states, log_weights: the nodes' fits and normalised log weights (K,).
      mean, variance: the mixture's moments, site shaped.
      covariance: the mixture's covariance matrix (a vector site whose
        components have one: its last axis is the event), or None.
      support: the site's support.
    """

    arg_constraints: dict = {}

    def __init__(self, conditional, site, states, log_weights, mean, variance, covariance, support):
        self._conditional, self._site, self._states = conditional, site, states
        self._log_weights = log_weights
        self._mean, self._variance, self._covariance = mean, variance, covariance
        self._support = support
        shape = jnp.shape(mean)
        event = shape[-1:] if covariance is not None else ()
        super().__init__(batch_shape=shape[: len(shape) - len(event)], event_shape=event)

    @property
    def support(self):
        return self._support

    @property
    def mean(self):
        return self._mean

    @property
    def variance(self):
        return self._variance

    @property
    def covariance_matrix(self):
        if self._covariance is None:
            raise NotImplementedError("this site's q has no covariance matrix (a scalar or mean-field site).")
        return self._covariance

    def log_prob(self, value):
        return _mixture_log_prob(self._conditional, self._site, self._states, self._log_weights, jnp.asarray(value))

    def sample(self, key, sample_shape=()):
        n = math.prod(sample_shape)
        draws = _mixture_sample(self._conditional, self._site, n, key, self._states, self._log_weights)
        return jnp.reshape(draws, tuple(sample_shape) + jnp.shape(draws)[1:])


class HyperMarginal(dist.Distribution):
    """A hyperparameter site's posterior p(h_site | y) (constrained space).

    ``mean``/``variance``/``covariance_matrix`` and ``sample`` are those of the
    quadrature's discrete measure Σ_k w_k δ(h - h_k), consistent with
    :meth:`IntegratedResult.sample`; ``log_prob`` is the exact density
    exp f(u(h)) / (|det ∂h/∂u| p(y)), marginalised over the other sites of h
    by quadrature when there are several
    (:func:`~blrppl.blr.integrate.mixture.site_log_density`).
    """

    arg_constraints: dict = {}

    def __init__(self, fit: IntegratedFit, site: str, values: jax.Array, log_weights: jax.Array, support: Any):
        self._fit, self._site, self._values, self._log_weights = fit, site, values, log_weights
        self._support = support
        shape = jnp.shape(values)[1:]
        event = shape[-1:] if len(shape) else ()
        super().__init__(batch_shape=shape[: len(shape) - len(event)], event_shape=event)

    @property
    def support(self):
        return self._support

    @property
    def mean(self):
        return mix_moments(self._log_weights, self._values, jnp.zeros_like(self._values))[0]

    @property
    def variance(self):
        return mix_moments(self._log_weights, self._values, jnp.zeros_like(self._values))[1]

    @property
    def covariance_matrix(self):
        if jnp.ndim(self._values) != 2:
            raise NotImplementedError("covariance_matrix is for vector sites.")
        return mix_covariance(self._log_weights, self._values, jnp.zeros(jnp.shape(self._values) + jnp.shape(self._values)[-1:]))

    def log_prob(self, value):
        fit = self._fit
        return site_log_density(fit.conditional, fit.arrays, fit, self._site, value)

    def sample(self, key, sample_shape=()):
        n = math.prod(sample_shape)
        ks = jax.random.categorical(key, self._log_weights, shape=(n,))
        draws = self._values[ks]
        return jnp.reshape(draws, tuple(sample_shape) + jnp.shape(self._values)[1:])


@dataclasses.dataclass(frozen=True, eq=False)
class IntegratedResult:
    """What ``Integrated.run`` returns (see ``shared/API.md`` and :mod:`blrppl.integrated_result`).

    Attributes:
      fit: the core's :class:`~blrppl.blr.integrate.IntegratedFit`.
    """

    fit: IntegratedFit
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ summary numbers

    @property
    def hyper(self) -> tuple:
        """The hyperparameter sites h integrated on the grid."""
        return self.fit.choice.sites

    @property
    def inner(self) -> str:
        """How q(c | h) is fitted: ``"exact"`` (ConjugateBayes) or ``"laplace"`` (INLA-like)."""
        return self.fit.choice.inner

    @property
    def method(self) -> str:
        """One sentence on what is exact and what is approximated."""
        sites = ", ".join(repr(s) for s in self.hyper) or "nothing"
        if self.inner == "exact":
            return (
                f"exact conditionals q(c | h) (ConjugateBayes) integrated over h = {sites} on a "
                f"{self.num_nodes}-node grid: exact up to quadrature error"
            )
        return (
            f"INLA-like: Laplace conditionals q(c | h) integrated over h = {sites} on a {self.num_nodes}-node "
            "grid; q(c | h) and log p(y | h) are Laplace approximations"
        )

    @property
    def elbo(self) -> jax.Array:
        """log p(u, y) after each step of the mode search (one entry per step)."""
        return jnp.asarray(self.fit.mode.trace)

    @property
    def log_marginal_likelihood(self) -> float:
        """log p(y) by the quadrature over h (exact conditionals: exact up to quadrature error)."""
        return self.fit.grid.log_evidence

    @property
    def diagnostics(self):
        """:class:`~blrppl.blr.integrate.Diagnostics`; ``.problems`` lists what is not to be trusted."""
        return self.fit.diagnostics

    @property
    def trustworthy(self) -> bool:
        """True when no diagnostic objects to the grid."""
        return self.fit.diagnostics.ok

    @property
    def flags(self) -> tuple[str, ...]:
        """Doubts about the fit, one message each, as ``BLRResult.flags``: the grid's problems."""
        return tuple(self.fit.diagnostics.problems)

    @property
    def converged(self) -> Convergence:
        """Whether the mode search over h converged (its Newton decrement below tolerance), as
        ``BLRResult.converged``: ``bool()`` of it, and the reason in words."""
        mode = self.fit.mode
        reason = (
            "converged: the mode search over h reached its Newton decrement tolerance"
            if mode.converged
            else f"the mode search over h did not converge in {mode.num_steps} Newton steps; run more steps"
        )
        return Convergence(bool(mode.converged), reason, int(mode.num_steps))

    @property
    def num_nodes(self) -> int:
        """The number of grid nodes in the mixture (after pruning)."""
        return int(self.fit.grid.log_weights.shape[0])

    @property
    def weights(self) -> jax.Array:
        """The nodes' normalised weights, (K,)."""
        return jax.device_put(np.exp(np.asarray(self.fit.grid.log_weights)))

    @property
    def nodes(self) -> dict:
        """Hyperparameter site -> its value at each node, (K, *shape), constrained."""
        return jax.vmap(self.fit.conditional.space.unpack)(self.fit.grid.u)

    # ------------------------------------------------------------------ BLRResult-like surface

    @property
    def plan(self) -> Any:
        """The conditional plan (h held as point estimates)."""
        return self.fit.plan

    @property
    def graph(self) -> Any:
        """The model's traced graph (h among its latents)."""
        if "graph" not in self._cache:
            from blrppl.graph import build_graph

            g = self.fit.plan.graph
            self._cache["graph"] = build_graph(g.model, g.model_args, g.model_kwargs, families=None)
        return self._cache["graph"]

    @property
    def state(self) -> IntegratedState:
        """The fit's arrays (:class:`IntegratedState`)."""
        grid = self.fit.grid
        return IntegratedState(self.fit.mode.u, self.fit.mode.hessian, grid.u, grid.log_weights, grid.states)

    @property
    def params(self) -> dict:
        """``numpyro.param`` values: none."""
        return {}

    @property
    def natural_params(self) -> dict:
        """Variable -> natural parameters of q(c | h_k) at every node (leading axis K)."""
        return dict(self.fit.grid.states.natural)

    @property
    def estimators(self) -> dict:
        """Factor -> how the conditional fit computes its site parameters."""
        return {est.factor: est.method.label for est in self.fit.plan.estimators}

    mode = "global"
    restarts = None
    num_restarts = 1

    def restart(self, index: int) -> "IntegratedResult":
        """The fit itself (Integrated has no restarts)."""
        if index != 0:
            raise IndexError(f"the fit has no restarts; restart({index}) does not exist.")
        return self

    # ------------------------------------------------------------------ the mixture

    @property
    def posterior(self) -> dict:
        """Latent site -> its marginal: :class:`GridMixture` for c, :class:`HyperMarginal` for h."""
        if "posterior" not in self._cache:
            self._cache["posterior"] = self._posterior()
        return dict(self._cache["posterior"])

    def _posterior(self) -> dict:
        fit = self.fit
        states, log_w, u = _padded(fit.grid.states, fit.grid.log_weights, fit.grid.u)
        per_node = _node_moments(fit.conditional, states)
        supports = _supports(fit.plan.graph)
        out = {}
        for site, (mean, variance, cov) in per_node.items():
            m, v = mix_moments(log_w, mean, variance)
            c = None if cov is None else mix_covariance(log_w, mean, cov)
            support = supports.get(site, dist.constraints.real)
            out[site] = GridMixture(fit.conditional, site, states, log_w, m, v, c, support)
        graph = fit.plan.graph
        for site, values in _unpack_nodes(fit.conditional.space, u).items():
            out[site] = HyperMarginal(fit, site, values, log_w, graph.params[site].constraint)
        return out

    def sample(self, rng_key: jax.Array, num_samples: int) -> dict:
        """Joint draws: a node by weight (h = h_k), then c ~ q(c | h_k); site -> (num_samples, *shape).

        Deterministic sites are computed from each draw's h and c, so functions
        of both (``theta = mu + tau * theta_raw``) have the mixture's spread.
        """
        fn = self._cache.get("sample")
        if fn is None:
            fit = self.fit
            unpack = fit.conditional.space.unpack

            def one(key, k):
                state = _take(fit.grid.states, k)
                draws = _node_result(fit, state).sample(key, 1)
                draws = {name: value[0] for name, value in draws.items()}
                draws.update(unpack(fit.grid.u[k]))
                return draws

            def many(key, num):
                node_key, draw_key = jax.random.split(key)
                ks = jax.random.categorical(node_key, fit.grid.log_weights, shape=(num,))
                return map_batch(one, jax.random.split(draw_key, num), ks)

            fn = jax.jit(many, static_argnums=1)
            self._cache["sample"] = fn
        return fn(rng_key, int(num_samples))

    def get_samples(self, rng_key: jax.Array, num_samples: int = 1000) -> dict:
        """As :meth:`sample` (NumPyro's ``MCMC.get_samples`` spelling)."""
        return self.sample(rng_key, num_samples)

    def guide(self) -> Callable:
        """A NumPyro guide: a node by weight, h = h_k, then c from that node's q (for ``Predictive``)."""
        fit = self.fit
        unpack = fit.conditional.space.unpack
        log_w = fit.grid.log_weights

        def guide(*args: Any, **kwargs: Any) -> None:
            k = numpyro.sample("_blrppl_node", dist.Categorical(logits=log_w), infer={"is_auxiliary": True})
            for site, value in unpack(fit.grid.u[k]).items():
                numpyro.sample(site, dist.Delta(value, event_dim=jnp.ndim(value)))
            state = _take(fit.grid.states, k)
            _node_result(fit, state._replace(params={})).guide()(*args, **kwargs)

        return guide

    def to_arviz(
        self,
        rng_key: Optional[jax.Array] = None,
        num_samples: int = 1000,
        *,
        coords: Optional[dict] = None,
        dims: Optional[dict] = None,
        log_likelihood: bool = True,
    ):
        """The fit as ``arviz.InferenceData``: joint draws from the mixture (one chain).

        ``posterior`` holds every sample and deterministic site
        (:meth:`sample`), ``log_likelihood`` the pointwise log likelihood of
        each draw (numpyro's ``log_likelihood``), ``observed_data`` the
        observations and ``sample_stats`` the ELBO of the mode search.
        """
        from numpyro.infer.util import log_likelihood as pointwise

        from blrppl.arviz_io import import_arviz, observed_values

        az = import_arviz()
        rng_key = jax.random.key(0) if rng_key is None else rng_key
        draws = {k: np.asarray(v) for k, v in self.sample(rng_key, num_samples).items()}
        graph = self.graph
        groups = {"posterior": {k: v[None] for k, v in draws.items()}}
        if log_likelihood:
            lik = pointwise(graph.model, draws, *graph.model_args, **graph.model_kwargs)
            groups["log_likelihood"] = {k: np.asarray(v)[None] for k, v in lik.items()}
        groups["observed_data"] = observed_values(graph)
        groups["sample_stats"] = {"elbo": np.asarray(self.elbo)[None, None, :]}
        return az.from_dict(
            **groups, coords=coords, dims={**(dims or {}), "elbo": ["step"]}
        )

    def pareto_k(self, rng_key: jax.Array, num_samples: int = 1000):
        """PSIS Pareto-k of the mixture against the model (see :func:`pareto_k`)."""
        return pareto_k(self, rng_key, num_samples)


def pareto_k(result: IntegratedResult, rng_key: jax.Array, num_samples: int = 1000):
    """PSIS k of a continuous version of the mixture against the model (Yao et al. 2018).

    The mixture's h is a discrete quadrature measure, which has no density;
    PSIS compares instead the proposal u ~ Σ_k w_k Uniform(cell_k) (each
    node's lattice cell, mapped to u), c ~ q(c | h(u)) fitted at the drawn u,
    with the model: log r = log p(h(u), c, y) + log |det ∂h/∂u| - log g(u)
    - log q(c | h(u)). For exact conditionals q(c | h) = p(c | h, y) and r is
    p(u, y) / g(u): k measures how well the grid captures p(h | y) (small
    when it does). One compiled program of ``num_samples`` conditional fits.
    """
    from blrppl.diagnostics import log_importance_ratios, pareto_k_of_ratios

    fit = result.fit
    grid, coords = fit.grid, fit.grid.standardised
    k = fit.conditional.space.dim
    node_key, jitter_key, draw_key = jax.random.split(rng_key, 3)
    nodes = jax.random.categorical(node_key, grid.log_weights, shape=(num_samples,))
    jitter = jax.random.uniform(jitter_key, (num_samples, k), minval=-0.5, maxval=0.5)
    z = grid.step * (jnp.asarray(grid.lattice, jnp.result_type(float))[nodes] + jitter)
    u = jnp.asarray(coords.mode) + z @ jnp.asarray(coords.scale).T
    log_g = grid.log_weights[nodes] - k * math.log(grid.step) - coords.log_det

    def one(key, x):
        state, _, _ = fit.conditional.fit(x, fit.arrays)
        return log_importance_ratios(_node_result(fit, state), key, 1)[0] + fit.conditional.space.log_jacobian(x)

    log_ratio = jax.jit(jax.vmap(one))(jax.random.split(draw_key, num_samples), u) - log_g
    # The scale of the ratios' rounding error: the size of the log densities summed into them.
    return pareto_k_of_ratios(log_ratio, jnp.abs(log_ratio) + jnp.abs(log_g))
