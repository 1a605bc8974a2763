"""Deterministic site parameters of a factor on one large joint Gaussian block.

``NonConjugateVI(blocks="all")`` puts every continuous latent that touches a
non-conjugate factor into one full Gaussian q(x) on the unconstrained space
(eight schools: x = (mu, log tau, theta)). A factor such as
``theta ~ Normal(mu, tau)`` then touches a 10-dimensional Gaussian, too many
dimensions for the degree-5 cubature and far too many for a tensor rule, and
Monte Carlo would make the fit noisy. But the factor is non-linear in few
coordinates only: split x into the held part u (members with a transform to a
constrained support, such as log tau, at most ``MAX_HELD_DIM`` scalars) and the
rest c. Given u, the factor is conjugate in c (the symbolic analysis of the
hybrid estimators, :mod:`blrppl.estimators.hybrid`), and under the full
Gaussian, c | u is Gaussian with

    m_c|u = m_c + Σ_cu Σ_uu⁻¹ (u - m_u),   Σ_c|u = Σ_cc - Σ_cu Σ_uu⁻¹ Σ_uc,

so that

    E_q[log f] = E_{q(u)}[ F(μ_c|u, s(u)) ]

with F exact (symbolic) and the outer expectation by tensor Gauss-Hermite in
u's standardised coordinates (u = m_u + L z, L Lᵀ = Σ_uu). The whole
expression is a smooth function of the block's mean parameters μ = (m, Σ + m mᵀ),
and the site parameter is its gradient (Khan & Rue, Sec. 2: gradients with
respect to μ are natural gradients, Eq. 58's λ̃), taken by autodiff through
the rule. A factor that reads held coordinates only (the prior of tau, with
its log-Jacobian) is the same rule with no c. Everything is deterministic, so
the fit gets ρ = 1 with the ELBO guard and converges in tens of steps; the
only approximation is the Gauss-Hermite rule in u (exact for polynomials of
degree < 2n per coordinate, n = ``HELD_POINTS[dim]``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from numpyro.distributions.transforms import IdentityTransform

from blrppl.compile_mode import probe
from blrppl.estimators.base import FactorEstimator, Method, factor_log_density, var_info
from blrppl.estimators.cubature import MAX_CUBATURE_DIM
from blrppl.estimators.nonconjugate import refuse_minibatch
from blrppl.estimators.quadrature import hermite_rule
from blrppl.families.common import outer, symmetrize
from blrppl.families.mvn import MVNStats
from blrppl.graph import tape
from blrppl.graph.blocks import as_blocks
from blrppl.graph.families import variable_q
from blrppl.graph.nodes import FactorGraph
from blrppl.symbolic.analysis import analyse
from blrppl.symbolic.canonical import Unsupported
from blrppl.symbolic.compiled import stats_needed
from blrppl.symbolic.expectation import POINT, VarInfo, expected_value
from blrppl.symbolic.statistics import point_stats
from blrppl.symbolic.terms import NonConjugate

HELD_POINTS = {1: 32, 2: 16, 3: 8, 4: 6}
"""Gauss-Hermite nodes per held coordinate, by the number of held coordinates."""
MAX_HELD_DIM = max(HELD_POINTS)
"""The most held (non-conjugate) scalars a block factor may read."""


def block_hybrid_estimator(
    graph: FactorGraph,
    factor: str,
    qs: Mapping[str, Any],
    examples: Mapping[str, Any],
) -> FactorEstimator:
    """Build the estimator (module docstring) for a factor on one joint block.

    Raises:
      NonConjugate: when the factor does not touch exactly one joint block
        larger than ``MAX_CUBATURE_DIM`` scalars (smaller blocks take the
        cubature), reads no held coordinate or more than ``MAX_HELD_DIM`` of
        them, or is not conjugate in the rest given the held ones.
    """
    node = graph.factors[factor]
    if len(node.neighbours) != 1 or node.param_neighbours:
        raise NonConjugate(None, "not a factor of one joint block alone")
    (block,) = node.neighbours
    q = qs[block]
    members = graph.variables[block].members
    if not q.joint or not members or math.prod(q.shape) <= MAX_CUBATURE_DIM:
        raise NonConjugate(block, "not a joint block beyond the cubature's dimension")
    transform = q.transform
    fixed = {k: x for k, x in examples.items() if k != block}
    log_density = factor_log_density(graph, factor, {block: transform}, fixed, use_canonical=False)
    pieces = {m.name: (m, t, shape, offset, size) for m, t, shape, offset, size in transform.pieces()}
    if node.block_members:  # the members the factor's code depends on, from the trace
        read = [s for s in pieces if s in node.block_members]
    else:
        read = _read_members(lambda flat: log_density({block: flat}, {}), jnp.asarray(examples[block], float), pieces)
    held = [s for s in read if not isinstance(pieces[s][1], IdentityTransform)]
    rest = [s for s in read if s not in held]
    held_dim = sum(pieces[s][4] for s in held)
    if not held or held_dim > MAX_HELD_DIM:
        raise NonConjugate(block, f"reads {held_dim} transformed scalars (1 to {MAX_HELD_DIM} are integrated)")
    held_index = np.concatenate([np.arange(pieces[s][3], pieces[s][3] + pieces[s][4]) for s in held])
    nodes, weights = hermite_rule(HELD_POINTS[held_dim], held_dim)

    def held_values(u):
        out, start = {}, 0
        for s in held:
            _, t, shape, _, size = pieces[s]
            out[s] = t(jnp.reshape(u[start : start + size], shape))
            start += size
        return out

    if not rest:
        def conditional_value(stats, analysis):
            del analysis
            m, cov = _moments(stats)
            scale = jnp.linalg.cholesky(cov[np.ix_(held_index, held_index)])
            points = m[held_index] + jnp.asarray(nodes, m.dtype) @ scale.T
            return jnp.asarray(weights, m.dtype) @ jax.vmap(
                lambda u: log_density({block: m.at[held_index].set(u)}, {})
            )(points)

        terms = None
    else:
        conditional_value, terms = _conditional(graph, factor, block, examples, pieces, held, rest, held_index,
                                                held_values, nodes, weights)

    def estimate(rng_key, mean, params, arrays, batch=None):
        del rng_key, params
        refuse_minibatch(factor, batch)
        analysis = None if terms is None else arrays.factors[factor]
        value, grad = jax.value_and_grad(conditional_value)(mean[block], analysis)
        return value, {block: MVNStats(x=grad.x, xxT=symmetrize(grad.xxT))}

    return FactorEstimator(factor, (block,), Method((), (block,), "quadrature"), estimate, terms)


def _conditional(graph, factor, block, examples, pieces, held, rest, held_index, held_values, nodes, weights):
    """E over u of the exact expectation over c | u (module docstring): ``(value_fn, analysis)``."""
    rest_index = np.concatenate([np.arange(pieces[s][3], pieces[s][3] + pieces[s][4]) for s in rest])
    members = {name: piece[0] for name, piece in pieces.items()}
    example_values = probe(graph.variables[block].transform)(np.asarray(examples[block], float))
    variables = {k: v for k, v in graph.variables.items() if k != block}
    variables.update(members)
    node = dataclasses.replace(graph.factors[factor], neighbours=tuple(rest) + tuple(held))
    split = dataclasses.replace(graph, variables=variables, factors={**graph.factors, factor: node})
    split = as_blocks(split, [tuple(rest)])
    rest_name = "+".join(rest)
    rest_q = variable_q(split.variables[rest_name], split.plates)
    fixed = {k: x for k, x in examples.items() if k != block}
    fixed.update({s: example_values[s] for s in pieces if s not in held and s not in rest})
    log_factor = factor_log_density(split, factor, {rest_name: rest_q.transform}, fixed, per_site=True)
    infos = {rest_name: var_info(rest_q)}
    infos.update({s: VarInfo(POINT, tuple(jnp.shape(example_values[s])), 0) for s in held})
    start_values = {rest_name: rest_q.transform.inv(example_values), **{s: example_values[s] for s in held}}
    try:
        # The data as the recording's inputs (those the model needs as values as constants), so a
        # refit on new data replays the analysis (:mod:`blrppl.blr.replan`).
        terms = analyse(
            lambda values, data=None: log_factor(values, {}, data), start_values, infos,
            data=tape.data_inputs(graph.data.arrays, lambda: graph.held_data),
        )
    except Unsupported as error:
        raise NonConjugate(block, str(error)) from None
    needed = {s: stats_needed(terms.terms, s) for s in held}

    def value(stats, analysis):
        m, cov = _moments(stats)
        scale = jnp.linalg.cholesky(cov[np.ix_(held_index, held_index)])
        cross = cov[np.ix_(rest_index, held_index)]
        gain = solve_triangular(scale, cross.T, lower=True).T  # Σ_cu L⁻ᵀ
        cond_cov = cov[np.ix_(rest_index, rest_index)] - gain @ gain.T

        def at(z):
            u = m[held_index] + scale @ z
            loc = m[rest_index] + gain @ z
            layout = rest_q.to_value_layout(MVNStats(x=loc, xxT=cond_cov + outer(loc)))
            points = {s: point_stats(x, needed[s]) for s, x in held_values(u).items()}
            return expected_value(analysis, {rest_name: layout, **points}, None)

        return jnp.asarray(weights, m.dtype) @ jax.vmap(at)(jnp.asarray(nodes, m.dtype))

    return value, terms


def _moments(stats: MVNStats):
    return stats.x, symmetrize(stats.xxT - outer(stats.x))


def _read_members(log_f, flat, pieces) -> list[str]:
    """The members whose coordinates the factor reads (gradient probes at two random points)."""
    rng = np.random.default_rng(0)
    grad = probe(jax.grad(log_f))
    touched = np.zeros(flat.shape, bool)
    for _ in range(2):
        point = (np.asarray(flat) + 0.3 * rng.normal(size=flat.shape)).astype(flat.dtype)
        touched |= np.asarray(grad(point)) != 0.0
    return [s for s, (_, _, _, offset, size) in pieces.items() if touched[offset : offset + size].any()]
