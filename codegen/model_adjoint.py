"""Lowering of network programs' reads (``StageLowering``: a read at shifted points, ``I[c, P p + r,
P q + s]``, becomes a ``Window`` view then an ordinary contraction; a read at a fixed node, ``u[0, l]``,
a ``Point``; a write at shifted points an ``Interleave``) and of their derived adjoints
(``symbolic.model_adjoint``).

Input: an ``Adjoint`` whose forward is a stage program (an embedding, a readout) or a grid
step. Output: the IR of its adjoint assignments (``lower_adjoint_assignments``); for a
stage, a ``StageBackward``: the forward statements the adjoint reads (none for a linear
embedding) and the adjoint, as one function from the costate of the stage's output to the
costate of its input and the gradients of its controls.

Reads at a pattern become views (``Window``, ``Point``, ``Rows``); an adjoint written at a
pattern is computed per coarse node and offset, then folded into an array shaped like the
forward array (``Fold`` for a window, ``Place`` for a point, ``PlaceRows`` for grid rows of the
token axis); a control's gradient sums over the batch (``codegen.adjoint``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from splitformer.symbolic.adjoint import Adjoint, is_plain
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.image import IMAGE_VARIABLES, KERNEL_COLS, KERNEL_ROWS
from splitformer.symbolic.latex import to_latex
from splitformer.symbolic.program import Assignment, Program

from .adjoint import AdjointLowering
from .ir import BATCH, Contraction, Module, TensorInfo
from .lowering import Lowering
from .model_ir import Fold, Interleave, Place, PlaceRows, Point, Rows, Window

__all__ = ["StageBackward", "lower_stage_adjoint", "lower_adjoint_assignments", "StageLowering", "StageAdjointLowering",
           "shifted_read", "KERNEL_OFFSETS",
           "flattened_index"]


_DOMAINS = {str(variable.index): variable.domain for variable in IMAGE_VARIABLES.values()}
#: The labels of a convolution's kernel offsets (its kernel rows and columns).
KERNEL_OFFSETS = {str(variable.index) for variable in IMAGE_VARIABLES.values()
                  if variable.domain in (KERNEL_ROWS, KERNEL_COLS)}


def shifted_read(index: sp.Expr) -> tuple[sp.Idx, sp.Idx, sp.Expr, sp.Expr]:
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


def _shifted_axes(indices) -> tuple[list, list, list, list, set]:
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
        point, offset, stride, padding = shifted_read(index)
        kept.append(point)
        offsets.append(offset)
        axes.append(position + 1)
        shapes.add((offset.upper + 1, stride, padding))
    return kept, offsets, axes, points, shapes


class StageLowering(Lowering):
    """The lowering of a model stage's assignments: shifted reads of convolutions, grids, patches."""

    def __init__(self, name: str, tensors: dict, output: str):
        self.program = Program(name, tensors, [], output)
        self.tensors: dict[str, TensorInfo] = {}
        self.ops = []
        self.temporaries = 0
        for name, tensor in tensors.items():
            if tensor.role == "temp":
                continue
            labels = tuple(str(index) for index in tensor.indices)
            view = None
            if tensor.role == "param" and len(labels) != len(tensor.shape):  # heads split a feature axis
                view = tuple(_DOMAINS[label] for label in labels)
            self.tensors[name] = TensorInfo(name, tensor.role, (BATCH,) + labels if tensor.batched else labels,
                                            tensor.parameter, tensor.shape, view, tensor.kind)

    def viewed(self, assignment: Assignment, section: str, view) -> Assignment:
        """``assignment`` with each read at a pattern (an index not plain) replaced by the plain read
        ``view(read, assignment, section)`` returns (a view it lowered)."""
        reads = sorted(assignment.rhs.atoms(sp.Indexed), key=sp.default_sort_key)
        return replace(assignment, rhs=assignment.rhs.xreplace({
            read: view(read, assignment, section) for read in reads
            if not all(isinstance(index, sp.Idx) for index in read.indices)}))

    def assignment(self, assignment: Assignment, section: str = "") -> None:
        reads = {str(read.base.label) for read in assignment.rhs.atoms(sp.Indexed)}
        if reads and all(name in self.tensors and self.tensors[name].role == "param" for name in reads):
            # computed from parameters alone (BatchNorm's a, c): no batch axis, like a parameter
            labels = tuple(str(index) for index in assignment.lhs.indices)
            self.tensors[assignment.target] = TensorInfo(assignment.target, "param", labels)
        if not all(isinstance(index, sp.Idx) for index in assignment.lhs.indices):
            self.interleave(assignment, section)
            return
        rhs = assignment.rhs
        if isinstance(rhs, sp.Indexed) and any(index.is_Integer for index in rhs.indices):
            index = tuple(int(i) if i.is_Integer else ":" for i in rhs.indices)
            self.ops.append(Point(assignment.target, self.labels(assignment.lhs), source=str(rhs.base.label),
                                  index=(":",) + index).with_comment(assignment.quadrature, section))
            return
        super().assignment(self.viewed(assignment, section, self.window), section)
        self.ops[-1] = self.ops[-1].with_comment(assignment.quadrature, section)

    def interleave(self, assignment: Assignment, section: str) -> None:
        """``out[…, S p + r, …] = value`` → the value per coarse node and offset, then ``Interleave``."""
        kept, offsets, axes, points, shapes = _shifted_axes(assignment.lhs.indices)
        if set(points) != {":"} or any(padding != 0 or stride != size for size, stride, padding in shapes):
            raise SplitformerError(f"{assignment.target}: a prolongation needs kernel = stride and no padding")
        blocks = f"{assignment.target}_blocks"
        self.assignment(replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept + offsets)]), section)
        self.ops.append(Interleave(assignment.target, (BATCH,) + tuple(str(index) for index in kept),
                                   source=blocks, axes=tuple(axes)).with_comment(assignment.quadrature, section))
        self.ops[-2] = self.ops[-2].with_comment("the value at each coarse node and offset", section)

    def window(self, read: sp.Indexed, assignment: Assignment, section: str) -> sp.Indexed:
        kept, offsets, axes, points, shapes = _shifted_axes(read.indices)
        if len(shapes) != 1 or set(points) != {":"}:
            raise SplitformerError(f"{assignment.target}: kernel size, stride and padding must agree on every axis "
                                   "of a read at windows (and no axis read at a node)")
        (size, stride, padding), = shapes
        name = f"{assignment.target}_windows"
        target = sp.IndexedBase(name)[tuple(kept + offsets)]
        labels = (BATCH,) + tuple(str(index) for index in kept + offsets)
        comment = f"{to_latex(read, self.program.latex_names())} at every grid point and kernel offset (a view)"
        self.ops.append(Window(name, labels, source=str(read.base.label), axes=tuple(axes), size=size,
                               stride=stride, padding=padding).with_comment(comment, section))
        return target


