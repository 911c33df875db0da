"""One operator discretized outside a block step: its arrays and assignments on the grids.

The embedding, the readout, a grid step's operators and CvT's operators are discretized here on
the image grids (``image.ShiftedGrid``): kernels absorb the spacings they are integrated against,
the pixel spacing ``Δ`` cancels (a stride and a kernel size are counts of pixels), and feature and
channel grids have unit spacing. A stage is also a program of its own (``stage_program``) and a
record of a larger one (``stage_record``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .cnn_operators import SPACING
from .cvt_operators import KEYS
from .derivation import UNIT_SPACINGS, discretize_definitions, operator_arrays
from .domains import TOKENS
from .image import CHANNELS, CLASSES, IMAGE_VARIABLES, PIXEL, ShiftedGrid
from .latex import superscripted
from .operators import Operator
from .program import Assignment, Evaluation, Program, SubstepRecord, Tensor

__all__ = ["Stage", "field_tensor", "discretize_stage", "stage_record", "stage_program"]

_UNIT = {**UNIT_SPACINGS, CHANNELS.spacing: sp.Integer(1), CLASSES.spacing: sp.Integer(1)}


@dataclass(frozen=True)
class Stage:
    """The discretized definitions of one operator outside the block steps."""

    operator: Operator
    tensors: dict[str, Tensor]
    assignments: tuple[Assignment, ...]

    @property
    def output(self) -> str:
        return self.assignments[-1].target


def field_tensor(name: str, latex: str, indices, role: str, parameter=None, shape=None, kind="") -> Tensor:
    """A discrete array of a stage: a batched field (``input``, ``temp``) or a parameter."""
    return Tensor(name, latex, tuple(indices), role, parameter, shape, kind)


def discretize_stage(operator: Operator, inputs: dict[str, Tensor], prefix: str | None = None) -> Stage:
    """The operator's definitions on the grids; ``inputs`` maps its fields to batched arrays.

    ``prefix`` names the stage's arrays (default: the operator's key; a second application
    of one operator needs another).
    """
    key, prefix = operator.key, prefix or operator.key
    tensors = {tensor.name: tensor for tensor in inputs.values()}
    sizes = getattr(operator, "sizes", dict)()
    for parameter in operator.parameters():
        latex = parameter.latex if "_" in parameter.latex else f"{parameter.latex}_{{{operator.key_latex()}}}"
        # the kernel's offsets over the support the operator fixes (its adjoint's gradient has that range)
        tensors[f"{key}_{parameter.name}"] = field_tensor(
            f"{key}_{parameter.name}", latex, (v.index.xreplace(sizes) for v in parameter.arguments), "param",
            f"{key}.{parameter.name}", parameter.shape, parameter.kind)
    definitions = operator.definitions()
    arrays, absorbed = operator_arrays(operator, definitions, prefix)
    arrays.update({function: sp.IndexedBase(tensor.name) for function, tensor in inputs.items()})
    grid = ShiftedGrid(IMAGE_VARIABLES, arrays, absorbed, getattr(operator, "positions", dict)(),
                       getattr(operator, "sampled", dict)())
    names = {tensor.name: tensor.latex for tensor in tensors.values()}
    names.update({f"{prefix}_{d.function}": superscripted(d.latex, operator.key_latex()) for d in definitions})
    assignments = discretize_definitions(operator, definitions, grid, names, _UNIT,
                                         (PIXEL, SPACING, TOKENS.spacing, KEYS.spacing),
                                         getattr(operator, "targets", dict)(), sizes)
    for assignment in assignments:
        tensors[assignment.target] = field_tensor(assignment.target, names[assignment.target],
                                                  assignment.lhs.indices, "temp")
    return Stage(operator, tensors, assignments)


def stage_record(stage, assignments=None) -> SubstepRecord:
    """One stage's assignments (or ``assignments``) as the record of a program."""
    operator = stage.operator
    evaluation = Evaluation(operator.key, operator.kind, "", tuple(assignments or stage.assignments))
    return SubstepRecord(f"{operator.key}: {operator.kind}", "", (evaluation,), None)


def stage_program(stage) -> Program:
    """One stage alone as a program (its output: the stage's)."""
    return Program(stage.operator.key, dict(stage.tensors), [stage_record(stage)], stage.output)
