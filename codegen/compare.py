"""Schemes side by side: orders, leading error, cost per step, parameters, convergence.

``compare(["post-ln", "macaron", "rk2"])`` derives each scheme and tabulates its order
(own substep solvers), splitting order (exact sub-flows), leading local-error term (scheme − exact: on linear
fields, and the failing trees of nonlinear ones only where the linear term vanishes), the
operator evaluations one step makes and the learned parameters of one block (in terms of
the width ``d`` and the hidden width ``d_ff``). ``as_text``/``as_markdown``/``as_latex``
print the table; ``plot(path)`` draws one convergence plot with every scheme overlaid.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import sympy as sp

from splitformer.symbolic import domains
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.latex import plain_text
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.markdown import inert
from splitformer.symbolic.names import check_distinct

from .api import Derivation, as_scheme, derive
from .convergence import Study, convergence_study, plot_studies
from .verification.across_layers import across_convergence

__all__ = ["Comparison", "Row", "compare", "parameter_count", "evaluation_count", "SIZE_NAMES"]

#: The sizes a parameter count may hold: every domain's name in the code (``d``, ``d_ff``, grouped heads' ``d_kv``,
#: ``n_heads``, …), ``d`` and ``d_ff`` first.
SIZE_NAMES = tuple(sorted({value.code_name for value in vars(domains).values()
                           if isinstance(value, domains.Domain) and value.code_name.isidentifier()},
                          key=lambda name: (name not in ("d", "d_ff"), name)))


def parameter_count(program: Program) -> sp.Expr:
    """Learned numbers of one block, a polynomial in the code's sizes (``d``, ``d_ff``)."""
    total = sp.Integer(0)
    for tensor in program.parameters():
        total += sp.Mul(*(sp.Symbol(domain.code_name, positive=True, integer=True) for domain in tensor.shape))
    return sp.expand(total)


def evaluation_count(program: Program) -> int:
    """Operator evaluations in one step, projections included (an evaluation reused on the
    same field counts once)."""
    return sum(1 for record in program.records for evaluation in record.evaluations
               if evaluation.kind in OPERATOR_KINDS)  # not the stage states of a Runge–Kutta step


@dataclass(frozen=True)
class Row:
    """One scheme of the table; ``leading_error`` is LaTeX, ``leading_error_text`` plain text."""

    scheme: str
    order: int | None
    splitting_order: int | None
    leading_error: str
    leading_error_text: str
    evaluations: int
    parameters: sp.Expr


def _shown(order: int | None) -> str:
    return "—" if order is None else str(order)


def _orders(derivation: Derivation) -> tuple[int | None, int | None, str, str]:
    """Order, splitting order and leading local error (LaTeX, text) of one step; of a scheme combined across layers
    (``[across_layers]``), the stack's (the series of ``symbolic.across_layers``, on ``u' = s G(u)``), not one block's
    Euler step: it is no splitting, and its error is written in ``G`` and its derivatives."""
    across = derivation.scheme.across_layers
    if across is None:
        order = derivation.order
        return order.order, order.splitting_order, order.leading_error, order.leading_error_text
    series = across.order()
    leading = series.leading_in_fields
    return series.order, None, sp.latex(leading), str(leading)


