"""Lowering: index-notation assignments → tensor IR operations, for any program.

Input: a ``symbolic.program.Program`` (a block's step, or a network program: an embedding, a
readout, a grid step, CvT's pieces). Output: a ``codegen.ir.Module``.

A read at a pattern of grid indices becomes a view first: shifted points ``S p + r − padding``
a ``Window`` (the coarse grid, then the kernel offsets), a fixed node ``u[0, l]`` a ``Point``,
the grid rows ``n[o + N_2 p + q, l]`` of the token axis ``Rows``. Each assignment is then
matched, in order, against:

- the softmax kernel ``χ e^{a} / Σ_n χ e^{a}`` → ``Softmax`` over the summed axis;
- a sum of products of arrays (plus at most one bias array) → ``Contraction`` (einsum);
- ``Σ_k body / N_k`` or ``Σ_k body`` → ``Reduction`` (mean or sum over ``k``);
- ``c Σ_K x``, one array summed over several axes → ``Contraction``;
- anything else → ``Elementwise``, after every ``Sum`` inside it has been lowered into a
  temporary of its own.

A write at shifted points (a prolongation) is computed per coarse node and offset, then
``Interleave``d; a write at token nodes (``q[0, l]``, ``q[1 + N_2 p + q, l]``) is one part of
the array, and the parts are joined along the token axis (``Join``) at the end of the
substep that wrote them. ``Δt`` is set to 1 here (the step size is absorbed into the
learned controls).
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.adjoint import is_plain
from splitformer.symbolic.domains import VARIABLES, Domain
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.image import IMAGE_VARIABLES, KERNEL_OFFSETS
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.latex import plain_equation, plain_formula
from splitformer.symbolic.program import TIME_STEP, Assignment, Program

from .bool_values import SUPPORTS, counted
from .ir import (BATCH, UNBATCHED_ROLES, WINDOW_NOTE, Cache, Contraction, Elementwise, Interleave, Join, Mask, Memoized,
                 Module, Op, Operand, PairTable, Point, Reduction, Rows, Shared, Softmax, TensorInfo, Window)
from .nested_sums import nested_sums

__all__ = ["lower", "Lowering", "INDEX_DOMAINS", "shifted_axes", "flattened_index", "flattened_sums"]

#: The definition an attention kind's kernel is (every built-in's ``γ``), where torch drops entries in training.
KERNEL = "gamma"
INDEX_DOMAINS = {variable.index: variable.domain for variable in VARIABLES.values()}


def _domain(index: sp.Idx) -> Domain:
    """The grid of an index: a block's variable, else the image variable of its letter (a kernel offset
    whose range the network fixes)."""
    if index in INDEX_DOMAINS:
        return INDEX_DOMAINS[index]
    return next(variable.domain for variable in reversed(IMAGE_VARIABLES.values()) if str(variable.index) == str(index))


def _shifted_read(index: sp.Expr) -> tuple[sp.Idx, sp.Idx, sp.Expr, sp.Expr]:
    """``S p + r − padding`` → ``(p, r, S, padding)``: the coarse index, the kernel offset."""
    indices = sorted(index.atoms(sp.Idx), key=str)
    offsets = [i for i in indices if str(i) in KERNEL_OFFSETS]
    coarse = [i for i in indices if i not in offsets]
    if len(offsets) != 1 or len(coarse) != 1:
        raise AssertionError(f"not a read at shifted points: {index}")
    (offset,), (point,) = offsets, coarse
    stride = sp.expand(index).coeff(point)
    if sp.expand(index).coeff(offset) != 1:
        raise AssertionError(f"kernel offset with a factor: {index}")
    padding = sp.expand(point * stride + offset - index)
    return point, offset, stride, padding


def shifted_axes(indices) -> tuple[list, list, list, list, set]:
    """The indices of an array read or written at shifted points ``S p + r − padding`` (or at a fixed
    node): the plain and coarse indices, the kernel offsets, the shifted axes (after the batch
    axis), each axis as a view index (``":"`` or the node) and the shapes ``(size, stride, padding)``."""
    kept, offsets, axes, points, shapes = [], [], [], [":"], set()
    for position, index in enumerate(indices):
        if index.is_Integer:
            points.append(int(index))
            continue
        points.append(":")
        if isinstance(index, sp.Idx):
            kept.append(index)
            continue
        point, offset, stride, padding = _shifted_read(index)
        kept.append(point)
        offsets.append(offset)
        axes.append(position + 1)
        shapes.add((offset.upper + 1, stride, padding))
    return kept, offsets, axes, points, shapes


def flattened_index(index: sp.Expr) -> tuple[int, tuple[sp.Idx, ...]] | None:
    """``offset + N_2 p + q`` → ``(offset, (p, q))`` when it enumerates ``(p, q)`` row by row."""
    expanded = sp.expand(index)
    remaining, ordered, stride = set(expanded.atoms(sp.Idx)), [], sp.Integer(1)
    if any(str(atom) in KERNEL_OFFSETS for atom in remaining):
        return None  # a kernel offset: a window
    while remaining:
        match = [atom for atom in remaining if sp.expand(expanded.coeff(atom) - stride) == 0]
        if len(match) != 1:
            return None
        ordered.insert(0, match[0])
        remaining.remove(match[0])
        stride *= match[0].upper - match[0].lower + 1
    offset = expanded.xreplace({atom: 0 for atom in ordered})
    return (int(offset), tuple(ordered)) if offset.is_Integer else None


def _keeps(factor: sp.Expr) -> bool:
    """``factor`` is 0 or 1 by what it is, and says which keys a softmax keeps: a read of a support, a δ, or a step
    whose value at 0 is 0 or 1 (one of ½ is a weight there, not a mask)."""
    if isinstance(factor, sp.Indexed):
        return str(factor.base.label) in SUPPORTS
    steps = isinstance(factor, sp.Heaviside) and len(factor.args) == 2 and factor.args[1] in (0, 1)
    return steps or isinstance(factor, sp.KroneckerDelta)


def _outermost_sums(expr: sp.Expr) -> set[sp.Sum]:
    """The sums of ``expr`` that lie inside no other sum where they stand (one both inside a sum and outside is one)."""
    if isinstance(expr, sp.Sum):
        return {expr}
    return set().union(*(_outermost_sums(arg) for arg in expr.args))


def flattened_sums(total: sp.Sum) -> sp.Sum:
    """``Σ_a (g Σ_b f)`` as one sum over both, ``Σ_{b,a} g f`` (SymPy's limits innermost first), where the inner
    limits do not read the outer index: a plug-in's low-rank map ``Σ_ξ u(x, ξ) Σ_ζ A(ξ, ζ) B(ζ, y)`` is then one
    contraction of its three factors, not a temporary broadcast against the state and summed."""
    while True:
        factors = sp.Mul.make_args(total.function)
        inner = [factor for factor in factors if isinstance(factor, sp.Sum)]
        if len(inner) != 1:
            return total
        (inner,) = inner
        outer = {limit[0] for limit in total.limits}
        if any(bound.has(*outer) for limit in inner.limits for bound in limit[1:]):
            return total
        rest = sp.Mul(*(factor for factor in factors if factor is not inner))
        total = sp.Sum(rest * inner.function, *inner.limits, *total.limits)


class Lowering:
    """A program's assignments lowered one by one into IR operations (``lower`` runs it).

    ``known``: tensors lowered before (a network adjoint's forward, which tells the unbatched ones);
    ``network``: a network program's, each statement commented with its assignment's formula as derived
    (its time step kept) instead of the lowered formula.
    """

    def __init__(self, program: Program, known: dict[str, TensorInfo] | None = None, network: bool = False):
        self.program = program
        self.network = network
        self.tensors: dict[str, TensorInfo] = dict(known or {})
        self.ops: list[Op] = []
        self.temporaries = 0
        self.section = ""
        #: token array → its parts so far: (first token node, part array); the section that wrote them
        self.parts: dict[str, list[tuple[int, str]]] = {}
        self.sections: dict[str, str] = {}
        #: the arrays computed from bools alone (steps, δs, supports, their products and sums): masks and counts
        self.masks: set[str] = set()
        for name, tensor in program.tensors.items():
            if tensor.role == "temp" or tensor.role == "state":
                continue
            labels = tuple(str(index) for index in tensor.indices)
            view = None
            if not tensor.batched:  # a parameter read through its own axes (heads split a feature axis)
                view = tuple(_domain(index) for index in tensor.indices)
                view = None if view == tensor.shape else view
            self.tensors[name] = TensorInfo(name, tensor.role, (BATCH,) + labels if tensor.batched else labels,
                                            tensor.parameter, tensor.shape, view, tensor.kind)

    def labels(self, indexed: sp.Indexed) -> tuple[str, ...]:
        labels = tuple(str(index) for index in indexed.indices)
        info = self.tensors.get(str(indexed.base.label))
        return labels if info is not None and info.role in UNBATCHED_ROLES else (BATCH,) + labels

    def operand(self, indexed: sp.Indexed) -> Operand:
        return Operand(str(indexed.base.label), self.labels(indexed))

    def comment(self, assignment: Assignment, rhs: sp.Expr | None = None) -> str:
        """The plain-text formula above the statements of ``assignment``: a network's as derived, a block's as lowered
        (``rhs``); Δt = 1 in both, as in the code."""
        shown = assignment.rhs.xreplace({TIME_STEP: sp.Integer(1)}) if self.network or rhs is None else rhs
        return plain_equation(assignment.lhs, shown, self.program.latex_names())

    def assignment(self, assignment: Assignment, section: str = "") -> None:
        """``assignment`` with its reads at patterns viewed: a part of a token array (written at token nodes),
        a prolongation (written at shifted points) or a formula."""
        reads = {str(read.base.label) for read in assignment.rhs.atoms(sp.Indexed)}
        for name in sorted(reads & set(self.parts)):
            self.join(name)
        assignment = self.viewed(assignment, section)
        first = assignment.lhs.indices[0] if assignment.lhs.indices else None
        if not is_plain(assignment.lhs.indices) and not isinstance(first, sp.Idx):
            self.part(assignment, section)
        elif not all(isinstance(index, sp.Idx) for index in assignment.lhs.indices):
            self.interleave(assignment, section)
        else:
            self.formula(assignment, section)

    def formula(self, assignment: Assignment, section: str) -> None:
        """A plain ``lhs = rhs`` as one operation (plus those of the sums hoisted out of it)."""
        reads = {str(read.base.label) for read in assignment.rhs.atoms(sp.Indexed)}
        if reads and all(name in self.tensors and self.tensors[name].role == "param" for name in reads):
            # computed from parameters alone (BatchNorm's a, c): no batch axis, like a parameter
            labels = tuple(str(index) for index in assignment.lhs.indices)
            self.tensors[assignment.target] = TensorInfo(assignment.target, "param", labels)
        self.section = section
        rhs = nested_sums(assignment.rhs.xreplace({TIME_STEP: sp.Integer(1)}), frozenset(self.masks))
        if rhs.has(sp.Indexed) and counted(rhs, self.masks):  # as ``bool_values`` notes its counts
            self.masks.add(assignment.target)
        out = assignment.target
        labels = self.labels(assignment.lhs)
        op = self.pattern(out, labels, rhs)
        if op is None and isinstance(rhs, sp.Sum) and len(rhs.limits) > 1:  # hoisted, it would be itself again
            rhs = self.one_axis_sums(rhs, labels)
            op = self.pattern(out, labels, rhs)
        if op is None:
            op = Elementwise(out, labels, expr=self.hoist_sums(rhs, labels))
        self.ops.append(op.with_comment(self.comment(assignment, rhs), section))

    # -- patterns ----------------------------------------------------------------------
    def pattern(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        """The operation of the first pattern ``rhs`` takes: a softmax, a contraction, a reduction, a summed array."""
        return self.softmax(out, labels, rhs) or self.contraction(out, labels, rhs) or \
            self.reduction(out, labels, rhs) or self.summed_array(out, labels, rhs)

    def softmax(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        """``m e^{s} / Σ_n m e^{s}`` → ``Softmax`` of the scores ``s`` (a temporary unless an array) on the support
        ``m``: an array (χ), or steps and supports (a plug-in's window), then a ``Mask``. Normalized over another
        axis than the last (a plug-in's weights per feature, ``w(x, x̃, y)``): over the last of a temporary with that
        axis last, then viewed in ``out``'s order."""
        normalizers = [factor for factor in sp.Mul.make_args(rhs) if isinstance(factor, sp.Pow)
                       and factor.exp == -1 and isinstance(factor.base, sp.Sum)]  # not sp.fraction: e^{−x} stays
        if len(normalizers) != 1 or len(normalizers[0].base.limits) != 1:
            return None
        denominator = normalizers[0].base
        numerator = rhs * denominator
        dummy = denominator.limits[0][0]
        factors = sp.Mul.make_args(numerator)
        exponentials = [factor for factor in factors if isinstance(factor, sp.exp)]
        others = [factor for factor in factors if not isinstance(factor, sp.exp)]
        key = next((index for index in sorted(numerator.atoms(sp.Idx), key=str) if str(index) in labels
                    and sp.expand(denominator.function.xreplace({dummy: index}) - numerator) == 0), None)
        if not exponentials or key is None:
            return None
        scores = sp.Add(*(factor.args[0] for factor in exponentials))
        dropout = out.rsplit("_", 1)[-1] == KERNEL  # torch's attention dropout: on a kernel γ, not other weights
        indices = {str(index): index for index in numerator.atoms(sp.Idx)}
        if not all(_keeps(factor) for factor in others):
            return None  # a weight besides the masks: the formula as written
        if str(key) != labels[-1] and (labels[0] != BATCH or not set(labels[1:]) <= set(indices)):
            return None  # the view back names each axis of ``out`` by an index the weights read
        if str(key) == labels[-1] and isinstance(scores, sp.Indexed) and self.labels(scores) == labels and \
                len(others) <= 1 and all(isinstance(factor, sp.Indexed) for factor in others):
            support = self.operand(others[0]) if others else None
            return Softmax(out, labels, scores=self.operand(scores), support=support, dropout=dropout)
        rows = tuple(label for label in labels if label != str(key)) + (str(key),)
        mask = sp.Mul(*others)
        support = self.temporary(Mask(mask), rows, f"the keys where {self.plain(mask)} ≠ 0") if others else None
        scores = self.temporary(scores, rows, f"the scores {self.plain(scores)}", every_axis=True)
        if rows == labels:
            return Softmax(out, labels, scores=scores, support=support, dropout=dropout)
        self.temporaries += 1
        kernel = f"t{self.temporaries}"
        self.ops.append(Softmax(kernel, rows, scores=scores, support=support, dropout=dropout)
                        .with_comment(f"normalized along {key} (last here)", self.section))
        return Elementwise(out, labels, expr=sp.IndexedBase(kernel)[tuple(indices[label] for label in rows[1:])])

    def plain(self, formula: sp.Expr) -> str:
        return plain_formula(formula, self.program.latex_names())

    def temporary(self, value: sp.Expr, labels: tuple[str, ...], comment: str, every_axis: bool = False) -> Operand:
        """``value`` (an array read in ``labels``' order as it is, else computed into a temporary over those of
        ``labels`` it reads, or over every one of them)."""
        if isinstance(value, sp.Indexed) and is_plain(value.indices) and self.labels(value) == labels:
            return self.operand(value)
        read = {str(index) for index in value.atoms(sp.Idx)}
        batched = any(self.labels(item)[0] == BATCH for item in value.atoms(sp.Indexed))
        axes = labels if every_axis else tuple(label for label in labels
                                               if label in read or (label == BATCH and batched))
        self.temporaries += 1
        name = f"t{self.temporaries}"
        self.ops.append(Elementwise(name, axes, expr=self.hoist_sums(value, axes)).with_comment(comment, self.section))
        return Operand(name, axes)

    def contraction(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        sums = [term for term in sp.Add.make_args(rhs) if term.has(sp.Sum)]
        rest = [term for term in sp.Add.make_args(rhs) if not term.has(sp.Sum)]
        if len(sums) != 1 or len(rest) > 1 or (rest and not isinstance(rest[0], sp.Indexed)):
            return None
        scale, total = sp.Integer(1), None
        for factor in sp.Mul.make_args(sums[0]):
            if isinstance(factor, sp.Sum):
                total = factor
            else:
                scale *= factor
        if total is None or scale.has(sp.Indexed):
            return None
        total = flattened_sums(total)
        factors = self.hoist_maps(sp.Mul.make_args(total.function))
        if factors is None:
            return None
        scale *= sp.Mul(*(factor for factor in factors if not isinstance(factor, sp.Indexed)))
        factors = [factor for factor in factors if isinstance(factor, sp.Indexed)]
        if len(factors) < 2:
            return None
        operands = sorted((self.operand(factor) for factor in factors), key=lambda operand: _reading_order(operand, labels))
        bias = self.operand(rest[0]) if rest else None
        return Contraction(out, labels, operands=tuple(operands), scale=scale, bias=bias)

    def hoist_maps(self, factors: tuple[sp.Expr, ...]) -> list[sp.Expr] | None:
        """The factors of a sum's product with each map of one array (a plug-in's ``φ(q) = e^q`` in ``Σ_e φ(q) φ(k)``)
        lowered into a temporary over that array's axes, so that the sum is a contraction (an einsum, a GEMM) rather
        than a product broadcast over every axis, then summed; ``None`` where a factor is anything else (a step, a
        power, a read at a pattern, a map of several arrays, a grid coordinate) or fewer than two factors read arrays.
        Numbers stay as they are (the contraction's scale)."""
        maps = [factor for factor in factors if not isinstance(factor, sp.Indexed)
                and (factor.atoms(sp.Indexed) or factor.atoms(sp.Idx))]
        if any(not self.hoistable(factor) for factor in maps) or sum(1 for factor in factors
                                                                     if factor.atoms(sp.Indexed)) < 2:
            return None
        hoisted = []
        for factor in factors:
            if factor in maps:
                self.temporaries += 1
                target = sp.IndexedBase(f"t{self.temporaries}")[next(iter(factor.atoms(sp.Indexed))).indices]
                self.assignment(Assignment(target, factor, "temporary"), self.section)
                factor = target
            hoisted.append(factor)
        return hoisted

    @staticmethod
    def hoistable(factor: sp.Expr) -> bool:
        """``factor`` is a function of one array read at plain indices (a call, a sum of calls: a plug-in's elu + 1,
        ``Max(z, 0) + e^{Min(z, 0)}``; a power), and of nothing else that varies (no step), with no reciprocal in it:
        a count's ``1/c`` stays in the product, where the empty-support rule (``bool_values``) reads it."""
        reads = factor.atoms(sp.Indexed)
        if (len(reads) != 1 or not isinstance(factor, (sp.Function, sp.Add, sp.Pow))
                or factor.has(sp.Heaviside, sp.KroneckerDelta)
                or any(power.exp.is_negative is not False for power in factor.atoms(sp.Pow))):
            return False
        (read,) = reads
        return is_plain(read.indices) and not factor.xreplace({read: sp.Integer(1)}).atoms(sp.Idx)

    def reduction(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        scale, total = sp.Integer(1), None
        for factor in sp.Mul.make_args(rhs):
            if isinstance(factor, sp.Sum) and total is None:
                total = factor
            else:
                scale *= factor
        if total is None or len(total.limits) != 1:
            return None
        index = total.limits[0][0]
        mean = scale == 1 / INDEX_DOMAINS[index].size if index in INDEX_DOMAINS else False
        if not mean and scale != 1:
            return None
        body_labels = _with_axis(labels, str(index), total.function)
        body = self.hoist_sums(total.function, body_labels)
        return Reduction(out, labels, body=body, body_labels=body_labels, axis=str(index), mean=mean)

    def summed_array(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        """``y = c Σ_K x``, one array summed over several axes (a costate of BatchNorm's shift), as an einsum."""
        factors = sp.Mul.make_args(rhs)
        sums = [factor for factor in factors if isinstance(factor, sp.Sum)]
        if len(sums) != 1 or not isinstance(sums[0].function, sp.Indexed):
            return None
        scale = sp.Mul(*(factor for factor in factors if factor is not sums[0]))
        if scale.has(sp.Indexed):
            return None
        return Contraction(out, labels, operands=(self.operand(sums[0].function),), scale=scale)

    def one_axis_sums(self, total: sp.Sum, labels: tuple[str, ...]) -> sp.Sum:
        """A sum over several indices ``Σ_{m,e} f`` that no pattern takes as ``Σ_e t``, ``t = Σ_m f`` a temporary over
        ``e`` and the axes ``f`` reads besides: a reduction takes a sum over one index of any body, so such a sum is one
        reduction per index (hoisted whole, it was a temporary defined as itself, lowered without end: a plug-in's gate
        ``σ(∫ W_g u dξ + b_g)`` over the heads' features, whose adjoint sums over both). SymPy joins ``Σ_e Σ_m f`` back
        into one sum: hence the temporary."""
        inner, last = sp.Sum(total.function, *total.limits[:-1]), total.limits[-1]
        axes = _with_axis(labels, str(last[0]), total.function)
        free = [index for index in inner.free_symbols if isinstance(index, sp.Idx)]
        self.temporaries += 1
        target = sp.IndexedBase(f"t{self.temporaries}")[tuple(sorted(free, key=lambda index: axes.index(str(index))))]
        self.assignment(Assignment(target, inner, "temporary"), self.section)
        return sp.Sum(target, last)

    def hoist_sums(self, expr: sp.Expr, labels: tuple[str, ...]) -> sp.Expr:
        """Lower every outermost ``Sum`` inside ``expr`` into a temporary (a sum inside it is lowered with it, over its
        axes and the outer one's: ``Σ_j c[j, i] λ[j, l]/Σ_n c[j, n]`` reads the inner sum at each ``j``); return the rest."""
        replacements = {}
        for total in sorted(_outermost_sums(expr), key=sp.default_sort_key):
            free = [index for index in total.free_symbols if isinstance(index, sp.Idx)]
            ordered = tuple(sorted(free, key=lambda index: labels.index(str(index))))
            if not ordered:
                raise AssertionError(f"a sum over every axis has no per-token meaning: {total}")
            self.temporaries += 1
            name = f"t{self.temporaries}"
            target = sp.IndexedBase(name)[ordered]
            self.assignment(Assignment(target, total, "temporary"), self.section)
            replacements[total] = target
        return expr.xreplace(replacements)

    # -- reads and writes at patterns ----------------------------------------------------
    def viewed(self, assignment: Assignment, section: str) -> Assignment:
        """``assignment`` with each read at a pattern (an index not plain) replaced by the plain read
        of a view of it (``view``)."""
        reads = sorted(assignment.rhs.atoms(sp.Indexed), key=sp.default_sort_key)
        patterns = {read: self.view(read, assignment, section) for read in reads
                    if not all(isinstance(index, sp.Idx) for index in read.indices)}
        return replace(assignment, rhs=assignment.rhs.xreplace(patterns)) if patterns else assignment

    def view(self, read: sp.Indexed, assignment: Assignment, section: str) -> sp.Indexed:
        """A read at a pattern as a view over plain indices: grid rows of the token axis, a node, windows."""
        source = str(read.base.label)
        if any(index.atoms(sp.Idx) and not isinstance(index, sp.Idx) and flattened_index(index) is None
               for index in read.indices):
            return self.window(read, assignment, section)
        indices, index, rows = [], [":"], None
        for axis, entry in enumerate(read.indices):
            if entry.is_Integer:
                index.append(int(entry))
            elif isinstance(entry, sp.Idx):
                index.append(":")
                indices.append(entry)
            else:
                offset, atoms = flattened_index(entry)
                rows = (axis + 1, offset, tuple(atom.upper - atom.lower + 1 for atom in atoms))
                index.append(":")
                indices.extend(atoms)
        self.temporaries += 1
        name = f"{source}_view{self.temporaries}"
        labels = (BATCH,) + tuple(str(entry) for entry in indices)
        if rows is not None:
            axis, offset, sizes = rows
            op = Rows(name, labels, source=source, axis=axis, offset=offset, sizes=sizes)
        else:
            op = Point(name, labels, source=source, index=tuple(index))
        self.ops.append(op.with_comment(f"{source} at {', '.join(map(str, read.indices))} (a view)", section))
        return sp.IndexedBase(name)[tuple(indices)]

    def window(self, read: sp.Indexed, assignment: Assignment, section: str) -> sp.Indexed:
        kept, offsets, axes, points, shapes = shifted_axes(read.indices)
        if len(shapes) != 1 or set(points) != {":"}:
            raise SplitformerError(f"{assignment.target}: kernel size, stride and padding must agree on every axis "
                                   "of a read at windows (and no axis read at a node)")
        (size, stride, padding), = shapes
        # one view per field an assignment reads at windows (an operator applied twice: its kernel's gradient reads
        # each application's input), named for the assignment
        name = f"{assignment.target}_windows"
        taken = {op.out for op in self.ops}
        name = next(candidate for n in range(1, len(taken) + 2)
                    if (candidate := name if n == 1 else f"{name}{n}") not in taken)
        labels = (BATCH,) + tuple(str(index) for index in kept + offsets)
        comment = f"{plain_formula(read, self.program.latex_names())}{WINDOW_NOTE}"
        self.ops.append(Window(name, labels, source=str(read.base.label), axes=tuple(axes), size=size,
                               stride=stride, padding=padding).with_comment(comment, section))
        return sp.IndexedBase(name)[tuple(kept + offsets)]

    def interleave(self, assignment: Assignment, section: str) -> None:
        """``out[…, S p + r, …] = value`` → the value per coarse node and offset, then ``Interleave``."""
        kept, offsets, axes, points, shapes = shifted_axes(assignment.lhs.indices)
        if set(points) != {":"} or any(padding != 0 or stride != size for size, stride, padding in shapes):
            raise SplitformerError(f"{assignment.target}: a prolongation needs kernel = stride and no padding")
        blocks = f"{assignment.target}_blocks"
        self.assignment(replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept + offsets)]), section)
        self.ops.append(Interleave(assignment.target, (BATCH,) + tuple(str(index) for index in kept),
                                   source=blocks, axes=tuple(axes)).with_comment(self.comment(assignment), section))
        self.ops[-2] = self.ops[-2].with_comment("the value at each coarse node and offset", section)

    def part(self, assignment: Assignment, section: str) -> None:
        """``x[pattern, l] = value``: the value at each node of the pattern, one part of ``x``."""
        first, rest = assignment.lhs.indices[0], assignment.lhs.indices[1:]
        found = (int(first), ()) if first.is_Integer else flattened_index(first)
        if found is None or not is_plain(rest):
            raise SplitformerError(f"{assignment.target}: only the token axis (the first) may be written at a node "
                                   "or at grid rows")
        offset, atoms = found
        parts = self.parts.setdefault(assignment.target, [])
        self.sections.setdefault(assignment.target, section)
        name = f"{assignment.target}_part{len(parts) + 1}"
        self.formula(replace(assignment, lhs=sp.IndexedBase(name)[tuple(atoms) + tuple(rest)]), section)
        parts.append((offset, name))

    def join(self, name: str) -> None:
        parts, section = sorted(self.parts.pop(name)), self.sections.pop(name)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[name].indices)
        self.ops.append(Join(name, labels, section=section, parts=tuple(part for _, part in parts))
                        .with_comment("the parts one after another along the token axis", section))

    def record(self, assignments, section: str) -> None:
        """One record's assignments; a record writes whole arrays, so the parts it wrote are complete."""
        for assignment in assignments:
            self.assignment(assignment, section)
        for name in list(self.parts):
            self.join(name)


def _with_cache(ops: list[Op], cached: dict[str, str]) -> list[Op]:
    """A ``Cache`` op before the first reader of each cached key-side field (after its producer)."""
    result: list[Op] = []
    pending = dict(cached)
    for op in ops:
        for name in [name for name in op.reads() if name in pending]:
            producer = next(item for item in reversed(result) if item.out == name)
            result.append(Cache(name, producer.labels, f"the cache: {name} of the earlier tokens, then the new ones",
                                op.section, source=Operand(name, producer.labels), key=pending.pop(name)))
        result.append(op)
    return result


def _with_memoized(module: Module, memoized: dict[str, str]) -> Module:
    """Where the step keeps a cache (``Cache`` ops), the ops that compute fields of a memory input alone (and
    parameters: a decoder's keys and values of the memory, ``Program.memoized``) as one ``Memoized`` op per memory,
    where the first of them stood: the emitted step computes them once per memory, not at every step.

    Run after the passes, on the ops they left (a fused key–value product); the ops moved forward read only the
    memory, parameters and each other. A group whose results are not all named in ``memoized`` stays as it was.
    """
    if not memoized or not any(isinstance(op, Cache) for op in module.ops):
        return module
    ops = list(module.ops)
    parameters = {name for name, info in module.tensors.items() if info.role == "param"}
    for source in [field.name for field in module.inputs if field.role == "memory"]:
        known, inner = {source}, []
        for position, op in enumerate(ops):
            reads = set(op.reads())
            if not isinstance(op, (Cache, Memoized)) and reads & known and reads <= known | parameters:
                inner.append(position)
                known |= {*op.writes(), op.out}
        group = [ops[position] for position in inner]
        rest = [op for position, op in enumerate(ops) if position not in inner]
        read_later = {name for op in rest for name in op.reads()} | {module.output}
        outputs = [(name, op) for op in group for name in op.writes() if name in read_later]
        if not outputs or any(name not in memoized for name, _ in outputs):
            continue
        operands = tuple(Operand(name, _written_labels(op, name)) for name, op in outputs)
        names = ", ".join(name for name, _ in outputs)
        owner = memoized[outputs[0][0]].rpartition(".")[0]
        op = Memoized(operands[0].name, operands[0].labels,
                      f"the cache: {names} computed once per memory (reused while the memory equals the cached copy)",
                      group[0].section, source=source, key=f"{owner}.memory", ops=tuple(group), outputs=operands,
                      keys=tuple(memoized[name] for name, _ in outputs))
        kept = {operand.name for operand in operands}  # cached arrays: never a later in-place update's buffer
        rest = [replace(item, reuse=None) if isinstance(item, Elementwise) and item.reuse in kept else item
                for item in rest]
        ops = rest[:inner[0]] + [op] + rest[inner[0]:]
    return replace(module, ops=ops)


def _with_shared(module: Module) -> Module:
    """The elementwise ops that compute from the token positions alone (and each other: rotary's angles, their
    cosines and sines, their tables) as one ``Shared`` op where the first stood: a stack's layers compute them once.

    Run after the passes, on the ops they left. A grid coordinate read as a value reads the state for its dtype
    and device only (alike in every layer); no op that reads the state itself, a parameter or the support is moved.
    The shared arrays are never a later in-place update's buffer: the next layer reads them.
    """
    fields = [field for field in module.inputs if field.role == "positions"]
    if not fields:
        return module
    known, inner = {field.name for field in fields}, []
    for position, op in enumerate(module.ops):
        expressions = [op.expr] if isinstance(op, Elementwise) else op.entries if isinstance(op, PairTable) else ()
        arrays = {str(item.base.label) for expr in expressions for item in expr.atoms(sp.Indexed)}
        if arrays and arrays <= known:
            inner.append(position)
            known |= {*op.writes(), op.out}
        else:  # a name this op binds anew (a cache's keys and values of every token) is read after it as that
            known -= {*op.writes(), op.out}
    group = [module.ops[position] for position in inner]
    if all(isinstance(op, Elementwise) and isinstance(op.expr, sp.Indexed) for op in group):
        return module  # nothing computed: a copy of the positions (T5's key positions) is as cheap in each layer
    rest = [op for position, op in enumerate(module.ops) if position not in inner]
    read_later = {name for op in rest for name in op.reads()}
    outputs = tuple(Operand(op.out, op.labels) for op in group if op.out in read_later)
    if not outputs:
        return module
    names = ", ".join(operand.name for operand in outputs)
    section = group[0].section  # one branch under one heading
    op = Shared(outputs[0].name, outputs[0].labels,
                f"{names}: from the default positions alone, alike in every layer of a stack (its first computes them)",
                section, ops=tuple(replace(item, section=section) for item in group), outputs=outputs,
                argument=fields[0].argument)
    kept = {operand.name for operand in outputs}
    rest = [replace(item, reuse=None) if isinstance(item, Elementwise) and item.reuse in kept else item
            for item in rest]
    return replace(module, ops=rest[:inner[0]] + [op] + rest[inner[0]:])


def _written_labels(op: Op, name: str) -> tuple[str, ...]:
    """The axes of ``name``, written by ``op`` (one of a fused product's outputs, or its result)."""
    for output, labels in getattr(op, "outputs", ()):
        if output == name:
            return (BATCH, *labels) if labels[:1] != (BATCH,) else labels
    return op.labels


def _with_axis(labels: tuple[str, ...], axis: str, body: sp.Expr) -> tuple[str, ...]:
    """The axes of a reduction's body: ``labels`` with the summed ``axis`` inserted where every
    array of ``body`` reads its axes in order (so that each broadcasts without a transpose);
    last when no position does."""
    reads = [tuple(str(index) for index in item.indices) for item in body.atoms(sp.Indexed)]
    for position in range(len(labels), 0, -1):
        candidate = labels[:position] + (axis,) + labels[position:]
        if all(_in_order(read, candidate) for read in reads):
            return candidate
    return labels + (axis,)


def _in_order(read: tuple[str, ...], labels: tuple[str, ...]) -> bool:
    positions = [labels.index(label) for label in read if label in labels]
    return positions == sorted(positions)


def _reading_order(operand: Operand, out: tuple[str, ...]) -> tuple:
    """State operands first, each ordered by where its axes stand in the output."""
    positions = tuple(out.index(label) if label in out else len(out) for label in operand.labels if label != BATCH)
    return (BATCH not in operand.labels, positions)


def _dropout_sites(program: Program) -> tuple[str, ...]:
    """Where torch puts dropout: each non-projection operator's output (a residual branch)
    and the definitions it names in ``dropout_sites`` (the feed-forward activation)."""
    sites = []
    for record in program.records:
        for evaluation in record.evaluations:
            operator = OPERATOR_KINDS.get(evaluation.kind)
            if operator is None or operator.is_projection:
                continue
            *inner, output = (assignment.target for assignment in evaluation.assignments)
            sites += [name for name in inner if name.rsplit("_", 1)[-1] in operator.dropout_sites] + [output]
    return tuple(sites)


def lower(program: Program, passes=None, network: bool = False) -> Module:
    """The IR of ``program``; ``passes`` (default: ``codegen.passes.DEFAULT``) rewrite it. ``network``: a
    network program's (comments as ``Lowering`` says; no dropout: its functions take none)."""
    from .passes import DEFAULT, run_passes

    lowering = Lowering(program, network=network)
    for record in program.records:
        lowering.record(record.assignments, record.title)
    module = Module(program.name, lowering.tensors, _with_cache(lowering.ops, program.cached), program.output,
                    dropout=() if network else _dropout_sites(program), inputs=program.inputs, constants=program.constants,
                    stream=program.stream, uncached=program.uncached)
    module = run_passes(module, DEFAULT if passes is None else passes)
    module = _with_memoized(module, program.memoized)
    return module if network else _with_shared(module)
