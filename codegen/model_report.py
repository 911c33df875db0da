"""The derivation report of a model: from the continuous definitions to the emitted code."""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic import __version__
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_programs
from splitformer.symbolic.model_adjoint import derive_model_adjoint, grid_program
from splitformer.symbolic.equation import equation_latex
from splitformer.symbolic.latex import to_latex
from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, KERNEL_ROWS, PIXEL, ROWS
from splitformer.symbolic.model_derivation import TOKENS_DISCRETE, TOKENS_LATEX, GridModelProgram, ModelProgram
from splitformer.symbolic.projections import derive_relu_projection

from .render import environment

__all__ = ["render_model_report", "render_grid_report", "render_cvt_report", "model_check_ids"]


def model_check_ids(name: str, grid: bool = False) -> list[str]:
    """The ``splitformer check`` ids that back a model's report, its derived adjoint's included."""
    if grid:
        return [f"{name}/translation-equivariance", f"{name}/batch-norm-affine", f"adjoint/{name}/finite-difference",
                f"adjoint/{name}/negative-control"]
    return [f"{name}/translation-equivariance", f"recovery/{name}/symbolic", f"recovery/{name}/numeric",
            f"{name}/negative-controls", f"adjoint/{name}/finite-difference", f"adjoint/{name}/negative-control"]


def _positions(operator) -> list[str]:
    positions = getattr(operator, "positions", dict)()
    return [f"{to_latex(symbol)} = {to_latex(position)}" for symbol, position in positions.items()]


def render_model_report(model: ModelProgram) -> str:
    """The Markdown report of ``model``."""
    adjoint = derive_model_adjoint(model)
    domains = [(domain.latex, domain.description, sp.latex(domain.size), domain.code_name)
               for domain in (CHANNELS, KERNEL_ROWS, ROWS, COLS, TOKENS, FEATURES, HEADS, HEAD_FEATURES, HIDDEN, CLASSES)]
    template = environment().get_template("report/model.md.j2")
    return template.render(
        model=model, spec=model.spec, version=__version__, domains=domains, pixel=sp.latex(PIXEL),
        embedding_positions=_positions(model.spec.embedding), readout_positions=_positions(model.spec.readout),
        tokens=TOKENS_LATEX, tokens_discrete=TOKENS_DISCRETE, step_equation=equation_latex(model.spec.scheme),
        checks=model_check_ids(model.spec.name), pieces=_adjoint_pieces(adjoint),
    )


def _adjoint_pieces(adjoint) -> list[tuple[str, object]]:
    """The model's derived adjoint, piece by piece in the order the costate runs."""
    pieces = [("The readout", adjoint.readout)]
    if adjoint.final is not None:
        pieces.append(("The final projection", adjoint.final))
    return pieces + [("One step (each layer)", adjoint.step), ("The initial condition and the patch embedding",
                                                               adjoint.embedding)]


def render_grid_report(model: GridModelProgram) -> str:
    """The Markdown report of a grid step (``resnet-block``, ``unet-level``)."""
    domains = [(domain.latex, domain.description, sp.latex(domain.size), domain.code_name)
               for domain in (CHANNELS, FEATURES, ROWS, COLS, KERNEL_ROWS)]
    operators = [{"key": key, "kind": operator.kind, "positions": _positions(operator),
                  "options": {name: getattr(operator, name) for name in ("kernel", "stride", "padding", "inputs", "outputs")
                              if hasattr(operator, name)}}
                 for key, operator in model.spec.operators.items()]
    template = environment().get_template("report/grid_model.md.j2")
    pieces = [(f"R = {' ∘ '.join(reversed(model.spec.transfer))}" if transfer else "R = 1",
               derive_adjoint(grid_program(model, transfer)))
              for transfer in ((True, False) if model.transfer else (False,))]
    return template.render(model=model, spec=model.spec, version=__version__, domains=domains, operators=operators,
                           relu=derive_relu_projection().steps, checks=model_check_ids(model.spec.name, grid=True),
                           pieces=pieces)


def render_cvt_report(model: CvtProgram) -> str:
    """The Markdown report of the multiscale model ``cvt``."""
    template = environment().get_template("report/cvt.md.j2")
    pieces = [(name, piece.input, derive_adjoint(piece.program))
              for name, piece in reversed(cvt_programs(model).items())]
    return template.render(model=model, version=__version__, pieces=pieces,
                           checks=[f"{model.name}/translation-equivariance", f"{model.name}/batch-norm-affine",
                                   f"{model.name}/key-spacing", f"{model.name}/score-scale",
                                   f"recovery/{model.name}/symbolic", f"recovery/{model.name}/numeric",
                                   f"adjoint/{model.name}/finite-difference", f"adjoint/{model.name}/negative-control"])
