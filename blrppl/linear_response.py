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

import functools
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
from blrppl import sparse_hessian
from blrppl.compile_mode import jit_for, to_device, to_host
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
    plate, is not checked; nor is an exact factor on one scalar Gaussian variable and others, such
    as a Normal likelihood of a mean and a Gamma precision, whose posterior correlation vanishes at
    the mean; a Gaussian with several elements there, a joint block of plated random effects beside
    their Gamma precision, is checked: the correlation vanishes in the sum, not element by element). Gaussian q are read on their own space; Gamma, Beta and Dirichlet q on
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
    sizes = {e.name: e.size for e in entries}
    coupled = any(
        len(covered.intersection(est.neighbours)) >= 2
        and (
            est.method.estimated
            or len(gaussian.intersection(est.neighbours)) >= 2
            or any(sizes[v] > 1 for v in gaussian.intersection(est.neighbours))
        )
        for est in plan.estimators
    )
    return entries if coupled else None


def checked_sites(plan: Any) -> tuple[str, ...]:
    """The Gaussian latents a check of ``plan`` reads (empty where it does not apply)."""
    entries = _blocks(plan)
    return () if entries is None else tuple(e.name for e in entries if e.bijection is None)


class Pending(NamedTuple):
    """A dispatched check (:func:`dispatch`): read it with :meth:`read`.

    ``agrees``: whether a Hessian rebuilt from few products passed its probe (else :meth:`read`
    runs the full reading); ``pattern``: ``(finite, entries that the code can make nonzero)``,
    where the check is learning them (else None).
    """

    check: Any
    args: tuple
    definite: jax.Array
    ratios: jax.Array
    agrees: jax.Array
    pattern: Any = None
    compressed: bool = False  # read from few products (else in full: nothing to fall back to)

    def read(self) -> Optional[SpreadLeftOut]:
        """The check's reading on the host (None where the full reading a miss calls for failed)."""
        definite, ratios, agrees = to_host((self.definite, self.ratios, self.agrees))
        if self.compressed and not bool(agrees):  # a nonzero the learnt pattern did not have
            try:
                return self.check.missed(self.args).read()
            except Exception:  # noqa: BLE001 - as dispatch: no check rather than a failed fit
                return None
        if self.pattern is not None:
            finite, pattern = to_host(self.pattern)
            if finite:  # (a Hessian that is not finite shows no pattern: learnt at a later fit)
                self.check.learn(np.asarray(pattern))
        return SpreadLeftOut(dict(zip(self.check.names, np.asarray(ratios).tolist())), bool(definite))


def prepare(plan: Any) -> None:
    """Trace the check's program for ``plan`` (where it applies) and compile it in a thread, beside
    the fit's own compilation: a first fit then waits for none of it. Once per plan signature."""
    _check(plan)


def dispatch(plan: Any, natural: dict, params: dict) -> Optional[Pending]:
    """Start the check of a mean-field fit's q (module docstring) on the device, or None where it
    does not apply (see :func:`_blocks`). One compiled program per plan signature; dispatched
    before the host's other checks of the fit, it runs while they do."""
    check = _check(plan)
    if check is None:
        return None
    try:
        return check((natural, dict(params), model_data(plan)))
    except Exception:  # noqa: BLE001 - model code that cannot take q's mean as a point: no check
        return None


SPARSE_WORTH = 0.5
"""A learnt pattern is used where its products are at most this fraction of the full Hessian's passes."""

MAX_RELEARNED = 2
"""Patterns learnt again after a probe disagreed, before a check keeps to the full reading."""


