"""The whole pipeline for one scheme or network: derive, lower, emit, report.

Input: a ``Scheme`` or a ``NetworkSpec``. Output: the generated files as ``{path: text}``
(``<backend>/<name>.py``, ``reports/<name>.md``); nothing is written here
(``codegen.output.write_files`` writes them all at once).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

from splitformer.symbolic.adjoint import Adjoint, derive_adjoint
from splitformer.symbolic.builtins import is_network, network_text
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.latex import align, plain_text, unicode_text
from splitformer.symbolic.network_derivation import derive_network
from splitformer.symbolic.network_spec import NetworkSpec, portable_text
from splitformer.symbolic.plugins import plugin_failures
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import read_source
from splitformer.symbolic.stack import final_norm_kind, final_norm_scheme

from .adjoint import Backward, lower_adjoint
from .ir import Module
from .lowering import lower
from .network_render import lower_network, render_network
from .network_report import network_sections, render_network_report
from .output import PACKAGE_INIT
from .render import render_module
from .report import render_report
from .verification.statements.order import splitting_order

__all__ = ["generate", "generate_network", "show_network", "lower_backward", "lower_scheme", "BACKEND_CHOICES",
           "PACKAGE_INIT"]

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


def _network(spec: NetworkSpec, passes=None) -> tuple[Callable[[str], str], object]:
    """The derived network of ``spec``: its module's source per backend (rendered once each), its program."""
    program = derive_network(spec)
    lowered = cache(partial(lower_network, program, passes))
    return cache(lambda backend: render_network(program, backend, passes, lowered())), program


def generate_network(spec: NetworkSpec, backends: tuple[str, ...], out: Path, passes=None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for the model ``spec`` under ``out``."""
    source, program = _network(spec, passes)
    files = {out / "__init__.py": PACKAGE_INIT}
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        files[out / backend / f"{spec.module_name}.py"] = source(backend)
    files[out / "reports" / f"{spec.module_name}.md"] = render_network_report(program)
    return files


def show_network(spec: NetworkSpec, form: str, name_or_path: str) -> str:
    """``splitformer show`` of a network (read from ``name_or_path``): its file, its report, or its discrete stages."""
    if form == "toml":
        if is_network(name_or_path):
            return network_text(name_or_path).rstrip("\n")
        text = read_source(Path(name_or_path), "network file").removeprefix("\ufeff")
        return portable_text(text, Path(name_or_path)).rstrip("\n")
    source, program = _network(spec)
    source("numpy")  # a network that cannot be emitted is not shown either (render_network refuses it)
    if form == "markdown":
        return render_network_report(program).rstrip("\n")
    if form == "latex":  # one align* environment: each section's title, each operator's, its assignments
        return align([row for section in network_sections(program).sections
                      for row in [("text", section.title.replace("$", ""))] + [
                          row for stage in section.stages
                          for row in ([("text", f"{stage.operator.key} ({stage.operator.kind})")]
                                      if hasattr(stage, "operator") else [])
                          + [("equation", a.quadrature) for a in getattr(stage, "assignments", (stage,))]]])
    lines = [f"{spec.name}: {spec.summary}", ""]
    for section in network_sections(program).sections:  # plain text: no $…$, Δt for \Delta t
        lines.append(unicode_text(section.title.replace("$", "")))
        if not section.stages and section.text and "\n" not in section.text:  # a section that is one remark
            lines.append("  " + unicode_text(section.text.replace("$", "")))
        for stage in section.stages:
            if hasattr(stage, "operator"):
                lines.append(f"  {stage.operator.key} ({stage.operator.kind})")
            lines.extend(f"    {a.lhs} = {plain_text(a.rhs)}" for a in getattr(stage, "assignments", (stage,)))
    return "\n".join(lines)
