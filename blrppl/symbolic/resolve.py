"""Compile a symbolic log factor into statistic terms: pairing and pre-contraction.

A scalar :class:`~blrppl.symbolic.terms.Poly` (a log factor summed over its
plates) becomes an :class:`~blrppl.symbolic.compiled.Analysis`: each term's
atoms are resolved variable by variable into reads of mean parameters (the
pairing of the variable's kind, :data:`PAIRINGS`), its constant operands are
contracted down to the labels the reads use (``sum(y**2)``, ``X.T @ X``,
per-group sums, ...), and terms that read the same statistics at the same
positions are summed. Labels are finally renumbered in order of appearance,
so that the analyses of one model on different data name them alike.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from blrppl.graph import tape
from blrppl.symbolic.algebra import normalize_term, push_selectors
from blrppl.symbolic.chain_reads import chain_categorical_reads, chain_reads
from blrppl.symbolic.compiled import Analysis, StatRead, StatTerm
from blrppl.symbolic.expectation import einsum_letters
from blrppl.symbolic.pairing import (
    Alternative,
    categorical_reads,
    gaussian_reads,
    independent_reads,
    point_reads,
)
from blrppl.symbolic.statistics import (
    CATEGORICAL,
    CHAIN,
    CHAIN_CATEGORICAL,
    GAUSSIAN,
    POINT,
    TIED_CHAIN_CATEGORICAL,
    VarInfo,
)
from blrppl.symbolic.terms import Index, Labels, NonConjugate, Operand, Poly, Term, VarAtom, substitute_term
from blrppl.symbolic.tied import tie_transitions

#: q kind -> how the reads of one variable in a term pair up (default: :func:`independent_reads`).
PAIRINGS: dict[str, Callable[..., list[Alternative]]] = {
    GAUSSIAN: gaussian_reads,
    POINT: point_reads,
    CATEGORICAL: categorical_reads,
    CHAIN: chain_reads,
    CHAIN_CATEGORICAL: chain_categorical_reads,
    TIED_CHAIN_CATEGORICAL: chain_categorical_reads,  # then tied: :func:`tie_transitions`
}


def reads_for_variable(
    var: str, atoms: list[VarAtom], info: VarInfo, space: Labels, protected=frozenset(), operands=()
) -> list[Alternative]:
    """Split one variable's atoms in a term into alternatives (see :mod:`blrppl.symbolic.pairing`)."""
    pairing = PAIRINGS.get(info.kind, independent_reads)
    return pairing(var, atoms, info, space, protected, operands)


def _apply(term_parts, extra):
    """Apply a unification (dict), a mask (Operand), or a tuple of them in order, to (operands, reads, atoms)."""
    operands, reads, atoms = term_parts
    if extra is None:
        return operands, reads, atoms
    if isinstance(extra, tuple):
        for part in extra:
            operands, reads, atoms = _apply((operands, reads, atoms), part)
        return operands, reads, atoms
    if isinstance(extra, Operand):
        return operands + (extra,), reads, atoms
    read_atoms = tuple(VarAtom(r.var, r.stat, r.index) for r in reads)
    tmp = substitute_term(Term(1.0, operands, read_atoms + tuple(atoms)), extra)
    new_reads = tuple(StatRead(a.var, a.kind, a.index) for a in tmp.atoms[: len(reads)])
    return tmp.operands, new_reads, tmp.atoms[len(reads) :]


def resolve(poly: Poly, infos: Mapping[str, VarInfo], space: Labels) -> Analysis:
    """Compile a Poly into an analysis of statistic terms.

    Args:
      poly: scalar (the log factor summed over its plates), or with one axis,
        the observations of a subsampled plate, whose label is kept.
      infos: the q of every variable ``poly`` reads.
      space: the label space of ``poly``.

    Raises:
      NonConjugate: naming the variable and the reason.
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
                for sign, extra, var_reads in reads_for_variable(var, atoms, infos[var], space, protected, operands):
                    ops, rds, rst = _apply((operands, reads + var_reads, rest), extra)
                    new.append((coeff * sign, ops, rds, rst))
            alternatives = new
        for coeff, operands, reads, _ in alternatives:
            out.append(tie_transitions(_precontract(coeff, operands, reads, space, obs), infos))
    terms = _merge(out, obs)
    if poly.shape:
        return _renumber(Analysis(tuple(terms), obs, poly.shape[0]))
    return _renumber(Analysis(tuple(terms)))


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
                (
                    tuple(order[lab] for lab in idx.labels),
                    None if idx.direct else (idx.array.shape, idx.array.tobytes()),
                )
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
            value = tape.asarray(term.coeff)
        else:
            perm = sorted(range(len(term.operand.labels)), key=lambda i: order[term.operand.labels[i]])
            value = term.coeff * np.transpose(tape.asarray(term.operand.array, float), perm)
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
            if total != 0.0:
                out.append(StatTerm(tape.scalar(total), None, first.reads, first.obs_label))
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
        x = tape.asarray(x, float)
        dims = iter(x.shape)
        return x.reshape([next(dims) if lab in own else 1 for lab in labels])

    return expand(a, a_labels) + expand(b, b_labels), labels


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
        letters = einsum_letters([op.labels for op in operands])
        spec = ",".join("".join(letters[l] for l in op.labels) for op in operands)
        spec += "->" + "".join(letters[l] for l in keep)
        array = np.einsum(spec, *[tape.asarray(op.array, float) for op in operands], optimize=True)
        operand = Operand(array, tuple(keep))
    else:
        operand = None
    uses_obs = obs is not None and (obs in read_labels or obs in op_labels)
    return StatTerm(coeff, operand, tuple(reads), obs if uses_obs else None)


def _renumber(analysis: Analysis) -> Analysis:
    """Rename labels 0, 1, ... in order of appearance (the observation label first).

    Label numbers otherwise depend on how many fresh labels the
    interpretation drew; renumbered, two analyses with the same structure
    are equal in every static field.
    """
    order: dict = {} if analysis.obs_label is None else {analysis.obs_label: 0}

    def name(label: int) -> int:
        return order.setdefault(label, len(order))

    def index(idx: Index) -> Index:
        return Index(tuple(name(lab) for lab in idx.labels), idx.array)

    terms = []
    for term in analysis.terms:
        reads = tuple(StatRead(r.var, r.stat, tuple(index(i) for i in r.index)) for r in term.reads)
        operand = None
        if term.operand is not None:
            operand = Operand(term.operand.array, tuple(name(lab) for lab in term.operand.labels))
        obs_label = None if term.obs_label is None else name(term.obs_label)
        terms.append(StatTerm(term.coeff, operand, reads, obs_label))
    obs = None if analysis.obs_label is None else name(analysis.obs_label)
    return Analysis(tuple(terms), obs, analysis.obs_size)