class Reading(NamedTuple):
    """How the check's program reads the Hessian: arguments, so that one compiled program reads it
    in full (a first fit, where it also learns its pattern) and from a few products (refits).

    The program pushes the first ``count`` columns of ``seeds`` (D x (2D + 1)) through Hessian-vector
    products into a buffer of 2D + 2 columns (the last stays 0) and reads entry (i, j) of the
    Hessian at ``(source_rows, source_cols)[i, j]`` of it where ``listed``; column ``probe_at`` of
    ``seeds`` is :func:`~blrppl.sparse_hessian.probe`'s direction, whose product checks the
    rebuilt Hessian. In full, the columns are the identity, the probe, and (where learning) the
    identity's NaN tangents (:func:`~blrppl.sparse_hessian.reach`).
    """

    seeds: Any
    count: Any
    source_rows: Any
    source_cols: Any
    listed: Any
    probe_at: Any

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def full(dim: int, dtype: Any, learn: bool) -> "Reading":
        """The full reading (on the device, made once per size, dtype and ``learn``)."""
        eye = np.eye(dim, dtype=dtype)
        seeds = np.concatenate([eye, sparse_hessian.probe(dim, dtype)[:, None], np.where(eye, np.nan, 0).astype(dtype)], axis=1)
        rows, cols = np.indices((dim, dim))
        count = 2 * dim + 1 if learn else dim + 1
        return Reading(seeds, np.int32(count), rows, cols, np.ones((dim, dim), bool), np.int32(dim))._on_device()

    @staticmethod
    def compressed(compression: sparse_hessian.Compression, dtype: Any) -> "Reading":
        dim, products = compression.seeds.shape
        seeds = np.zeros((dim, 2 * dim + 1), dtype)
        seeds[:, :products] = compression.seeds
        seeds[:, products] = sparse_hessian.probe(dim, dtype)
        return Reading(
            seeds, np.int32(products + 1), compression.source_rows, compression.source_cols, compression.listed,
            np.int32(products),
        )._on_device()

    def _on_device(self) -> "Reading":
        return Reading(*(to_device(np.asarray(a)) for a in self))


class _Check:
    """The check's program for one plan signature (:func:`_program`), and how it reads the Hessian.

    A first fit reads it in full (D passes), and learns which entries the model's code can make
    nonzero (D more). Where a few products would rebuild it (:mod:`blrppl.sparse_hessian`: a
    hierarchical model's effects meet only their own rows and the hyperparameters'), later fits
    (refits on new data) read it so, with the same compiled program: radon's 89 passes become 5.
    A probe guards the pattern: where it disagrees (new data making a nonzero the first data did
    not have: a pair of crossed effects seen together for the first time), the full reading
    answers and the pattern is learnt again with that entry.
    """

    def __init__(self, plan: Any, entries: list):
        self.names = tuple(e.name for e in entries)
        self._program = jit_for(plan.arrays, _program(plan, entries), one_shot=True)
        self._dim = sum(e.size for e in entries)
        self._dtype = np.dtype(jnp.result_type(float))
        self._pattern = None
        self._sparse: Optional[Reading] = None
        self._learnt = False  # a pattern was learnt (or is no use): only a miss learns again
        self._relearned = 0
        self._ahead = None
        natural = natural_shapes(plan)
        if natural is not None:  # else traced at the first check, from its values
            args = (natural, dict(plan.arrays.params), model_data(plan), Reading.full(self._dim, self._dtype, True))
            self._ahead = CompiledInBackground(lambda: self._program.lower(*args))  # when idle (ahead.idle_time)

    def __call__(self, args: tuple) -> Pending:
        if self._sparse is not None:
            return self._run(args, self._sparse, learn=False)._replace(compressed=True)
        return self._run(args, Reading.full(self._dim, self._dtype, not self._learnt), learn=not self._learnt)

    def _run(self, args: tuple, reading: Reading, learn: bool) -> Pending:
        outputs = None
        if self._ahead is not None:
            try:
                outputs = self._ahead(*args, reading)
            except (TypeError, ValueError):  # other argument types than foreseen: the plain call
                pass
        definite, ratios, agrees, pattern = self._program(*args, reading) if outputs is None else outputs
        return Pending(self, args, definite, ratios, agrees, pattern if learn else None)

    def missed(self, args: tuple) -> Pending:
        """The full reading, where the rebuilt Hessian's probe disagreed: a nonzero the pattern did
        not have, added to it (up to ``MAX_RELEARNED`` times; then the full reading stays)."""
        self._sparse = None
        self._relearned += 1
        self._learnt = self._relearned > MAX_RELEARNED
        return self._run(args, Reading.full(self._dim, self._dtype, not self._learnt), learn=not self._learnt)

    def learn(self, pattern: np.ndarray) -> None:
        """Read later Hessians from few products where ``pattern`` (with the entries learnt before)
        allows at most ``SPARSE_WORTH`` of the full reading's passes."""
        self._learnt = True
        self._pattern = pattern if self._pattern is None else self._pattern | pattern
        try:
            compression = sparse_hessian.compression(self._pattern)
            if compression.num_products + 1 <= SPARSE_WORTH * self._dim:
                self._sparse = Reading.compressed(compression, self._dtype)
        except Exception:  # noqa: BLE001 - the full reading stays
            self._sparse = None


