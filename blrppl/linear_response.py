"""How much spread mean-field q leaves out: linear response at q's mean.

Mean-field q factorises over blocks. Where the posterior couples blocks
strongly (a global mean and the crossed random effects that all shift with
it), each block's q is the posterior's *conditional* given the others, and
its spread is about the conditional's: much narrower than the marginal's
(mean-field's optimum of the ELBO, Khan & Rue Sec. 5.3, with the correlation
between blocks outside the family). The fit then looks converged and
confident, and its uncertainty is wrong.

Linear response (Giordano, Broderick & Jordan 2018) measures it from the
curvature of the log joint. With P = -∇² log p(u) at q's mean, over every
Gaussian block u_b (q's unconstrained space), a Gaussian with precision P
has marginal variances diag(P⁻¹), and a mean-field fit of it has variances
diag((P_bb)⁻¹) per block: the ratio

    r_i = sqrt([P⁻¹]_ii · [(P_bb)⁻¹]⁻¹_ii)  >= 1

is how many times too small mean-field's standard deviation of coordinate i
is (exact where log p is quadratic, as in a linear mixed model given its
scales). :func:`spread_left_out` computes it after a fit (one compiled
Hessian per plan signature, only where the Gaussian latents are few and
some factor couples two of their blocks); :func:`understated_spread_flag`
turns a ratio above :data:`UNDERSTATED_SD` into a flag on the result that
names the sites and the remedy (a joint Gaussian block).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints
from numpyro.distributions.distribution import validation_enabled
from numpyro.distributions.transforms import biject_to

from blrppl.blr.ahead import CompiledInBackground
from blrppl.blr.starts import prior_member
from blrppl.compile_mode import jit_for
from blrppl.diagnostics import log_joint_in_q_space
from blrppl.draws import compiled_for, model_data

MAX_DIM = 256
"""The most Gaussian scalars whose joint curvature a fit checks (a D x D Hessian: D passes)."""

MAX_WORK = 1e7
"""The most D x (elements of the model's data) a check takes: D passes over the data each."""

UNDERSTATED_SD = 1.5
"""A mean-field sd this many times smaller than linear response's is flagged."""

FLAG = "mean-field q understates the posterior spread of "
"""How the flag of :func:`understated_spread_flag` begins (:func:`understated` looks for it)."""


class SpreadLeftOut(NamedTuple):
    """Linear response's view of a mean-field fit (module docstring), on the host.

    Attributes:
      ratio: variable -> the largest r_i over its elements (>= 1): how many times linear
        response's marginal sd exceeds the block-conditional (mean-field) one.
      definite: whether -∇² log p at q's mean was positive definite (else ``ratio`` means
        nothing: no Gaussian approximation there to compare with).
    """

    ratio: dict
    definite: bool


#: Supports of non-Gaussian q whose curvature a check reads on an unconstrained space
#: (numpyro's bijection: log, logit, stick-breaking), as a Gaussian q on that space would be.
_UNCONSTRAINED = (constraints.positive, constraints.unit_interval, constraints.simplex)


class _Entry(NamedTuple):
    """One variable a check covers: ``size`` unconstrained scalars in blocks of ``block``;
    ``bijection``: from its unconstrained space to q's (None: q is Gaussian there already)."""

    name: str
    size: int
    block: int
    bijection: Any = None


def _blocks(plan: Any) -> Optional[list]:
    """The :class:`_Entry` of each continuous q a check covers, or None where it does not apply:
    discrete or chain q, minibatches, missing data integrated out, data the model needs as values,
    too many scalars (or passes over too much data), or no factor on two covered variables (a
    factor that couples the elements of one plated variable alone, a random walk written with a
    plate, is not checked; nor is an exact factor on one Gaussian variable and others, such as a
    Normal likelihood of a mean and a Gamma precision, whose posterior correlation vanishes at the
    mean). Gaussian q are read on their own space; Gamma, Beta and Dirichlet q on
    their support's unconstrained one (where mean-field drops the correlation of a Gamma-Poisson's
    shape and rate, say); others (Wishart) are held at their mean."""
    if plan.subsample is not None or plan.imputed or plan.orphans or plan.data_static:
        return None
    entries = []
    for v, q in plan.qs.items():
        family, node = q.family, plan.graph.variables.get(v)
        if family.chain or family.index_valued or q.num_categories or (node is not None and node.discrete):
            return None
        if family.gaussian:
            block = math.prod(q.block_shape) if family.event_ndim == 1 else 1
            entries.append(_Entry(v, math.prod(q.shape), block))
        elif any(family.support is support for support in _UNCONSTRAINED) and not q.joint:
            block = q.shape[-1] - 1 if family.support is constraints.simplex else 1
            if block < 1:
                continue
            size = math.prod(q.shape) // (q.shape[-1] if family.support is constraints.simplex else 1) * block
            entries.append(_Entry(v, size, block, biject_to(family.support)))
    dim = sum(e.size for e in entries)
    if not entries or dim > MAX_DIM or dim * sum(np.size(a) for a in plan.arrays.data) > MAX_WORK:
        return None
    covered = {e.name for e in entries}
    gaussian = {e.name for e in entries if e.bijection is None}
    coupled = any(
        len(covered.intersection(est.neighbours)) >= 2
        and (est.method.estimated or len(gaussian.intersection(est.neighbours)) >= 2)
        for est in plan.estimators
    )
    return entries if coupled else None


def checked_sites(plan: Any) -> tuple[str, ...]:
    """The Gaussian latents a check of ``plan`` reads (empty where it does not apply)."""
    entries = _blocks(plan)
    return () if entries is None else tuple(e.name for e in entries if e.bijection is None)


class Pending(NamedTuple):
    """A dispatched check (:func:`dispatch`): read it with :meth:`read`."""

    names: tuple
    definite: jax.Array
    ratios: jax.Array

    def read(self) -> SpreadLeftOut:
        definite, ratios = jax.device_get((self.definite, self.ratios))
        return SpreadLeftOut(dict(zip(self.names, np.asarray(ratios).tolist())), bool(definite))


def prepare(plan: Any) -> None:
    """Trace the check's program for ``plan`` (where it applies) and compile it in a thread, beside
    the fit's own compilation: a first fit then waits for none of it. Once per plan signature."""
    _check(plan)


def dispatch(plan: Any, natural: dict, params: dict) -> Optional[Pending]:
    """Start the check of a mean-field fit's q (module docstring) on the device, or None where it
    does not apply (see :func:`_blocks`). One compiled program per plan signature; dispatched
    before the host's other checks of the fit, it runs while they do."""
    check = _check(plan)
    if check is None or check.program is None:
        return None
    try:
        definite, ratios = check(natural, dict(params), model_data(plan))
    except Exception:  # noqa: BLE001 - model code that cannot take q's mean as a point: no check
        return None
    return Pending(check.names, definite, ratios)


class _Check(NamedTuple):
    names: tuple
    program: Any
    ahead: Any  # the program compiled in a thread for the plan's argument types (or None)

    def __call__(self, *args: Any) -> tuple:
        if self.ahead is not None:
            try:
                return self.ahead(*args)
            except (TypeError, ValueError):  # other argument types than foreseen: the plain call
                pass
        return self.program(*args)


def _check(plan: Any) -> Optional[_Check]:
    entries = _blocks(plan)
    if entries is None:
        return None

    def build() -> _Check:
        program = jit_for(plan.arrays, _program(plan, entries), one_shot=True)
        names = tuple(e.name for e in entries)
        natural = _natural_shapes(plan)
        if natural is None:  # no member to read its shapes from: traced at the first check
            return _Check(names, program, None)
        try:
            lowered = program.lower(natural, dict(plan.arrays.params), model_data(plan))
        except Exception:  # noqa: BLE001 - model code that cannot take q's mean as a point: no check
            return _Check(names, None, None)
        return _Check(names, program, CompiledInBackground(lowered))

    return compiled_for(plan, ("linear_response",), build, by_signature=True)


def spread_left_out(plan: Any, natural: dict, params: dict) -> Optional[SpreadLeftOut]:
    """Linear response at q's mean for a mean-field fit (module docstring), or None where the
    check does not apply (see :func:`_blocks`)."""
    pending = dispatch(plan, natural, params)
    return None if pending is None else pending.read()


def _natural_shapes(plan: Any) -> Optional[dict]:
    """The shapes and dtypes of the fit's λ, from each family's example member or from the
    variable's prior in q's family (abstractly: nothing runs), or None where neither gives them."""
    shapes = {}
    for v, q in plan.qs.items():
        node = plan.graph.variables.get(v)
        try:
            shapes[v] = jax.eval_shape(q.example_natural)
        except ValueError:  # a family without an example member (Gamma, Beta)
            if node is None or node.prior is None:
                return None
            try:
                shapes[v] = jax.eval_shape(lambda prior, q=q: prior_member(q, prior), node.prior)
            except Exception:  # noqa: BLE001 - a prior its family reads by value (Uniform(0, 1))
                return None
    return shapes


def _program(plan: Any, entries: list):
    """``(natural, params, data) -> (definite, ratios)``: -∇² log p over the covered variables'
    flat unconstrained values at q's mean (every other q at its mean, a point in its family's
    layout; the bijections' log-Jacobians included), its Cholesky factor, and per variable the
    largest ratio of marginal to block-conditional sd."""

    def program(natural: dict, params: dict, data: Any) -> tuple:
        with validation_enabled(False):  # numpyro's checks evaluate eagerly, compiling op by op
            point = {v: q.family.to_numpyro(natural[v]).mean for v, q in plan.qs.items()}
        start = {e.name: point[e.name] if e.bijection is None else e.bijection.inv(point[e.name]) for e in entries}
        flat = jnp.concatenate([jnp.ravel(start[e.name]) for e in entries])

        def log_joint(u: jax.Array) -> jax.Array:
            moved, offset, log_det = dict(point), 0, 0.0
            for e in entries:
                value = jnp.reshape(u[offset : offset + e.size], jnp.shape(start[e.name]))
                if e.bijection is not None:
                    x = e.bijection(value)
                    log_det = log_det + jnp.sum(e.bijection.log_abs_det_jacobian(value, x))
                    value = x
                moved[e.name] = value
                offset += e.size
            return log_joint_in_q_space(plan, moved, params, data, with_magnitude=False)[0] + log_det

        hessian = jax.hessian(log_joint)(flat)
        precision = -0.5 * (hessian + hessian.T)
        chol = jnp.linalg.cholesky(precision)  # NaN where not positive definite
        definite = jnp.all(jnp.isfinite(chol))
        whitened = solve_triangular(chol, jnp.eye(flat.shape[0], dtype=flat.dtype), lower=True)
        joint = jnp.sum(whitened**2, axis=0)  # diag(P⁻¹)
        ratios, offset = [], 0
        for e in entries:
            index = offset + np.arange(e.size).reshape(-1, e.block)
            blocks = precision[index[:, :, None], index[:, None, :]]  # (size / block, block, block)
            conditional = jnp.ravel(jnp.diagonal(jnp.linalg.inv(blocks), axis1=-2, axis2=-1))
            ratio = jnp.sqrt(jnp.maximum(joint[offset : offset + e.size] / conditional, 1.0))
            ratios.append(jnp.max(ratio))
            offset += e.size
        return definite, jnp.stack(ratios)

    return program


def understated_spread_flag(found: Optional[SpreadLeftOut]) -> tuple[str, ...]:
    """A flag where mean-field q's sd is :data:`UNDERSTATED_SD` or more times too small by
    linear response (module docstring); else ``()``."""
    if found is None or not found.definite:
        return ()
    worst = {v: r for v, r in found.ratio.items() if r >= UNDERSTATED_SD}
    if not worst:
        return ()
    ordered = sorted(worst, key=worst.get, reverse=True)
    shown = ", ".join(f"{v!r} ({worst[v]:.1f}x)" for v in ordered[:4])
    more = f" and {len(ordered) - 4} more" if len(ordered) > 4 else ""
    return (
        f"{FLAG}{shown}{more}: linear response at q's mean "
        "puts their standard deviation about that many times higher once the correlation between q "
        "blocks that mean-field leaves out is kept (a Gaussian reading of the curvature: for scales "
        "of random effects it can overstate the factor; the means are usually fine); fit the coupled "
        "latents in one full Gaussian for their spread: NonConjugateVI(model, blocks='all') "
        "(python -m blrppl fit refits so by itself; blrppl.choosing.jointly gives that engine and "
        "plan)",
    )


def understated(result: Any) -> bool:
    """Whether ``result`` (a :class:`~blrppl.results.BLRResult`) carries the flag of
    :func:`understated_spread_flag`."""
    return any(flag.startswith(FLAG) for flag in result.flags)