@dataclass
class StageBackward:
    """The lowered adjoint of one stage: the forward arrays it recomputes, then the adjoint."""

    forward: Module
    adjoint: Module
    seed: str
    #: canonical parameter name (or the input's name) → gradient array
    gradients: dict[str, str]
    input: str


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


class StageAdjointLowering(StageLowering, AdjointLowering):
    """The lowering of a model stage's adjoint: a stage's reads, an adjoint's accumulations."""

    def __init__(self, adjoint: Adjoint, known: dict):
        program = adjoint.program()
        super().__init__(program.name, program.tensors, "")
        self.shapes = adjoint.shapes
        self.tensors = {**known, **self.tensors}

    def view(self, read: sp.Indexed, assignment, section: str) -> sp.Indexed:
        """A read at a pattern as a view over plain indices."""
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

    def assignment(self, assignment, section: str = "") -> None:
        viewed = self.viewed(assignment, section, self.view)
        if not is_plain(assignment.lhs.indices):
            self.scatter(viewed, section)
        elif not self.summed_array(viewed, section):
            AdjointLowering.assignment(self, viewed, section)
        self.ops[-1] = self.ops[-1].with_comment(assignment.quadrature, section)

    def summed_array(self, assignment, section: str) -> bool:
        """``y = c Σ_K x`` (one array summed over several axes, a costate of BatchNorm's shift) as
        an einsum; whether it was one."""
        info = self.tensors.get(assignment.target)
        factors = sp.Mul.make_args(assignment.rhs)
        sums = [factor for factor in factors if isinstance(factor, sp.Sum)]
        if (info is not None and info.role == "gradient") or len(sums) != 1 or \
                not isinstance(sums[0].function, sp.Indexed):
            return False
        scale = sp.Mul(*(factor for factor in factors if factor is not sums[0]))
        if scale.has(sp.Indexed):
            return False
        self.ops.append(Contraction(assignment.target, self.labels(assignment.lhs), section=section,
                                    operands=(self.operand(sums[0].function),), scale=scale))
        return True

    def scatter(self, assignment, section: str) -> None:
        """``x̄[pattern] = value``: the value per coarse node (and offset), then folded into ``x̄``."""
        target = assignment.target
        if target not in self.shapes:  # an adjoint defined at a pattern, like its forward array
            self.interleave(assignment, section)
            return
        like = self.shapes[target]
        if self.scatter_rows(assignment, like, section):
            return
        kept, offsets, axes, points, shapes = _shifted_axes(assignment.lhs.indices)
        if len(shapes) > 1 or (shapes and any(isinstance(p, int) for p in points)):
            raise SplitformerError(f"{target}: an adjoint written at windows of different shapes, or at windows and points")
        blocks = f"{target}_blocks"
        AdjointLowering.assignment(self, replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept + offsets)]), section)
        self.ops[-1] = self.ops[-1].with_comment("the value at each coarse node and offset", section)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[like].indices)
        if shapes:
            (size, stride, padding), = shapes
            op = Fold(target, labels, source=blocks, like=like, axes=tuple(axes), size=size, stride=stride,
                      padding=padding)
        else:
            op = Place(target, labels, source=blocks, like=like, index=tuple(points))
        self.ops.append(op.with_comment(assignment.quadrature, section))


    def scatter_rows(self, assignment, like: str, section: str) -> bool:
        """``x̄[o + N_2 p + q, l] = value`` (the adjoint of a ``Rows`` view): the value per grid point,
        written back at those token nodes (``PlaceRows``); whether it was one."""
        rows = [(axis, flattened_index(index)) for axis, index in enumerate(assignment.lhs.indices)
                if not isinstance(index, sp.Idx) and not index.is_Integer]
        if len(rows) != 1 or rows[0][1] is None:
            return False
        (axis, (offset, atoms)), = rows
        kept = [index for entry in assignment.lhs.indices
                for index in (atoms if not isinstance(entry, sp.Idx) else (entry,))]
        blocks = f"{assignment.target}_rows"
        AdjointLowering.assignment(self, replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept)]), section)
        self.ops[-1] = self.ops[-1].with_comment("the value at each grid point", section)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[like].indices)
        self.ops.append(PlaceRows(assignment.target, labels, source=blocks, like=like, axis=axis + 1,
                                  offset=offset).with_comment(assignment.quadrature, section))
        return True


