"""The whole pipeline for one model: derive its stages, lower, emit both backends, report.

Input: a ``ModelSpec``. Output: ``{path: text}`` of the files ``splitformer derive`` writes
(nothing is written here): ``numpy/<name>.py``, ``torch/<name>.py``, ``reports/<name>.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from splitformer.symbolic.cvt import derive_cvt
from splitformer.symbolic.builtins import is_model, model_text
from splitformer.symbolic.model import GridModelSpec, MultiscaleSpec, NetworkSpec
from splitformer.symbolic.scheme_file import read_source
from splitformer.symbolic.model_derivation import derive_grid_model, derive_model

from .model_render import render_cvt, render_grid_model, render_model
from .model_report import render_cvt_report, render_grid_report, render_model_report
from .pipeline import PACKAGE_INIT

__all__ = ["generate_model", "show_model"]


def _network(spec: NetworkSpec, passes=None) -> tuple[Callable[[str], str], Callable[[], str], list[tuple]]:
    """The derived network of ``spec``: its module's source per backend, its report, and the
    stages ``show`` lists (a title, the assignments)."""
    if isinstance(spec, MultiscaleSpec):
        program = derive_cvt(spec.name, spec.summary)
        return (partial(render_cvt, program), partial(render_cvt_report, program),
                [(stage.operator, stage.assignments) for stage in program.stages()])
    if isinstance(spec, GridModelSpec):
        model = derive_grid_model(spec)
        stages = [(stage.operator, stage.assignments) for stage in model.field + model.transfer]
        stages.append(("update", (model.update,)))
        if model.projection:
            stages.append((model.projection.operator, model.projection.assignments))
        return partial(render_grid_model, model), partial(render_grid_report, model), stages
    model = derive_model(spec)
    return (partial(render_model, model, passes=passes), partial(render_model_report, model),
            [(model.embedding.operator, model.embedding.assignments),
             (f"steps: {spec.scheme.name} ({spec.scheme.activation}), see splitformer show {spec.scheme.name}", ()),
             (model.readout.operator, model.readout.assignments)])


def generate_model(spec: NetworkSpec, backends: tuple[str, ...], out: Path, passes=None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for the model ``spec`` under ``out``."""
    source, report, _ = _network(spec, passes)
    files = {out / "__init__.py": PACKAGE_INIT}
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        files[out / backend / f"{spec.module_name}.py"] = source(backend)
    files[out / "reports" / f"{spec.module_name}.md"] = report()
    return files


def show_model(spec: NetworkSpec, form: str, name_or_path: str) -> str:
    """``splitformer show`` of a network (read from ``name_or_path``): its file, its report, or its discrete stages."""
    if form == "toml":
        text = model_text(name_or_path) if is_model(name_or_path) else read_source(Path(name_or_path), "network file")
        return text.removeprefix("\ufeff").rstrip("\n")
    _, report, stages = _network(spec)
    if form == "markdown":
        return report().rstrip("\n")
    lines = [f"{spec.name}: {spec.summary}", ""]
    for title, assignments in stages:
        lines.append(title if isinstance(title, str) else f"{title.key} ({title.kind})")
        lines.extend(f"    {a.quadrature}" if form == "latex" else f"    {a.lhs} = {a.rhs}" for a in assignments)
    return "\n".join(lines)
