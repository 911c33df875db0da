"""Operators of vision models: the initial condition (patch embedding) and the readout.

They act between the image plane and the token domain, so besides the ``Operator``
protocol they say where their variables sit on the pixel grid (``positions``) and which
fields they read at shifted points (``sampled``); ``image.ShiftedGrid`` discretizes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import FEATURES, TOKENS, X, XI, Y
from .image import C, CLASSES, CHANNELS, KERNEL_COLS, KERNEL_ROWS, O, PIXEL, SIGMA1, SIGMA2, X1, X2
from .operators import STATE, Definition, Operator, Parameter, apply, register_operator
from .quadrature import integral

__all__ = ["PatchEmbedding", "ClassTokenHead", "PATCH", "IMAGE", "CLASS_NODE"]

#: The patch size ``P``: the embedding's kernel size and stride (``patch_size`` in code).
PATCH = sp.Symbol("P", integer=True, positive=True)
#: The input image ``I(c, ρ_1, ρ_2)`` (channels first, as ``pixel_values``).
IMAGE = "I"
#: The class token's node ``x_cls`` of the token domain ``Ω_x = {x_cls} ∪ Ω_grid``.
CLASS_NODE = sp.Symbol(r"x_{\mathrm{cls}}", real=True)


@register_operator
@dataclass(frozen=True)
class PatchEmbedding(Operator):
    """``f(x, y) = ∫_{Ω_c} ∫_{patch} W(c, σ, y) I(c, x + σ) dσ dc + b(y)`` on the patch grid.

    A linear integral transform from the image plane to the token grid whose kernel is
    supported on the patch ``[0, P Δ)²`` after ``x``: a convolution with stride = kernel = ``P``.
    The class node gets the learned value ``c(y)``; every node adds the position term ``E(x, y)``.
    """

    kind: ClassVar[str] = "patch-embedding"
    discretization: ClassVar[str] = r"""The image $I(c, \rho)$ lives on the image plane with pixel spacing
$\Delta$ and channels $\Omega_c$; the kernel is supported on the patch after $x$, so the token grid is the pixel grid
coarsened by the patch size $P$ (stride $= P$) and the patch offsets are pixels. The image read at $x + \sigma$ is read
at the index $(x + \sigma)/\Delta$; the kernel absorbs $\Delta^2 \Delta c$, and $\Delta$ cancels."""
    model_only: ClassVar[bool] = True  # acts on a vision model\'s grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{E}"

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            Parameter("W", "W", "W^{E}", (C, SIGMA1, SIGMA2, Y), (CHANNELS, KERNEL_ROWS, KERNEL_COLS, FEATURES),
                      (C, SIGMA1, SIGMA2)),
            Parameter("b", "b", "b^{E}", (Y,), (FEATURES,)),
            Parameter("cls", "cls", r"c^{\mathrm{cls}}", (Y,), (FEATURES,)),
            Parameter("pos", "pos", "E", (X, Y), (TOKENS, FEATURES)),
        )

    def positions(self) -> dict[sp.Symbol, sp.Expr]:
        """Patch corners every ``P`` pixels; offsets inside the patch every pixel."""
        return {X1.symbol: PATCH * PIXEL * X1.index, X2.symbol: PATCH * PIXEL * X2.index,
                SIGMA1.symbol: PIXEL * SIGMA1.index, SIGMA2.symbol: PIXEL * SIGMA2.index,
                C.symbol: CHANNELS.spacing * C.index}

    def sampled(self) -> dict[str, tuple[sp.Expr, ...]]:
        return {IMAGE: (CHANNELS.spacing, PIXEL, PIXEL)}

    def sizes(self) -> dict[sp.Symbol, sp.Expr]:
        """The kernel's support is one patch."""
        return {KERNEL_ROWS.size: PATCH}

    def definitions(self) -> tuple[Definition, ...]:
        image = sp.Function(IMAGE)(C.symbol, X1.symbol + SIGMA1.symbol, X2.symbol + SIGMA2.symbol)
        kernel = apply("W", C, SIGMA1, SIGMA2, Y)
        transform = integral(integral(integral(kernel * image, SIGMA2), SIGMA1), C) + apply("b", Y)
        return (Definition("f", "f", (X1, X2, Y), transform,
                           "patch embedding: a linear integral transform over each patch (convolution, stride = patch)"),)


@register_operator
@dataclass(frozen=True)
class ClassTokenHead(Operator):
    """The readout: the point functional at the class node, then a linear head.

    ``z(y) = ⟨δ_{x_cls}, u(·, y)⟩_{Ω_x} = u(x_cls, y)``, ``ℓ(o) = ∫_{Ω_y} W(y, o) z(y) dy + b(o)``.
    """

    kind: ClassVar[str] = "class-token-head"
    discretization: ClassVar[str] = (r"The class node is node $0$ of the token domain (HF averages over the one class"
                                     " token: the same).")
    model_only: ClassVar[bool] = True  # acts on a vision model\'s grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{R}"

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            Parameter("W", "W", "W^{H}", (XI, O), (FEATURES, CLASSES), (XI,)),
            Parameter("b", "b", "b^{H}", (O,), (CLASSES,)),
        )

    def positions(self) -> dict[sp.Symbol, sp.Expr]:
        """The class node is the first node of the token domain (HF's order)."""
        return {CLASS_NODE: sp.Integer(0), Y.symbol: FEATURES.spacing * Y.index}

    def sampled(self) -> dict[str, tuple[sp.Expr, ...]]:
        return {STATE: (TOKENS.spacing, FEATURES.spacing)}

    def definitions(self) -> tuple[Definition, ...]:
        point = sp.Function(STATE)(CLASS_NODE, Y.symbol)
        head = integral(apply("W", XI, O) * apply("z", XI), XI) + apply("b", O)
        return (
            Definition("z", "z", (Y,), point, r"the point functional $\delta_{x_{\mathrm{cls}}}$: the class node's state"),
            Definition("logits", r"\ell", (O,), head, "a linear head: an affine integral transform over features"),
        )
