"""Expectations of symbolic log factors under a mean-field q.

A scalar :class:`Poly` (a log factor summed over its plates) is compiled once
into a list of :class:`StatTerm`: a coefficient, one pre-contracted constant
operand (the data's sufficient statistics: ``sum(y**2)``, ``X.T @ X``, per-group
sums, ...) and reads of the variables' mean parameters. Evaluating it is then
a few einsums over mean parameters, so ``E_q[log f]`` is affine in each
variable's mean parameters and ``jax.grad`` of it with respect to them is the
exact site parameter (Khan & Rue, Eq. 54 and Sec. 5.1).

Mean parameters are given in *value layout*: for a variable of shape
``batch + block`` (``block``: the axes q keeps a full covariance over),

- Gaussian: ``x`` (shape ``batch + block``) and ``xx`` (``batch + block + block``,
  ``E[x x^T]`` within a block; ``E[x^2]`` when the block is scalar),
- Gamma: ``x``, ``log_x``; InverseGamma: ``inv_x``, ``log_x``;
  Beta: ``log_x``, ``log1m_x``; Dirichlet: ``log_x``; Bernoulli: ``x``;
  Categorical: ``one_hot`` (shape ``value + (K,)``); Wishart: ``x``, ``log_det_x``;
  chain Gaussian: ``x``, ``xx``, ``x_next`` (lag one); chain Categorical:
  ``one_hot`` (T, K) and ``pair`` (T-1, K, K), the marginals and neighbouring
  pairwise marginals of a discrete chain.

Under mean-field, q factorises over variables and over the batch positions
of each variable, so the expectation of a product of reads is the product of
expectations, except where two reads of one variable may land on the same
position; those pairs are resolved here (``E[x_i x_j]`` within a block,
``one_hot_k one_hot_l = delta_kl one_hot_k``), or rejected as non-conjugate.
"""

from __future__ import annotations

import dataclasses
import string
from fractions import Fraction
from typing import Mapping, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from blrppl.symbolic.algebra import normalize_term, push_selectors
from blrppl.symbolic.terms import (
    Index,
    Labels,
    NonConjugate,
    Operand,
    Poly,
    Substitution,
    Term,
    VarAtom,
    substitute_term,
)

GAUSSIAN = "gaussian"
POINT = "point"
CHAIN = "chain_gaussian"
CHAIN_CATEGORICAL = "chain_categorical"

# (family kind, atom kind, power) -> statistic name, for single reads.
_STATS = {
    ("gamma", "x", 1): "x",
    ("gamma", "log", 1): "log_x",
    ("inverse_gamma", "x", -1): "inv_x",
    ("inverse_gamma", "log", 1): "log_x",
    ("beta", "log", 1): "log_x",
    ("beta", "log1m", 1): "log1m_x",
    ("dirichlet", "log", 1): "log_x",
    ("wishart", "x", 1): "x",
    ("wishart", "logdet", 1): "log_det_x",
    ("categorical", "one_hot", 1): "one_hot",
    (GAUSSIAN, "x", 1): "x",
}


@dataclasses.dataclass(frozen=True)
class VarInfo:
    """What the expectation needs to know about a variable's q.

    ``kind``: ``"gaussian"``, ``"gamma"``, ``"inverse_gamma"``, ``"beta"``,
    ``"dirichlet"``, ``"bernoulli"``, ``"categorical"``, ``"wishart"``,
    ``"chain_gaussian"`` or ``"chain_categorical"``.
    ``num_batch``: the leading axes of the value over which q factorises; the
    remaining axes form one block (a full covariance for a Gaussian).
    """

    kind: str
    shape: tuple[int, ...]
    num_batch: int
    num_categories: int = 0


@dataclasses.dataclass(frozen=True)
class StatRead:
    var: str
    stat: str
    index: tuple[Index, ...]


@dataclasses.dataclass(frozen=True)
class StatTerm:
    """``coeff * einsum(operand, reads...)`` summed over every label.

    In a per-observation analysis (a factor in a subsampled plate), the
    observation label is kept through pre-contraction so that a minibatch
    can be read; a term that does not read it is the same for every
    observation.
    """

    coeff: float
    operand: Optional[Operand]
    reads: tuple[StatRead, ...]
    obs_label: Optional[int] = None  # the kept observation label, if the term reads it


