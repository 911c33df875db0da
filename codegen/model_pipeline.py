"""The whole pipeline for one model: derive its stages, lower, emit both backends, report.

Input: a ``ModelSpec``. Output: ``{path: text}`` of the files ``splitformer derive`` writes
(nothing is written here): ``numpy/<name>.py``, ``torch/<name>.py``, ``reports/<name>.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

from splitformer.symbolic.cvt import derive_cvt
from splitformer.symbolic.builtins import is_model, model_text
from splitformer.symbolic.model import GridModelSpec, MultiscaleSpec, NetworkSpec
from splitformer.symbolic.scheme_file import read_source
from splitformer.symbolic.model_derivation import derive_grid_model, derive_model

from .model_render import render_cvt, render_grid_model, render_model
from .model_report import network_sections, render_network_report
from .pipeline import PACKAGE_INIT

__all__ = ["generate_model", "show_model"]


def _network(spec: NetworkSpec, passes=None) -> tuple[Callable[[str], str], object]:
    """The derived network of ``spec``: its module's source per backend (rendered once each), its program."""
    if isinstance(spec, MultiscaleSpec):
        program = derive_cvt(spec.name, spec.summary)
        return cache(partial(render_cvt, program)), program
    if isinstance(spec, GridModelSpec):
        program = derive_grid_model(spec)
        return cache(partial(render_grid_model, program)), program
    program = derive_model(spec)
    return cache(partial(render_model, program, passes=passes)), program


def generate_model(spec: NetworkSpec, backends: tuple[str, ...], out: Path, passes=None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for the model ``spec`` under ``out``."""
    source, program = _network(spec, passes)
    files = {out / "__init__.py": PACKAGE_INIT}
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        files[out / backend / f"{spec.module_name}.py"] = source(backend)
    files[out / "reports" / f"{spec.module_name}.md"] = render_network_report(program, source("numpy"))
    return files


def show_model(spec: NetworkSpec, form: str, name_or_path: str) -> str:
    """``splitformer show`` of a network (read from ``name_or_path``): its file, its report, or its discrete stages."""
    if form == "toml":
        text = model_text(name_or_path) if is_model(name_or_path) else read_source(Path(name_or_path), "network file")
        return text.removeprefix("\ufeff").rstrip("\n")
    source, program = _network(spec)
    if form == "markdown":
        return render_network_report(program, source("numpy")).rstrip("\n")
    lines = [f"{spec.name}: {spec.summary}", ""]
    for section in network_sections(program).sections:
        lines.append(section.title)
        for stage in section.stages:
            if hasattr(stage, "operator"):
                lines.append(f"  {stage.operator.key} ({stage.operator.kind})")
            lines.extend(f"    {a.quadrature}" if form == "latex" else f"    {a.lhs} = {a.rhs}"
                         for a in getattr(stage, "assignments", (stage,)))
    return "\n".join(lines)