def _check(plan: Any) -> Optional[_Check]:
    """The check of plans of ``plan``'s signature, or None where it does not apply (made once)."""

    def build() -> Optional[_Check]:
        entries = _blocks(plan)
        if entries is None:
            return None
        try:
            return _Check(plan, entries)
        except Exception:  # noqa: BLE001 - model code that cannot take q's mean as a point: no check
            return None

    return compiled_for(plan, ("linear_response",), build, by_signature=True)


def spread_left_out(plan: Any, natural: dict, params: dict) -> Optional[SpreadLeftOut]:
    """Linear response at q's mean for a mean-field fit (module docstring), or None where the
    check does not apply (see :func:`_blocks`)."""
    pending = dispatch(plan, natural, params)
    return None if pending is None else pending.read()


def natural_shapes(plan: Any) -> Optional[dict]:
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
    """``(natural, params, data, reading) -> (definite, ratios, agrees, (finite, pattern))``: the
    Hessian of log p over the covered variables' flat unconstrained values at q's mean (every other
    q at its mean, a point in its family's layout; the bijections' log-Jacobians included), read as
    ``reading`` says (:class:`Reading`: one Hessian-vector product per column pushed, in a loop
    whose length is an argument), :func:`_ratios` of it, whether the probe agreed, and the entries
    the code can make nonzero (meaningful where the reading learns them)."""

    def point_of(natural: dict) -> dict:
        with validation_enabled(False):  # numpyro's checks evaluate eagerly, compiling op by op
            return {v: q.family.to_numpyro(natural[v]).mean for v, q in plan.qs.items()}

    def program(natural: dict, params: dict, data: Any, reading: Reading) -> tuple:
        point = point_of(natural)
        start = [point[e.name] if e.bijection is None else e.bijection.inv(point[e.name]) for e in entries]
        u = jnp.concatenate([jnp.ravel(x) for x in start])

        def log_joint(u: jax.Array) -> jax.Array:
            moved, offset, log_det = dict(point), 0, 0.0
            for e, x0 in zip(entries, start):
                value = jnp.reshape(u[offset : offset + e.size], jnp.shape(x0))
                if e.bijection is not None:
                    x = e.bijection(value)
                    log_det = log_det + jnp.sum(e.bijection.log_abs_det_jacobian(value, x))
                    value = x
                moved[e.name] = value
                offset += e.size
            return log_joint_in_q_space(plan, moved, params, data, with_magnitude=False)[0] + log_det

        gradient = jax.grad(log_joint)
        seeds = jnp.asarray(reading.seeds, u.dtype)

        def push(k: jax.Array, buffer: jax.Array) -> jax.Array:
            return buffer.at[:, k].set(jax.jvp(gradient, (u,), (seeds[:, k],))[1])

        dim = u.shape[0]
        buffer = jax.lax.fori_loop(0, reading.count, push, jnp.zeros((dim, 2 * dim + 2), u.dtype))
        hessian = jnp.where(reading.listed, buffer[reading.source_rows, reading.source_cols], 0.0)
        # Where a product is not finite, neither is the full Hessian: not definite either way.
        # (Columns past ``count`` hold zeros; the full reading's NaN tangents come after the probe.)
        finite = jnp.all(jnp.isfinite(buffer[:, : dim + 1]))
        agrees = ~finite | sparse_hessian.agrees(hessian, seeds[:, reading.probe_at], buffer[:, reading.probe_at])
        definite, ratios = _ratios(hessian, entries)
        pattern = jnp.isnan(buffer[:, dim + 1 : 2 * dim + 1]) | (hessian != 0)
        return definite & finite, ratios, agrees, (finite, pattern)

    return program


