"""The whole pipeline for one model: derive its stages, lower, emit both backends, report.

Input: a ``ModelSpec``. Output: ``{path: text}`` of the files ``splitformer derive`` writes
(nothing is written here): ``numpy/<name>.py``, ``torch/<name>.py``, ``reports/<name>.md``.
"""

from __future__ import annotations

from pathlib import Path

from splitformer.symbolic.model import GridModelSpec, ModelSpec
from splitformer.symbolic.model_derivation import derive_grid_model, derive_model

from .model_render import render_grid_model, render_model
from .model_report import render_grid_report, render_model_report
from .pipeline import PACKAGE_INIT

__all__ = ["generate_model"]


def generate_model(spec: ModelSpec | GridModelSpec, backends: tuple[str, ...], out: Path, passes=None) -> dict[Path, str]:
    """The files ``splitformer derive`` writes for the model ``spec`` under ``out``."""
    grid = isinstance(spec, GridModelSpec)
    model = derive_grid_model(spec) if grid else derive_model(spec)
    files = {out / "__init__.py": PACKAGE_INIT}
    for backend in backends:
        files[out / backend / "__init__.py"] = PACKAGE_INIT
        files[out / backend / f"{model.name}.py"] = (render_grid_model(model, backend) if grid
                                                     else render_model(model, backend, passes))
    files[out / "reports" / f"{model.name}.md"] = render_grid_report(model) if grid else render_model_report(model)
    return files
