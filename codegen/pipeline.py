"""The whole pipeline for one scheme: derive, lower, emit, report.

Input: a ``Scheme``. Output: the generated files as ``{path: text}``; nothing is written
here (``codegen.output.write_files`` writes them all at once).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from splitformer.symbolic.adjoint import Adjoint, derive_adjoint
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.plugins import plugin_failures
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.stack import final_norm_kind, final_norm_scheme

from .adjoint import Backward, lower_adjoint
from .ir import Module
from .lowering import lower
from .output import PACKAGE_INIT
from .render import render_module
from .report import render_report
from .verification.statements.order import splitting_order

__all__ = ["generate", "lower_backward", "lower_scheme", "BACKEND_CHOICES", "PACKAGE_INIT"]

BACKEND_CHOICES = {"numpy": ("numpy",), "torch": ("torch",), "all": ("numpy", "torch")}


@cache
def _final_norm(kind: str) -> tuple[Program, Adjoint]:
    """A stack's final norm of ``kind``, derived with its adjoint once per process (schemes share it)."""
    program = derive(final_norm_scheme(kind))
    return program, derive_adjoint(program)


def lower_scheme(scheme: Scheme, program: Program, passes=None) -> tuple[Module, Module]:
    """The tensor IR of one step of ``scheme`` (derived as ``program``) and of a stack's final norm."""
    return lower(program, passes), lower(_final_norm(final_norm_kind(scheme))[0], passes)


def lower_backward(scheme: Scheme, program: Program, passes=None,
                   adjoint: Adjoint | None = None) -> tuple[Backward, Backward]:
    """The derived adjoints of one step of ``scheme`` (``adjoint`` when already derived) and of a
    stack's final norm, lowered."""
    return (lower_adjoint(adjoint or derive_adjoint(program), passes),
            lower_adjoint(_final_norm(final_norm_kind(scheme))[1], passes))


def generate(scheme: Scheme, backends: tuple[str, ...], out: Path, passes=None,
             program: Program | None = None, lowered: tuple[Module, Module] | None = None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for ``scheme`` under ``out``; ``program`` and
    ``lowered`` (``lower_scheme``'s result) skip the stages already done. An error a plug-in kind
    causes is one ``SplitformerError`` line (``plugin_failures``)."""
    with plugin_failures(scheme):
        return _generate(scheme, backends, out, passes, program, lowered)


def _generate(scheme: Scheme, backends: tuple[str, ...], out: Path, passes, program: Program | None,
              lowered: tuple[Module, Module] | None) -> dict[Path, str]:
    program = program or derive(scheme)
    module, final_norm = lowered or lower_scheme(scheme, program, passes)
    backward, final_backward = lower_backward(scheme, program, passes)
    files = {out / "__init__.py": PACKAGE_INIT}
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        source = render_module(scheme, module, final_norm, backend, backward, final_backward)
        compile(source, f"{backend}/{program.name}.py", "exec")  # never write a module that cannot be imported
        files[out / backend / f"{program.name}.py"] = source
    files[out / "reports" / f"{program.name}.md"] = render_report(scheme, program, out / "plots", backward.symbolic,
                                                                   order=splitting_order(scheme))
    return files
