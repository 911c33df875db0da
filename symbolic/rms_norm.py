"""RMSNorm as a projection, defined through the public operator API only.

The constraint set is the sphere ``S_rms(σ) = { u : mean_y u² = σ² }`` (for each token); the
ghost coordinate carries ``ε`` as for LayerNorm, so the generic deriver yields
``v/√(mean v² + ε)`` for ``σ = 1``; the gain is the diagonal affine substep after it. The
result equals ``x / sqrt(mean(x²) + ε) * g`` (``torch.nn.RMSNorm``), which ``splitformer
check`` proves symbolically (``rms-norm/closed-form``). Canonical parameter: ``<key>.gain``.
For ``mean v² = 0`` (``v = 0``) every point of the sphere is nearest: the projection needs
``ρ > 0``, which ``ε > 0`` provides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .constraints import SYMBOLS, G, U, ConstraintSet, Moment, Statistic
from .operators import ProjectionOperator, register_operator

__all__ = ["RMSNorm", "SPHERE", "RADIUS", "MEAN_SQUARE"]

#: The sphere's radius σ and the statistic ρ = mean_y v².
RADIUS = sp.Symbol(r"\sigma", positive=True)
MEAN_SQUARE = sp.Symbol(r"\rho", positive=True)

SPHERE = ConstraintSet(
    name="S_rms",
    latex=r"S_{\mathrm{rms}}(\sigma) = \{u : \mathrm{mean}_y\, u^2 = \sigma^2\}",
    moments=(Moment(U**2, RADIUS**2, G**2),),
    statistics=(Statistic("rho", MEAN_SQUARE, r"\rho", SYMBOLS.v**2, "mean square over features"),),
    ghost=True,
)


@register_operator
@dataclass(frozen=True)
class RMSNorm(ProjectionOperator):
    """Projection onto the sphere ``S_rms(1)`` (ε through the ghost coordinate), then the gain."""

    kind: ClassVar[str] = "rms-norm"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_{\mathrm{rms}}}"
    constraint: ClassVar[str] = r"S_{\mathrm{rms}}"
    constraints: ClassVar[ConstraintSet] = SPHERE
    values: ClassVar[dict] = {RADIUS: 1}
    affine: ClassVar[tuple[str, ...]] = ("gain",)
    output_latex: ClassVar[str] = r"\mathrm{RMS}"
    projection_meaning: ClassVar[str] = (
        r"projection onto the sphere $S_{\mathrm{rms}}(1)$ with the ghost coordinate $\sqrt{N_y\varepsilon}$ (derived)")
    affine_meaning: ClassVar[str] = "per-feature gain: an explicit step of a diagonal linear map"
