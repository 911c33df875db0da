"""The whole pipeline for one model: derive its stages, lower, emit both backends, report.

Input: a ``ModelSpec``. Output: ``{path: text}`` of the files ``splitformer derive`` writes
(nothing is written here): ``numpy/<name>.py``, ``torch/<name>.py``, ``reports/<name>.md``.
"""

from __future__ import annotations

from pathlib import Path

from splitformer.symbolic.cvt import derive_cvt
from splitformer.symbolic.builtins import is_model, model_text
from splitformer.symbolic.model import GridModelSpec, ModelSpec, MultiscaleSpec, NetworkSpec
from splitformer.symbolic.scheme_file import read_source
from splitformer.symbolic.model_derivation import derive_grid_model, derive_model

from .model_render import render_cvt, render_grid_model, render_model
from .model_report import render_cvt_report, render_grid_report, render_model_report
from .pipeline import PACKAGE_INIT

__all__ = ["generate_model", "show_model"]


def generate_model(spec: NetworkSpec, backends: tuple[str, ...], out: Path, passes=None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for the model ``spec`` under ``out``."""
    files = {out / "__init__.py": PACKAGE_INIT}
    if isinstance(spec, MultiscaleSpec):
        program = derive_cvt(spec.name, spec.summary)
        for backend in backends:
            files[out / backend / "__init__.py"] = PACKAGE_INIT
            files[out / backend / f"{spec.module_name}.py"] = render_cvt(program, backend)
        files[out / "reports" / f"{spec.module_name}.md"] = render_cvt_report(program)
        return files
    grid = isinstance(spec, GridModelSpec)
    model = derive_grid_model(spec) if grid else derive_model(spec)
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        files[out / backend / f"{model.name}.py"] = (render_grid_model(model, backend) if grid
                                                     else render_model(model, backend, passes))
    files[out / "reports" / f"{model.name}.md"] = render_grid_report(model) if grid else render_model_report(model)
    return files


def show_model(spec: NetworkSpec, form: str, name_or_path: str) -> str:
    """``splitformer show`` of a network (read from ``name_or_path``): its file, its report, or its discrete stages."""
    if form == "toml":
        text = model_text(name_or_path) if is_model(name_or_path) else read_source(Path(name_or_path), "network file")
        return text.removeprefix("\ufeff").rstrip("\n")
    if isinstance(spec, MultiscaleSpec):
        program = derive_cvt(spec.name, spec.summary)
        if form == "markdown":
            return render_cvt_report(program).rstrip("\n")
        lines = [f"{spec.name}: {spec.summary}", ""]
        for stage in program.stages():
            lines.append(f"{stage.operator.key} ({stage.operator.kind})")
            lines.extend(f"    {a.quadrature}" if form == "latex" else f"    {a.lhs} = {a.rhs}" for a in stage.assignments)
        return "\n".join(lines)
    grid = isinstance(spec, GridModelSpec)
    model = derive_grid_model(spec) if grid else derive_model(spec)
    if form == "markdown":
        return (render_grid_report(model) if grid else render_model_report(model)).rstrip("\n")
    lines = [f"{spec.name}: {spec.summary}", ""]

    def show(title: str, assignments) -> None:
        lines.append(title)
        for assignment in assignments:
            lines.append(f"    {assignment.quadrature}" if form == "latex" else f"    {assignment.lhs} = {assignment.rhs}")

    if grid:
        for stage in model.field + model.transfer:
            show(f"{stage.operator.key} ({stage.operator.kind})", stage.assignments)
        show("update", (model.update,))
        if model.projection:
            show(f"{model.projection.operator.key} ({model.projection.operator.kind})", model.projection.assignments)
    else:
        show(f"{model.embedding.operator.key} ({model.embedding.operator.kind})", model.embedding.assignments)
        lines.append(f"steps: {spec.scheme.name} ({spec.scheme.activation}), see splitformer show {spec.scheme.name}")
        show(f"{model.readout.operator.key} ({model.readout.operator.kind})", model.readout.assignments)
    return "\n".join(lines)
