"""Local-mode (incremental) SVI: each observation keeps its latest site parameter.

Eq. 60 with one site per observation: refreshing a minibatch replaces its
observations' old contributions to a global variable's natural parameters by
new ones. A per-observation contribution of factor f to variable v is, term by
term of the symbolic expectation (:mod:`blrppl.symbolic.expectation`),

    λ̃_{f,v,n} = ∂/∂μ_v einsum(op_t[n, ...], R_v(μ_v), W_t[n, ...])

where ``op_t`` is the term's constant operand (data), ``R_v`` the term's read
of v's mean parameters and ``W_t[n]`` the product of the term's reads of the
*other* variables as they were when observation n was last visited. Only
``W_t`` is stored per observation (a responsibility vector, a precision: the
observation's own scale), never a copy of v's natural parameters; the sum over
observations is kept as a running aggregate ``A_t = einsum(op_t, W_t)`` that
each minibatch updates by its difference.

A GLM factor with estimated site parameters (Gauss-Hermite on its linear
predictors, :mod:`blrppl.estimators.glm`) stores two numbers per observation
and neighbour instead: the x coefficient b_n and the second-order coefficient
c_n of its site on the predictor η_n (Khan & Lin 2017), whose contribution to
v's natural parameters is (a_n b_n, c_n a_n a_nᵀ). Refreshing a minibatch
blends its sites, (b, c) ← (1 - ρ)(b, c) + ρ (b, c)(μ) (Eq. 60), and adds the
difference of the contributions to the aggregate: O(N) numbers, never
O(N D²).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from blrppl.blr.elbo import mean_params
from blrppl.errors import ModelError
from blrppl.symbolic.expectation import einsum_letters, read_statistic, take_observations


@dataclasses.dataclass(frozen=True)
class _TermStore:
    factor: str
    var: str
    term: Any  # the term as analysed (shapes and labels; its arrays are read from the plan's arrays)
    index: int  # its position in the factor's analysis
    v_read: Any
    others: tuple
    w_labels: tuple  # labels of W (observation label first)
    a_labels: tuple  # labels of A (the labels of v's read)


class IncrementalStore:
    """Per-observation state of local-mode SVI (see the module docstring)."""

    def __init__(self, qs, estimators, plate_factors, local_vars, obs_size):
        self.qs = qs
        self.estimators = tuple(estimators)
        self.plate_factors = plate_factors
        self.obs_size = obs_size
        self.entries: dict[str, list[_TermStore]] = {}
        self.glm: dict[str, list] = {}  # variable -> GLM factors' estimators
        for est in self.estimators:
            if est.factor not in plate_factors:
                continue
            if est.observation_sites is not None:
                for v in est.neighbours:
                    self.glm.setdefault(v, []).append(est)
                continue
            analysis = est.analysis
            if analysis is None:
                raise ModelError(
                    f"site {est.factor!r}: incremental (local-mode) SVI needs exact site parameters, or "
                    f"a GLM likelihood (per-observation sites), for factors in the subsampled plate; "
                    f"this factor is estimated by {est.method.label!r}; use mode='global'."
                )
            for v in est.neighbours:
                if v in local_vars:
                    continue
                self.entries.setdefault(v, [])
                for index, term in enumerate(analysis.terms):
                    v_reads = [r for r in term.reads if r.var == v]
                    if not v_reads:
                        continue
                    if len(v_reads) > 1:
                        raise ModelError(
                            f"site {v!r}: factor {est.factor!r} couples {v!r} with itself across "
                            "positions; incremental SVI needs one read per term; use mode='global'."
                        )
                    others = tuple(r for r in term.reads if r.var != v)
                    obs = analysis.obs_label
                    w_labels = [obs]
                    for r in others:
                        for idx in r.index:
                            for lab in idx.labels:
                                if lab not in w_labels:
                                    w_labels.append(lab)
                    a_labels = []
                    for idx in v_reads[0].index:
                        for lab in idx.labels:
                            if lab not in a_labels:
                                a_labels.append(lab)
                    self.entries[v].append(
                        _TermStore(est.factor, v, term, index, v_reads[0], others, tuple(w_labels), tuple(a_labels))
                    )
        self.obs_label = {
            est.factor: est.analysis.obs_label
            for est in self.estimators
            if est.factor in plate_factors and est.analysis is not None
        }

    # -- shapes ---------------------------------------------------------------

    def _label_sizes(self, entry: _TermStore, mean) -> dict:
        """Sizes of W's and A's labels (from the reads at full size)."""
        sizes = {}
        obs = self.obs_label[entry.factor]
        sizes[obs] = self.obs_size
        for r in entry.others + (entry.v_read,):
            array, labels = read_statistic(mean_layout(self.qs, mean, r.var), r)
            for lab, n in zip(labels, jnp.shape(array)):
                sizes[lab] = n
        if entry.term.operand is not None:
            for lab, n in zip(entry.term.operand.labels, jnp.shape(entry.term.operand.array)):
                sizes[lab] = n
        return sizes

    def init(self, natural: Mapping[str, Any], params: Mapping[str, Any], arrays: Any) -> dict:
        """Empty per-observation stores (no observation visited yet).

        Factors outside the plate start at their site parameters under the
        starting q.
        """
        mean = mean_params(self.qs, natural)
        store = {}
        for v, entries in self.entries.items():
            for i, entry in enumerate(entries):
                sizes = self._label_sizes(entry, mean)
                w = jnp.zeros([sizes[lab] for lab in entry.w_labels])
                a = jnp.zeros([sizes[lab] for lab in entry.a_labels])
                store[f"{v}/{i}"] = {"W": w, "A": a}
        dtype = jnp.result_type(float)
        for v, ests in self.glm.items():
            for est in ests:
                store[f"{v}/glm/{est.factor}"] = {
                    "b": jnp.zeros((self.obs_size,), dtype),
                    "c": jnp.zeros((self.obs_size,), dtype),
                    "A": jax.tree.map(jnp.zeros_like, mean[v]),
                }
        outside = {}
        for v in set(self.entries) | set(self.glm):
            for est in self.estimators:
                if v in est.neighbours and est.factor not in self.plate_factors:
                    _, grads = est.estimate(jax.random.key(0), mean, params, arrays)
                    outside[f"{est.factor}/{v}"] = grads[v]
        store["_outside"] = outside
        return store

    # -- one refresh ------------------------------------------------------------

    def _w_batch(self, entry: _TermStore, mean, batch, plan_arrays) -> jax.Array:
        """The product of the other reads at the minibatch, labelled ``w_labels``."""
        obs = self.obs_label[entry.factor]
        arrays, label_lists = [], []
        for r in _reads(entry, plan_arrays)[1]:
            array, labels = read_statistic(mean_layout(self.qs, mean, r.var), r, obs, batch)
            arrays.append(array)
            label_lists.append(labels)
        out_labels = list(entry.w_labels)
        shape_m = jnp.shape(batch)[0]
        arrays.append(jnp.ones((shape_m,)))
        label_lists.append([obs])
        letters = einsum_letters(label_lists + [out_labels])
        spec = ",".join("".join(letters[l] for l in labs) for labs in label_lists)
        spec += "->" + "".join(letters[l] for l in out_labels)
        return jnp.einsum(spec, *arrays)

    def _a_delta(self, entry: _TermStore, w_delta, batch, plan_arrays) -> jax.Array:
        obs = self.obs_label[entry.factor]
        term = plan_arrays.factors[entry.factor].terms[entry.index]  # the data, as an argument
        arrays, label_lists = [w_delta], [list(entry.w_labels)]
        if term.operand is not None:
            labels = list(term.operand.labels)
            arrays.append(take_observations(jnp.asarray(term.operand.array), labels, obs, batch))
            label_lists.append(labels)
        out = list(entry.a_labels)
        letters = einsum_letters(label_lists + [out])
        spec = ",".join("".join(letters[l] for l in labs) for labs in label_lists)
        spec += "->" + "".join(letters[l] for l in out)
        return term.coeff * jnp.einsum(spec, *arrays)

    def refresh(self, rng_key, mean, params, arrays, v, batch, store, rho):
        """Refresh the minibatch's sites for global variable ``v``; return (λ_v, store)."""
        store = dict(store)
        outside = dict(store["_outside"])
        q = self.qs[v]
        # Factors outside the plate: their site parameter, damped (Eq. 60).
        total = None
        for i, est in enumerate(self.estimators):
            if v not in est.neighbours or est.factor in self.plate_factors:
                continue
            _, grads = est.estimate(jax.random.fold_in(rng_key, i), mean, params, arrays)
            key = f"{est.factor}/{v}"
            site = jax.tree.map(lambda s, g: (1.0 - rho) * s + rho * g, outside[key], grads[v])  # Eq. 60
            outside[key] = site
            total = site if total is None else jax.tree.map(jnp.add, total, site)
        store["_outside"] = outside
        # Factors in the plate: swap the minibatch's stored contributions.
        aggregates = []
        for i, entry in enumerate(self.entries.get(v, [])):
            key = f"{v}/{i}"
            obs = self.obs_label[entry.factor]
            w_old = jnp.take(store[key]["W"], batch, axis=0)
            w_new = (1.0 - rho) * w_old + rho * self._w_batch(entry, mean, batch, arrays)
            delta = self._a_delta(entry, w_new - w_old, batch, arrays)
            a = store[key]["A"]
            if obs in entry.a_labels:
                axis = entry.a_labels.index(obs)
                a = jnp.moveaxis(jnp.moveaxis(a, axis, 0).at[batch].add(jnp.moveaxis(delta, axis, 0)), 0, axis)
            else:
                a = a + delta
            store[key] = {"W": store[key]["W"].at[batch].set(w_new), "A": a}
            aggregates.append((entry, a))
        if aggregates:

            def expected(layout):
                value = 0.0
                for entry, a in aggregates:
                    array, labels = read_statistic({v: layout}, _reads(entry, arrays)[0])
                    letters = einsum_letters([list(entry.a_labels), labels])
                    spec = "".join(letters[l] for l in entry.a_labels) + "," + "".join(letters[l] for l in labels) + "->"
                    value = value + jnp.einsum(spec, a, array)
                return value

            grads = jax.grad(expected)(q.to_value_layout(mean[v]))
            site = q.from_value_layout(grads)
            total = site if total is None else jax.tree.map(jnp.add, total, site)
        # GLM factors: swap the minibatch's two-number sites (Eq. 60).
        for est in self.glm.get(v, []):
            key = f"{v}/glm/{est.factor}"
            sites = est.observation_sites
            rows, b_fresh, c_fresh = sites.fresh(mean, params, arrays, batch)[v]
            entry = store[key]
            b_old, c_old = jnp.take(entry["b"], batch), jnp.take(entry["c"], batch)
            b_new = (1.0 - rho) * b_old + rho * b_fresh  # Eq. 60, per observation
            c_new = (1.0 - rho) * c_old + rho * c_fresh
            change = sites.contribution(v, rows, b_new - b_old, c_new - c_old)
            a = jax.tree.map(jnp.add, entry["A"], change)
            store[key] = {"b": entry["b"].at[batch].set(b_new), "c": entry["c"].at[batch].set(c_new), "A": a}
            total = a if total is None else jax.tree.map(jnp.add, total, a)
        return total, store


def _reads(entry: _TermStore, arrays: Any) -> tuple:
    """``(v_read, others)`` of the entry's term in the plan's arrays: their index arrays are
    data (leaves: :func:`~blrppl.symbolic.compiled.with_index_leaves`), not the first plan's."""
    reads = arrays.factors[entry.factor].terms[entry.index].reads
    return next(r for r in reads if r.var == entry.var), tuple(r for r in reads if r.var != entry.var)


def mean_layout(qs, mean, var):
    """One variable's mean parameters in value layout, as a dict for ``_read``."""
    return {var: qs[var].to_value_layout(mean[var])}


def build_store(qs, estimators, plate_factors, local_vars, obs_size) -> IncrementalStore:
    """The incremental store of a plan (raises ModelError where it cannot apply)."""
    return IncrementalStore(qs, estimators, plate_factors, frozenset(local_vars), obs_size)
