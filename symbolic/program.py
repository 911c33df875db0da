"""The discrete program: ordered assignments in index notation, with their provenance."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp

from .domains import Domain

__all__ = ["LatexNames", "Tensor", "Assignment", "Evaluation", "SubstepRecord", "Program", "TIME_STEP"]

#: The step size Δt of the time discretization.
TIME_STEP = sp.Symbol(r"\Delta t", positive=True)


class LatexNames(Mapping):
    """Array name → LaTeX name, read from a table of ``Tensor`` without copying it."""

    def __init__(self, tensors: dict[str, "Tensor"]):
        self.tensors = tensors

    def __getitem__(self, name: str) -> str:
        return self.tensors[name].latex

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


@dataclass(frozen=True)
class Tensor:
    """A discrete array: its axes (grid indices), role and LaTeX name.

    ``role`` is ``input`` (the state entering the block), ``state``, ``temp``, ``param``
    (a learned control; ``parameter`` is its canonical name and ``shape`` its canonical
    layout) or ``support`` (the mask indicator χ). Every role but ``param`` has a leading
    batch axis in emitted code.
    """

    name: str
    latex: str
    indices: tuple[sp.Idx, ...]
    role: str
    parameter: str | None = None
    shape: tuple[Domain, ...] | None = None
    kind: str = ""

    @property
    def batched(self) -> bool:
        return self.role != "param"


@dataclass(frozen=True)
class Assignment:
    """``lhs = rhs`` in index notation; ``continuous`` and ``quadrature`` are LaTeX stages."""

    lhs: sp.Indexed
    rhs: sp.Expr
    meaning: str
    continuous: str = ""
    quadrature: str = ""

    @property
    def target(self) -> str:
        return str(self.lhs.base.label)


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of an operator on a discrete field."""

    operator: str
    kind: str
    argument: str
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True)
class SubstepRecord:
    """One substep of the scheme: its time rule and the assignments it produced."""

    title: str
    rule: str
    evaluations: tuple[Evaluation, ...]
    update: Assignment | None

    @property
    def assignments(self) -> list[Assignment]:
        ordered = [assignment for evaluation in self.evaluations for assignment in evaluation.assignments]
        return ordered + ([self.update] if self.update is not None else [])


@dataclass
class Program:
    """Everything the lowering and the report need from a derivation."""

    name: str
    tensors: dict[str, Tensor]
    records: list[SubstepRecord]
    output: str
    notes: list[str] = field(default_factory=list)

    @property
    def assignments(self) -> list[Assignment]:
        return [assignment for record in self.records for assignment in record.assignments]

    def latex_names(self) -> Mapping[str, str]:
        """The LaTeX name of every array, as a live view (no copy per formula)."""
        return LatexNames(self.tensors)

    def parameters(self) -> list[Tensor]:
        return [tensor for tensor in self.tensors.values() if tensor.role == "param"]