# ---------------------------------------------------------------------------
# Pairing reads of one variable.


def _as_array(index: Index, space: Labels) -> tuple[np.ndarray, tuple]:
    if index.direct:
        lab = index.labels[0]
        return np.arange(space.size[lab]), index.labels
    return np.asarray(index.array), index.labels


def _coincide(a: tuple[Index, ...], b: tuple[Index, ...], space: Labels, protected=frozenset()):
    """Where do two positions (tuples of indices) coincide?

    Returns ``("same", None)``, ``("never", None)``, ``("unify", subs)`` (the
    positions coincide exactly when these labels are equal) or
    ``("mask", operand)`` (a 0/1 constant over the labels involved).
    """
    if all(x.same_as(y) for x, y in zip(a, b)):
        return "same", None
    if all(x.direct and y.direct for x, y in zip(a, b)):
        subs = {}
        for x, y in zip(a, b):
            if x.labels != y.labels:
                if y.labels[0] in protected:
                    subs[x.labels[0]] = Substitution(y.labels)
                else:
                    subs[y.labels[0]] = Substitution(x.labels)
        return "unify", subs
    labels: list = []
    for idx in a + b:
        for lab in idx.labels:
            if lab not in labels:
                labels.append(lab)
    shape = [space.size[lab] for lab in labels]
    equal = np.ones(shape, bool)
    for x, y in zip(a, b):
        ex = _expand(x, labels, space)
        ey = _expand(y, labels, space)
        equal = equal & (ex == ey)
    if not equal.any():
        return "never", None
    return "mask", Operand(equal.astype(float), tuple(labels))


def _expand(index: Index, labels: list, space: Labels) -> np.ndarray:
    array, own = _as_array(index, space)
    order = [own.index(lab) for lab in labels if lab in own]
    array = np.transpose(array, order) if array.ndim else array
    shape = [space.size[lab] if lab in own else 1 for lab in labels]
    return array.reshape(shape)


