"""Lowering of a whole model program whose chaining is written in index notation (``symbolic.cvt_adjoint``).

Input: a ``Program``: stage assignments and the chaining between them, which reads arrays at
patterns of the token axis (grid rows ``n[o + N_2 p + q, l]``, a node ``n[0, l]``) and writes
token arrays part by part at such patterns (``q_in[0, l]``, then ``q_in[1 + N_2 p + q, l]``).
Output: the IR ``Module`` of its forward (what its adjoint recomputes): a read at a pattern
becomes a view (``Rows``, ``Point``, ``Window``); each part written at a pattern is computed
on its own (grid point first, features last) and the parts are joined along the token axis
(``Join``) at the end of the substep that wrote them.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.adjoint import is_plain
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.program import Assignment, Program

from .ir import BATCH, Module
from .model_adjoint import flattened_index, StageAdjointLowering, StageLowering
from .model_ir import Join
from .passes import NETWORK_STAGE
from .passes.convolution import convolution

__all__ = ["lower_program", "optimized"]


class _ProgramLowering(StageAdjointLowering):
    def __init__(self, program: Program):
        StageLowering.__init__(self, program.name, program.tensors, program.output)
        self.shapes: dict[str, str] = {}
        #: token array → its parts so far: (first token node, part array); the section that wrote them
        self.parts: dict[str, list[tuple[int, str]]] = {}
        self.sections: dict[str, str] = {}

    def assignment(self, assignment: Assignment, section: str = "") -> None:
        reads = {str(read.base.label) for read in assignment.rhs.atoms(sp.Indexed)}
        for name in sorted(reads & set(self.parts)):
            self.join(name)
        assignment = self.viewed(assignment, section, self.view)
        if is_plain(assignment.lhs.indices) or isinstance(assignment.lhs.indices[0], sp.Idx):
            # plain, or written at shifted points of a grid axis (a prolongation: ``Interleave``)
            StageLowering.assignment(self, assignment, section)
        else:
            self.part(assignment, section)

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
        StageLowering.assignment(self, replace(assignment, lhs=sp.IndexedBase(name)[tuple(atoms) + tuple(rest)]),
                                  section)
        parts.append((offset, name))

    def join(self, name: str) -> None:
        parts, section = sorted(self.parts.pop(name)), self.sections.pop(name)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[name].indices)
        self.ops.append(Join(name, labels, section=section, parts=tuple(part for _, part in parts))
                        .with_comment("the parts one after another along the token axis", section))


def lower_program(program: Program) -> Module:
    """The forward IR of ``program`` (no passes: contractions are einsums over views)."""
    lowering = _ProgramLowering(program)
    for record in program.records:
        for assignment in record.assignments:
            lowering.assignment(assignment, record.title)
        for name in list(lowering.parts):  # a record writes whole arrays: its parts are complete
            lowering.join(name)
    return Module(program.name, lowering.tensors, lowering.ops, program.output)


def optimized(module: Module) -> Module:
    """``module`` with its convolutions recognized and the network passes run (``passes.NETWORK_STAGE``)."""
    module = convolution(module)
    for rewrite in NETWORK_STAGE:
        module = rewrite(module)
    return module