@dataclass
class Comparison:
    """A table of schemes; ``plot`` adds their convergence studies on one set of axes."""

    derivations: list[Derivation]
    sizes: Mapping[str, int] | None = None
    studies: dict[str, Study] = field(default_factory=dict)

    @property
    def rows(self) -> list[Row]:
        rows = []
        for derivation in self.derivations:
            order, splitting, leading, leading_text = _orders(derivation)
            rows.append(Row(derivation.scheme.name, order, splitting, leading, leading_text,
                            evaluation_count(derivation.program), parameter_count(derivation.program)))
        return rows

    def _parameters(self, row: Row, printer) -> str:
        if self.sizes is None:
            return printer(row.parameters)
        values = {symbol: self.sizes[symbol.name] for symbol in row.parameters.free_symbols if symbol.name in self.sizes}
        return str(row.parameters.xreplace(values))

    def as_text(self) -> str:
        header = ["scheme", "order", "splitting", "evaluations", "parameters", "leading local error (own solvers)"]
        table = [header] + [[row.scheme, _shown(row.order), _shown(row.splitting_order), str(row.evaluations),
                             self._parameters(row, plain_text), row.leading_error_text or "0"] for row in self.rows]
        widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
        lines = []
        for line in table:
            cells = [cell.ljust(width) if column in (0, 4) else cell.rjust(width)
                     for column, (cell, width) in enumerate(zip(line, widths))]
            lines.append("  ".join(cells + [line[-1]]).rstrip())
        return "\n".join(lines)

    def as_markdown(self) -> str:
        lines = ["| scheme | order | splitting order | evaluations per step | parameters | leading local error (own solvers) |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for row in self.rows:
            lines.append(f"| `{row.scheme}` | {_shown(row.order)} | {_shown(row.splitting_order)} | {row.evaluations} | "
                         f"${self._parameters(row, sp.latex)}$ | ${row.leading_error}$ |")
        return inert("\n".join(lines), "the comparison")

    def as_latex(self) -> str:
        lines = [r"\begin{tabular}{lrrrll}", r"scheme & order & splitting order & evaluations & parameters & "
                 r"leading local error (own solvers) \\", r"\hline"]
        for row in self.rows:
            name = row.scheme.replace("_", r"\_")
            lines.append(rf"\texttt{{{name}}} & {_shown(row.order).replace('—', '--')} & "
                         rf"{_shown(row.splitting_order).replace('—', '--')} & {row.evaluations} & "
                         rf"${self._parameters(row, sp.latex)}$ & ${row.leading_error}$ \\")
        lines.append(r"\end{tabular}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.as_text()

    def __repr__(self) -> str:
        return f"<Comparison of {', '.join(derivation.scheme.name for derivation in self.derivations)}>"

    def _repr_markdown_(self) -> str:
        return self.as_markdown()

    def plot(self, path: str | Path | None = None):
        """Error against Δt of every scheme with an order, overlaid; saved to ``path`` or returned."""
        if path is not None and (not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes)):
            raise SplitformerError(f"plot: path must be a file path (str or pathlib.Path) or None, got "
                                   f"{type(path).__name__}")
        for derivation, row in zip(self.derivations, self.rows):
            if row.order is None or row.scheme in self.studies:
                continue
            scheme = derivation.scheme
            self.studies[row.scheme] = (convergence_study(scheme, order=row.order) if scheme.across_layers is None
                                        else across_convergence(scheme, row.order)[1])
        return plot_studies(list(self.studies.values()), None if path is None else Path(path))


def compare(schemes: Iterable[Scheme | str], activation: str | None = None,
            sizes: Mapping[str, int] | None = None) -> Comparison:
    """Derive each scheme (``Scheme``, built-in name or file) and tabulate them side by side.

    ``sizes`` (for example ``{"d": 512, "d_ff": 2048}``) turns the parameter counts into numbers.
    """
    if isinstance(schemes, (str, Path, Scheme)):  # one scheme, not the characters of its name
        schemes = [schemes]
    if sizes is not None:
        if not isinstance(sizes, Mapping):
            raise SplitformerError(f"compare: sizes must be a mapping like {{'d': 512, 'd_ff': 2048}}, "
                                   f"got {type(sizes).__name__}")
        for name, value in sizes.items():
            if name not in SIZE_NAMES or isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SplitformerError(f"compare: sizes[{name!r}] = {value!r}; expected sizes among "
                                       f"{', '.join(SIZE_NAMES)} as positive integers")
    derivations = [derive(as_scheme(scheme), activation) for scheme in schemes]
    if not derivations:
        raise SplitformerError("compare: name at least one scheme")
    check_distinct([derivation.scheme.name for derivation in derivations], "compare")
    for derivation in derivations if sizes is not None else ():
        missing = sorted(symbol.name for symbol in parameter_count(derivation.program).free_symbols
                         if symbol.name not in sizes)
        if missing:  # a count half numbers, half symbols ("n_heads + 2224") reads as a number it is not
            given = ",".join(f"{name}={value}" for name, value in sizes.items())
            raise SplitformerError(f"compare: the parameters of {derivation.scheme.name!r} also depend on "
                                   f"{', '.join(missing)}: give {'it' if len(missing) == 1 else 'them'} too "
                                   f"(--sizes {given},{missing[0]}=…)")
    return Comparison(derivations, sizes)