def _reads_for_var(
    var: str, atoms: list[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
):
    """Split one variable's atoms in a term into alternatives.

    Returns a list of ``(sign, extra_operand_or_subs, reads)``: the term's
    expectation is the sum over alternatives of the product of the reads,
    with the given label unification or mask applied to the whole term.
    """
    nb = info.num_batch
    if info.kind == CHAIN:
        return _chain_reads(var, atoms, info, space, operands)
    if info.kind == CHAIN_CATEGORICAL:
        return _chain_categorical_reads(var, atoms, info, space, protected, operands)
    if info.kind == POINT:
        # A point mass: E[f(x)] = f(x) for every f, so reads never interact.
        return [(1.0, None, tuple(StatRead(var, _point_stat(a), a.index) for a in atoms))]
    if info.kind == GAUSSIAN:
        linear = _linear_atoms(var, atoms, "Gaussian")
        if len(linear) == 1:
            return [(1.0, None, (StatRead(var, "x", linear[0].index),))]
        a, b = linear
        status, extra = _coincide(a.index[:nb], b.index[:nb], space, protected)
        pair = StatRead(var, "xx", a.index + b.index[nb:])
        if status == "same":
            return [(1.0, None, (pair,))]
        apart = (StatRead(var, "x", a.index), StatRead(var, "x", b.index))
        if status == "never":
            return [(1.0, None, apart)]
        together = (StatRead(var, "x", a.index), StatRead(var, "x", a.index[:nb] + b.index[nb:]))
        if status == "unify":
            return [(1.0, None, apart), (1.0, extra, (pair,)), (-1.0, extra, together)]
        return [(1.0, None, apart), (1.0, extra, (pair,)), (-1.0, extra, together)]
    reads = []
    for atom in atoms:
        if info.kind == "bernoulli" and atom.kind == "x" and atom.power > 0 and atom.power.denominator == 1:
            stat = "x"
        else:
            stat = _STATS.get((info.kind, atom.kind, int(atom.power) if atom.power.denominator == 1 else None))
        if stat is None:
            what = f"{atom.kind}({var!r})" if atom.kind != "x" else f"{var!r} ** {atom.power}"
            raise NonConjugate(var, f"{what} is not a sufficient statistic of its {info.kind} q")
        reads.append(StatRead(var, stat, atom.index))
    if len(reads) == 1:
        return [(1.0, None, tuple(reads))]
    if info.kind == "categorical" and len(reads) == 2:
        a, b = reads
        value_axes = len(info.shape)
        status, extra = _coincide(a.index[:value_axes], b.index[:value_axes], space, protected)
        if status == "same":
            cat_status, cat_extra = _coincide(a.index[value_axes:], b.index[value_axes:], space, protected)
            if cat_status == "same":
                return [(1.0, None, (a,))]
            if cat_status == "never":
                return []
            return [(1.0, cat_extra, (a,))]
        if status == "never":
            return [(1.0, None, (a, b))]
    for i, a in enumerate(reads):
        for b in reads[i + 1 :]:
            status, _ = _coincide(a.index[:nb], b.index[:nb], space)
            if status != "never":
                raise NonConjugate(var, f"a product of two statistics of {var!r} at one position is not a sufficient statistic of its {info.kind} q")
    return [(1.0, None, tuple(reads))]


def _linear_atoms(var: str, atoms: list[VarAtom], family: str) -> list[VarAtom]:
    """A Gaussian variable's atoms as one or two degree-one factors (else NonConjugate)."""
    linear = []
    for atom in atoms:
        if atom.kind != "x" or atom.power not in (1, 2):
            what = f"{atom.kind}({var!r})" if atom.kind != "x" else f"{var!r} ** {atom.power}"
            raise NonConjugate(var, f"{what} is not a sufficient statistic of its {family} q")
        linear += [atom] * int(atom.power)
    if len(linear) > 2:
        raise NonConjugate(var, f"a polynomial of degree {len(linear)} in {var!r} (Gaussian q: at most 2)")
    return linear


def _chain_reads(var: str, atoms: list[VarAtom], info: VarInfo, space: Labels, operands=()):
    """Reads of a chain Gaussian (time on axis 0): E[x_t x_s] by |t - s|.

    Statistics: ``x`` (T, *s), ``xx`` = E[x_t x_tᵀ] (T, *s, *s) and ``x_next``
    = E[x_t x_{t+1}ᵀ] (T-1, *s, *s). Under a chain Gaussian, positions two or
    more steps apart are still correlated and q keeps no statistic for them,
    so such products are refused as non-conjugate.
    """
    linear = _linear_atoms(var, atoms, "chain Gaussian")
    if len(linear) == 1:
        return [(1.0, None, (StatRead(var, "x", linear[0].index),))]
    a, b = linear
    if a.index[0].same_as(b.index[0]):
        return [(1.0, None, (StatRead(var, "xx", a.index + b.index[1:]),))]
    labels: list = []
    for idx in (a.index[0], b.index[0]):
        for lab in idx.labels:
            if lab not in labels:
                labels.append(lab)
    ta, tb = _expand(a.index[0], labels, space), _expand(b.index[0], labels, space)
    diff = np.broadcast_to(tb - ta, np.broadcast_shapes(ta.shape, tb.shape))
    # Positions where the term's constant operands vanish (e.g. the masks of a
    # concatenation) do not count.
    support = np.ones(diff.shape, bool)
    for op in operands:
        if op.labels and set(op.labels) <= set(labels):
            support = support & (_expand_operand(op, labels) != 0)
    length = info.shape[0]
    if np.any((np.abs(diff) >= 2) & support):
        raise NonConjugate(
            var,
            f"a product of {var!r} at times two or more steps apart (its chain Gaussian q keeps "
            "marginal and lag-one moments only)",
        )
    out = []
    for lag, first, second in ((0, a, b), (1, a, b), (-1, b, a)):
        mask = diff == lag
        if not mask.any():
            continue
        operand = Operand(mask.astype(float), tuple(labels))
        if lag == 0:
            read = StatRead(var, "xx", first.index + second.index[1:])
        else:
            time = first.index[0]
            safe = _clip_index(time, length - 2, space)
            read = StatRead(var, "x_next", (safe,) + first.index[1:] + second.index[1:])
        out.append((1.0, operand, (read,)))
    return out


def _time_lags(a: Index, b: Index, space: Labels, operands=()):
    """``t_b - t_a`` over the labels of two time indices, and where the term's operands do not vanish."""
    labels: list = []
    for idx in (a, b):
        for lab in idx.labels:
            if lab not in labels:
                labels.append(lab)
    ta, tb = _expand(a, labels, space), _expand(b, labels, space)
    diff = np.broadcast_to(tb - ta, np.broadcast_shapes(ta.shape, tb.shape))
    support = np.ones(diff.shape, bool)
    for op in operands:
        if op.labels and set(op.labels) <= set(labels):
            support = support & (_expand_operand(op, labels) != 0)
    return diff, support, labels


def _chain_categorical_reads(var: str, atoms: list[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()):
    """Reads of a chain Categorical (time on axis 0, one category axis after it).

    Statistics: ``one_hot`` = q(z_t = k) (T, K) and ``pair`` = q(z_t = j,
    z_{t+1} = k) (T-1, K, K). A product of one-hot reads at one time is one
    read (``one_hot_j one_hot_k = delta_jk one_hot_k``); at neighbouring times
    it is a ``pair`` read (``trans[z_prev]`` in a scan body, the z0 -> z_1
    link). Reads two or more steps apart are refused: q keeps no statistic
    for them.
    """
    for atom in atoms:
        if atom.kind != "one_hot" or atom.power != 1:
            what = f"{atom.kind}({var!r})" if atom.kind != "x" else f"{var!r} ** {atom.power}"
            raise NonConjugate(var, f"{what} is not a sufficient statistic of its chain Categorical q")
    if any(not np.all(np.isfinite(np.asarray(op.array, float))) for op in operands):
        raise NonConjugate(
            var,
            f"a zero probability (log 0 = -inf) weights the states of {var!r}, and its chain "
            "Categorical q needs finite log potentials; replace exact zeros by a tiny probability "
            "(e.g. 1e-30)",
        )
    if len(atoms) == 1:
        return [(1.0, None, (StatRead(var, "one_hot", atoms[0].index),))]
    if len(atoms) > 2:
        raise NonConjugate(
            var,
            f"a product of {len(atoms)} one-hot reads of {var!r} (its chain Categorical q keeps "
            "marginal and neighbouring-pair statistics only)",
        )
    a, b = atoms
    if a.index[0].same_as(b.index[0]):
        status, extra = _coincide(a.index[1:], b.index[1:], space, protected)
        read = (StatRead(var, "one_hot", a.index),)
        if status == "same":
            return [(1.0, None, read)]
        if status == "never":
            return []
        return [(1.0, extra, read)]
    diff, support, labels = _time_lags(a.index[0], b.index[0], space, operands)
    if np.any((np.abs(diff) >= 2) & support):
        raise NonConjugate(
            var,
            f"a product of {var!r} at times two or more steps apart (its chain Categorical q keeps "
            "marginal and neighbouring-pair statistics only)",
        )
    length = info.shape[0]
    out = []
    if np.any((diff == 0) & support):
        # Same time at some positions only (a constant initial carry): there
        # one_hot_j one_hot_k = delta_jk one_hot_k, a mask over time and categories.
        status, equal = _coincide(a.index, b.index, space)
        if status not in ("never", "mask"):
            raise NonConjugate(var, f"a product of {var!r} at times that coincide at some positions only")
        if status == "mask":
            mask = _expand_operand(equal, list(equal.labels)) * _expand(
                Index(tuple(labels), np.asarray(support, int)), list(equal.labels), space
            )
            if mask.any():
                out.append((1.0, Operand(mask.astype(float), equal.labels), (StatRead(var, "one_hot", a.index),)))
    for lag, first, second in ((1, a, b), (-1, b, a)):
        mask = (diff == lag) & support
        if not mask.any():
            continue
        # The mask keeps every time label of both reads in the term (the pair read
        # names only the earlier time's).
        operand = Operand(mask.astype(float), tuple(labels))
        time = _clip_index(first.index[0], length - 2, space)
        read = StatRead(var, "pair", (time, first.index[1], second.index[1]))
        out.append((1.0, operand, (read,)))
    return out


def _expand_operand(op: Operand, labels: list) -> np.ndarray:
    array = np.asarray(op.array)
    own = list(op.labels)
    array = np.transpose(array, [own.index(lab) for lab in labels if lab in own])
    dims = iter(array.shape)
    return array.reshape([next(dims) if lab in own else 1 for lab in labels])


def _clip_index(index: Index, top: int, space: Labels) -> Index:
    """The same positions, clipped to ``top`` (masked-out reads stay in bounds)."""
    array, labels = _as_array(index, space)
    return Index(tuple(labels), np.minimum(np.asarray(array), top))


def _point_stat(atom: VarAtom) -> str:
    if atom.kind == "x":
        return "x" if atom.power == 1 else f"x**{atom.power}"
    if atom.kind in ("log", "log1m"):
        return f"{atom.kind}_x"
    if atom.kind == "logdet":
        return "log_det_x"
    raise NonConjugate(atom.var, f"{atom.kind}({atom.var!r}) of a point estimate")


def stats_needed(terms: list[StatTerm], var: str) -> set[str]:
    """The statistic names of ``var`` that ``terms`` read."""
    return {r.stat for t in terms for r in t.reads if r.var == var}


def point_stats(value, names) -> dict:
    """Statistics of a point estimate ``x``: ``x``, ``x**p``, ``log_x``, ``log1m_x``, ``log_det_x``."""
    out = {}
    for name in names:
        if name == "x":
            out[name] = value
        elif name.startswith("x**"):
            out[name] = value ** float(Fraction(name[3:]))
        elif name == "log_x":
            out[name] = jnp.log(value)
        elif name == "log1m_x":
            out[name] = jnp.log1p(-value)
        elif name == "log_det_x":
            out[name] = jnp.linalg.slogdet(value)[1]
    return out


def _apply(term_parts, extra):
    """Apply a unification (dict) or a mask (Operand) to (operands, reads, atoms)."""
    operands, reads, atoms = term_parts
    if extra is None:
        return operands, reads, atoms
    if isinstance(extra, Operand):
        return operands + (extra,), reads, atoms
    read_atoms = tuple(VarAtom(r.var, r.stat, r.index) for r in reads)
    tmp = substitute_term(Term(1.0, operands, read_atoms + tuple(atoms)), extra)
    new_reads = tuple(StatRead(a.var, a.kind, a.index) for a in tmp.atoms[: len(reads)])
    return tmp.operands, new_reads, tmp.atoms[len(reads) :]


def resolve(poly: Poly, infos: Mapping[str, VarInfo], space: Labels) -> list[StatTerm]:
    """Compile a Poly into statistic terms (raises NonConjugate).

    ``poly`` is scalar (the log factor summed over its plates) or has one
    axis, the observations of a subsampled plate, whose label is kept.
    """
    if len(poly.shape) > 1:
        raise ValueError("resolve expects a scalar or a per-observation vector")
    obs = poly.labels[0] if poly.shape else None
    protected = frozenset([obs]) if obs is not None else frozenset()
    poly = push_selectors(poly)
    out: list[StatTerm] = []
    for term in poly.terms:
        term = normalize_term(term)
        for atom in term.atoms:
            if atom.var not in infos:
                raise NonConjugate(atom.var, f"{atom.var!r} has no q in this analysis")
        # Resolve one variable at a time; a label unification or mask found for
        # one variable applies to the whole term, pending atoms included.
        alternatives = [(term.coeff, term.operands, (), term.atoms)]
        for var in dict.fromkeys(a.var for a in term.atoms):
            new = []
            for coeff, operands, reads, pending in alternatives:
                atoms = [a for a in pending if a.var == var]
                rest = tuple(a for a in pending if a.var != var)
                for sign, extra, var_reads in _reads_for_var(var, atoms, infos[var], space, protected, operands):
                    ops, rds, rst = _apply((operands, reads + var_reads, rest), extra)
                    new.append((coeff * sign, ops, rds, rst))
            alternatives = new
        for coeff, operands, reads, _ in alternatives:
            out.append(_precontract(coeff, operands, reads, space, obs))
    return _merge(out, obs)


def _canonical(term: StatTerm, obs=None):
    """A key equal for terms that differ only in label names and coefficients."""
    order: dict = {} if obs is None else {obs: 0}
    for read in term.reads:
        for idx in read.index:
            for lab in idx.labels:
                order.setdefault(lab, len(order))
    key = tuple(
        (
            r.var,
            r.stat,
            tuple(
                (tuple(order[lab] for lab in idx.labels), None if idx.direct else (idx.array.shape, idx.array.tobytes()))
                for idx in r.index
            ),
        )
        for r in term.reads
    )
    return key, order


def _merge(terms: list[StatTerm], obs=None) -> list[StatTerm]:
    """Sum terms that read the same statistics at the same positions."""
    groups: dict = {}
    for term in terms:
        key, order = _canonical(term, obs)
        if term.operand is None:
            value = np.asarray(term.coeff)
        else:
            perm = sorted(range(len(term.operand.labels)), key=lambda i: order[term.operand.labels[i]])
            value = term.coeff * np.transpose(np.asarray(term.operand.array, float), perm)
            labels = tuple(sorted(order[lab] for lab in term.operand.labels))
        labels = () if term.operand is None else labels
        if key in groups:
            first, total, total_labels = groups[key]
            total, total_labels = _add_labelled(total, total_labels, value, labels)
            groups[key] = (first, total, total_labels)
        else:
            groups[key] = (term, value, labels)
    out = []
    for key, (first, total, labels) in groups.items():
        _, order = _canonical(first, obs)
        inverse = {v: k for k, v in order.items()}
        if labels == () and np.ndim(total) == 0:
            if float(total) != 0.0:
                out.append(StatTerm(float(total), None, first.reads, first.obs_label))
            continue
        operand = Operand(total, tuple(inverse[lab] for lab in labels))
        reads_obs = any(obs in idx.labels for r in first.reads for idx in r.index)
        obs_label = obs if (obs is not None and (obs in operand.labels or reads_obs)) else None
        out.append(StatTerm(1.0, operand, first.reads, obs_label))
    return out


def _add_labelled(a, a_labels, b, b_labels):
    """Add two arrays labelled by sorted label tuples (broadcasting missing ones)."""
    labels = tuple(sorted(set(a_labels) | set(b_labels)))

    def expand(x, own):
        x = np.asarray(x, float)
        dims = iter(x.shape)
        return x.reshape([next(dims) if lab in own else 1 for lab in labels])

    return expand(a, a_labels) + expand(b, b_labels), labels


def _letters(labels_list):
    mapping: dict = {}
    for labels in labels_list:
        for lab in labels:
            if lab not in mapping:
                mapping[lab] = string.ascii_letters[len(mapping)]
    return mapping


def _precontract(coeff, operands, reads, space: Labels, obs=None) -> StatTerm:
    """Contract the constant operands down to the labels the reads use."""
    read_labels = set()
    for r in reads:
        for idx in r.index:
            read_labels |= set(idx.labels)
    op_labels = set()
    for op in operands:
        op_labels |= set(op.labels)
    keep = [lab for lab in sorted(op_labels) if lab in read_labels or lab == obs]
    if operands:
        letters = _letters([op.labels for op in operands])
        spec = ",".join("".join(letters[l] for l in op.labels) for op in operands)
        spec += "->" + "".join(letters[l] for l in keep)
        array = np.einsum(spec, *[np.asarray(op.array, float) for op in operands], optimize=True)
        operand = Operand(array, tuple(keep))
    else:
        operand = None
    uses_obs = obs is not None and (obs in read_labels or obs in op_labels)
    return StatTerm(coeff, operand, tuple(reads), obs if uses_obs else None)


# ---------------------------------------------------------------------------
# Evaluation (inside jit).


class Analysis(NamedTuple):
    """The compiled expectation of one factor.

    ``obs_label``/``obs_size``: for a per-observation analysis (a factor in a
    subsampled plate), the kept observation label and the plate's full size;
    otherwise None and 0.
    """

    terms: tuple
    obs_label: Optional[int] = None
    obs_size: int = 0


def _take(array, labels: list, label, batch):
    """Read ``array`` at ``batch`` positions along ``label`` (if it has it)."""
    if batch is None or label not in labels:
        return array
    return jnp.take(array, batch, axis=labels.index(label))


def _read(mean: Mapping, read: StatRead, obs=None, batch=None):
    array = mean[read.var][read.stat]
    index = []
    for idx in read.index:
        if batch is not None and obs in idx.labels:
            if idx.direct:
                idx = Index(idx.labels, batch)
            else:
                idx = Index(idx.labels, _take(jnp.asarray(idx.array), list(idx.labels), obs, batch))
        index.append(idx)
    gather_axes = [i for i, idx in enumerate(index) if not idx.direct]
    direct_axes = [i for i, idx in enumerate(index) if idx.direct]
    if gather_axes:
        union: list = []
        for i in gather_axes:
            for lab in index[i].labels:
                if lab not in union:
                    union.append(lab)
        moved = jnp.moveaxis(array, gather_axes, list(range(len(gather_axes))))
        index_arrays = []
        for i in gather_axes:
            idx = index[i]
            own = [lab for lab in union if lab in idx.labels]
            arr = idx.array
            arr = jnp.transpose(arr, [idx.labels.index(lab) for lab in own]) if jnp.ndim(arr) else arr
            dims = iter(jnp.shape(arr))
            index_arrays.append(jnp.reshape(arr, [next(dims) if lab in own else 1 for lab in union]))
        array = moved[tuple(index_arrays)]
        labels = union + [index[i].labels[0] for i in direct_axes]
    else:
        labels = [index[i].labels[0] for i in direct_axes]
    # Repeated labels read a diagonal (E[x_i^2] from E[x x^T]).
    while len(set(labels)) < len(labels):
        for p, lab in enumerate(labels):
            q = labels.index(lab)
            if q != p:
                array = jnp.diagonal(array, axis1=q, axis2=p)
                labels = [x for i, x in enumerate(labels) if i not in (q, p)] + [lab]
                break
    return array, labels


def expected_value(analysis, mean: Mapping, batch=None):
    """E_q[log f] from mean parameters (value-layout dicts per variable).

    Args:
      analysis: an :class:`Analysis` (or a list of terms: a scalar analysis).
      mean: variable name -> value-layout dict of mean parameters.
      batch: for a per-observation analysis, the observations to read
        (integer array, length M); the result is then the minibatch sum, not
        rescaled. None reads all observations.
    """
    if not isinstance(analysis, Analysis):
        analysis = Analysis(tuple(analysis))
    obs = analysis.obs_label
    count = analysis.obs_size if batch is None else jnp.shape(batch)[0]
    total = 0.0
    for term in analysis.terms:
        arrays, label_lists = [], []
        if term.operand is not None:
            labels = list(term.operand.labels)
            arrays.append(_take(jnp.asarray(term.operand.array), labels, obs, batch))
            label_lists.append(labels)
        for read in term.reads:
            array, labels = _read(mean, read, obs, batch)
            arrays.append(array)
            label_lists.append(labels)
        multiplier = count if (obs is not None and term.obs_label is None) else 1
        if not arrays:
            total = total + term.coeff * multiplier
            continue
        letters = _letters(label_lists)
        spec = ",".join("".join(letters[l] for l in labs) for labs in label_lists) + "->"
        value = jnp.einsum(spec, *arrays, optimize="optimal" if len(arrays) < 5 else "greedy")
        total = total + term.coeff * multiplier * value
    return total
