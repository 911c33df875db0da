"""The lowering of a network program's assignments to the IR (the base of ``program_lowering``'s and
``model_adjoint``'s).

A read at shifted points (``I[c, P p + r, P q + s]``) becomes a ``Window`` view followed by
an ordinary contraction; a read at a fixed node (``u[0, l]``) becomes a ``Point``. Every
other assignment is lowered like a block's (``codegen.lowering``).
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.latex import to_latex
from splitformer.symbolic.image import IMAGE_VARIABLES, KERNEL_COLS, KERNEL_ROWS
from splitformer.symbolic.program import Assignment, Program

from .ir import BATCH, TensorInfo
from .lowering import Lowering
from .model_ir import Interleave, Point, Window

__all__ = ["shifted_read", "StageLowering", "KERNEL_OFFSETS"]

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
        replacements = {}
        for read in sorted(rhs.atoms(sp.Indexed), key=sp.default_sort_key):
            if all(isinstance(index, sp.Idx) for index in read.indices):
                continue
            replacements[read] = self.window(read, assignment, section)
        super().assignment(replace(assignment, rhs=rhs.xreplace(replacements)), section)
        self.ops[-1] = self.ops[-1].with_comment(assignment.quadrature, section)

    def interleave(self, assignment: Assignment, section: str) -> None:
        """``out[…, S p + r, …] = value`` → the value per coarse node and offset, then ``Interleave``."""
        kept, offsets, axes = [], [], []
        for position, index in enumerate(assignment.lhs.indices):
            if isinstance(index, sp.Idx):
                kept.append(index)
                continue
            point, offset, stride, padding = shifted_read(index)
            if padding != 0 or stride != offset.upper + 1:
                raise SplitformerError(f"{assignment.target}: a prolongation needs kernel = stride and no padding")
            kept.append(point)
            offsets.append(offset)
            axes.append(position + 1)
        blocks = f"{assignment.target}_blocks"
        self.assignment(replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept + offsets)]), section)
        self.ops.append(Interleave(assignment.target, (BATCH,) + tuple(str(index) for index in kept),
                                   source=blocks, axes=tuple(axes)).with_comment(assignment.quadrature, section))
        self.ops[-2] = self.ops[-2].with_comment("the value at each coarse node and offset", section)

    def window(self, read: sp.Indexed, assignment: Assignment, section: str) -> sp.Indexed:
        axes, kept, points, offsets, shapes = [], [], [], [], set()
        for position, index in enumerate(read.indices):
            if isinstance(index, sp.Idx):
                kept.append(index)
                continue
            point, offset, stride, padding = shifted_read(index)
            axes.append(position + 1)  # after the batch axis
            kept.append(point)
            points.append(point)
            offsets.append(offset)
            shapes.add((offset.upper + 1, stride, padding))
        if len(shapes) != 1:
            raise SplitformerError(f"{assignment.target}: kernel size, stride and padding must agree on every axis")
        (size, stride, padding), = shapes
        name = f"{assignment.target}_windows"
        target = sp.IndexedBase(name)[tuple(kept + offsets)]
        labels = (BATCH,) + tuple(str(index) for index in kept + offsets)
        comment = f"{to_latex(read, self.program.latex_names())} at every grid point and kernel offset (a view)"
        self.ops.append(Window(name, labels, source=str(read.base.label), axes=tuple(axes), size=size,
                               stride=stride, padding=padding).with_comment(comment, section))
        return target