def lower_adjoint_assignments(adjoint: Adjoint, known: dict) -> Module:
    """The adjoint assignments of ``adjoint`` lowered; ``known`` holds the forward's tensors
    (which tell the unbatched ones)."""
    lowering = StageAdjointLowering(adjoint, known)
    for record in adjoint.records:
        for assignment in record.assignments:
            lowering.assignment(assignment, record.title)
    return Module(adjoint.forward.name, lowering.tensors, lowering.ops, "")


def lower_stage_adjoint(adjoint: Adjoint, forward_stage: Module, input_name: str) -> StageBackward:
    """The adjoint of a stage program lowered; ``forward_stage`` is the stage's own lowering."""
    program = adjoint.program()
    adjoint_module = replace(lower_adjoint_assignments(adjoint, forward_stage.tensors),
                             output=adjoint.gradients.get(input_name, ""))
    read = {name for op in adjoint_module.ops for name in op.reads()}
    producers = {name: op for op in forward_stage.ops for name in op.writes()}
    needed, stack = [], [name for name in read if name in producers]
    while stack:
        op = producers[stack.pop()]
        if op not in needed:
            needed.append(op)
            stack.extend(name for name in op.reads() if name in producers)
    forward_ops = [op for op in forward_stage.ops if op in needed]
    gradients = {}
    for name, bar in adjoint.gradients.items():
        tensor = program.tensors[name]
        gradients[tensor.parameter if tensor.role == "param" else name] = bar
    return StageBackward(replace(forward_stage, ops=forward_ops), adjoint_module, adjoint.seed, gradients, input_name)

