"""The discrete program: ordered assignments in index notation, with their provenance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import sympy as sp

from .domains import Domain
from .inputs import Constant, Input
from .latex import align, plain_text

__all__ = ["LatexNames", "Tensor", "Assignment", "Evaluation", "SubstepRecord", "Program", "TIME_STEP", "Number",
           "entry"]

#: The step size Δt of the time discretization.
TIME_STEP = sp.Symbol(r"\Delta t", positive=True)


class Number(sp.Indexed):
    """The one entry of a 0-d array (a learned scalar, its gradient): an ``Indexed`` without indices.

    SymPy's ``Indexed`` needs an index; this one has none (``indices == ()``), so every pass that
    reads arrays as ``Indexed`` (differentiation, the adjoint, the lowering, the printers) reads it too.
    """

    def __new__(cls, base: sp.IndexedBase | str) -> "Number":
        return sp.Expr.__new__(cls, sp.IndexedBase(base) if isinstance(base, str) else base)

    def _latex(self, printer) -> str:
        return printer._print(self.base)

    def _sympystr(self, printer) -> str:
        return str(self.base.label)


def entry(name: str, indices: tuple = ()) -> sp.Indexed:
    """The entry ``name[indices]`` of an array; of a 0-d array (no indices), its ``Number``."""
    return sp.IndexedBase(name)[tuple(indices)] if indices else Number(name)


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
    layout), ``gradient`` (the adjoint of a control, laid out like it) or ``support`` (the
    mask indicator χ). Every role but ``param`` and ``gradient`` has a leading batch axis
    in emitted code.
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
        return self.role not in ("param", "gradient")


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

    def rows(self) -> list[tuple[str, str]]:
        """The title, the time rule and every assignment, as rows of ``latex.align``."""
        return [("text", self.title), ("equation", self.rule),
                *(("equation", assignment.quadrature) for assignment in self.assignments)]

    def latex(self) -> str:
        return align(self.rows())

    def text(self) -> str:
        """The title and every assignment in index notation, plain text."""
        return "\n".join([self.title, *(f"    {a.lhs} = {plain_text(a.rhs)}" for a in self.assignments)])

    def __str__(self) -> str:
        return self.text()

    def _repr_latex_(self) -> str:
        return self.latex()


@dataclass
class Program:
    """Everything the lowering and the report need from a derivation."""

    name: str
    tensors: dict[str, Tensor]
    records: list[SubstepRecord]
    output: str
    notes: list[str] = field(default_factory=list)
    #: Key-side fields kept for incremental decoding: array name → cache key (``attn_k`` → ``attn.k``).
    cached: dict[str, str] = field(default_factory=dict)
    #: What the operators read besides the state and ``χ``, as they declare it (``symbolic.inputs``).
    inputs: tuple[Input, ...] = ()
    constants: tuple[Constant, ...] = ()
    #: The increment of the second state over the step (``Substep.stream``), computed after ``output``; ``None``: one state.
    stream: str | None = None
    #: Fields computed from a memory input alone, kept once per memory by a cache: array name → cache key
    #: (``cross_k`` → ``cross.k``).
    memoized: dict[str, str] = field(default_factory=dict)
    #: The kinds that read the support with a key in the query's place (``χ(x̃, x)``): a cached step has no such
    #: entries (the earlier tokens as queries of the new ones), so the emitted code refuses a cache.
    uncached: tuple[str, ...] = ()

    @property
    def assignments(self) -> list[Assignment]:
        return [assignment for record in self.records for assignment in record.assignments]

    def latex_names(self) -> Mapping[str, str]:
        """The LaTeX name of every array, as a live view (no copy per formula)."""
        return LatexNames(self.tensors)

    def without_stream(self) -> "Program":
        """The program of the state alone (what ``output`` depends on): the stream's record dropped."""
        if self.stream is None:
            return self
        records = [record for record in self.records if record.update is None or record.update.target != self.stream]
        tensors = {name: tensor for name, tensor in self.tensors.items() if name != self.stream}
        return replace(self, tensors=tensors, records=records, stream=None)

    def parameters(self) -> list[Tensor]:
        return [tensor for tensor in self.tensors.values() if tensor.role == "param"]

    def latex(self, equation: str | None = None, after: Sequence[tuple[str, str]] = ()) -> str:
        """One ``align*`` environment: the equation (when given), then every substep, then the rows ``after``."""
        rows = [("equation", equation)] if equation else []
        return align(rows + [row for record in self.records for row in record.rows()] + list(after))

    def text(self) -> str:
        return "\n".join(record.text() for record in self.records)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Program {self.name}: {len(self.records)} substeps, {len(self.assignments)} assignments>"

    def _repr_latex_(self) -> str:
        return self.latex()