def _ratios(hessian: jax.Array, entries: list) -> tuple:
    """``(definite, ratios)``: with P = -∇² log p, its Cholesky factor (NaN where not positive
    definite) and per variable the largest ratio of marginal to block-conditional sd."""
    precision = -0.5 * (hessian + hessian.T)
    chol = jnp.linalg.cholesky(precision)  # NaN where not positive definite
    definite = jnp.all(jnp.isfinite(chol))
    whitened = solve_triangular(chol, jnp.eye(precision.shape[0], dtype=precision.dtype), lower=True)
    joint = jnp.sum(whitened**2, axis=0)  # diag(P⁻¹)
    ratios, offset = [], 0
    for e in entries:
        if e.block == 1:
            conditional = 1.0 / jnp.diagonal(precision)[offset : offset + e.size]
        else:
            index = offset + np.arange(e.size).reshape(-1, e.block)
            blocks = precision[index[:, :, None], index[:, None, :]]  # (size / block, block, block)
            conditional = jnp.ravel(jnp.diagonal(jnp.linalg.inv(blocks), axis1=-2, axis2=-1))
        ratio = jnp.sqrt(jnp.maximum(joint[offset : offset + e.size] / conditional, 1.0))
        ratios.append(jnp.max(ratio))
        offset += e.size
    return definite, jnp.stack(ratios)


UNCHECKED_FLAG = "the spread of mean-field q could not be checked by linear response: "
"""How the flag of a check that found no Gaussian reading at q's mean begins."""


def understated_spread_flag(found: Optional[SpreadLeftOut]) -> tuple[str, ...]:
    """A flag where mean-field q's sd is :data:`UNDERSTATED_SD` or more times too small by
    linear response (module docstring), or where the check could not be made (-∇² log p at
    q's mean not positive definite: numpyro's baseball example with a logit link, whose
    mean-field sds of the population location and scale are half of NUTS's); else ``()``."""
    if found is None:
        return ()
    if not found.definite:
        return (
            f"{UNCHECKED_FLAG}the log density's curvature at q's mean is not positive definite "
            f"(over {sorted(found.ratio)[:4]}), so how much the correlation that mean-field leaves out "
            "widens their posterior is unknown; mean-field sds of coupled latents (a hierarchy's "
            "location and scale) can be several times too small: compare with "
            "NonConjugateVI(model, blocks='all') or MCMC",
        )
    shown = listed_ratios(found.ratio, UNDERSTATED_SD)
    if shown is None:
        return ()
    return (
        f"{FLAG}{shown}: linear response at q's mean "
        "puts their standard deviation about that many times higher once the correlation between q "
        "blocks that mean-field leaves out is kept (a Gaussian reading of the curvature: for scales "
        "of random effects it can overstate the factor; the means are usually fine); fit the coupled "
        "latents in one full Gaussian for their spread: NonConjugateVI(model, blocks='all') "
        "(python -m blrppl fit refits so by itself; blrppl.choosing.jointly gives that engine and "
        "plan)",
    )


def listed_ratios(ratios: dict, threshold: float) -> Optional[str]:
    """``"'a' (3.1x), 'b' (1.6x)"``: the names whose ratio is ``threshold`` or more, largest first
    (four, then how many more), or None where none is."""
    worst = {v: r for v, r in ratios.items() if r >= threshold}
    if not worst:
        return None
    ordered = sorted(worst, key=worst.get, reverse=True)
    more = f" and {len(ordered) - 4} more" if len(ordered) > 4 else ""
    return ", ".join(f"{v!r} ({worst[v]:.1f}x)" for v in ordered[:4]) + more


def understated(result: Any) -> bool:
    """Whether ``result`` (a :class:`~blrppl.results.BLRResult`) carries the flag of
    :func:`understated_spread_flag`."""
    return any(flag.startswith(FLAG) for flag in result.flags)
