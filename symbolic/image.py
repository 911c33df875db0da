"""The image plane and the 2-D grids of vision models; sampling a field at shifted points.

A vision model's grids are coarsenings of the pixel grid (spacing ``Δ``): a grid made with
stride ``S`` has spacing ``S Δ``, and a relative kernel ``k(x̃ − x)`` with local support is
sampled on offsets ``σ = Δ (r − padding)``, ``r = 0 … K − 1``. A field read at ``x + σ``
is therefore read at the index ``(x + σ)/Δ = S p + r − padding``: the index arithmetic of a
(strided, padded) convolution is what the grid makes of ``x + σ``, not a rule of its own.
Rows and columns are separate one-dimensional domains (``x = (x_1, x_2)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp

from .domains import VARIABLES, Domain, Variable
from .quadrature import Grid

__all__ = [
    "PIXEL", "CHANNELS", "ROWS", "COLS", "KERNEL_ROWS", "KERNEL_COLS", "CLASSES",
    "X1", "X2", "SIGMA1", "SIGMA2", "C", "O", "IMAGE_VARIABLES", "KERNEL_OFFSETS", "ShiftedGrid", "image_domain",
    "register_variable",
]

#: The pixel spacing ``Δ`` of the image plane.
PIXEL = sp.Symbol(r"\Delta", positive=True)


def image_domain(name: str, size: sp.Expr, spacing: sp.Expr, code_name: str, description: str) -> Domain:
    """A one-dimensional domain whose spacing is a multiple of the pixel spacing."""
    return Domain(name, size, spacing, code_name, description)


def _size(name: str) -> sp.Symbol:
    return sp.Symbol(name, integer=True, positive=True)


CHANNELS = Domain("c", _size("N_c"), sp.Symbol(r"\Delta c", positive=True), "n_channels", "channels of the input field")
ROWS = Domain("x_1", _size("N_1"), sp.Symbol(r"\Delta x_1", positive=True), "n_rows", "rows of the token grid")
COLS = Domain("x_2", _size("N_2"), sp.Symbol(r"\Delta x_2", positive=True), "n_cols", "columns of the token grid")
KERNEL_ROWS = Domain(r"\sigma_1", _size("K"), PIXEL, "kernel_size", "row offsets of a kernel's support")
KERNEL_COLS = Domain(r"\sigma_2", _size("K"), PIXEL, "kernel_size", "column offsets of a kernel's support")
CLASSES = Domain("o", _size("N_o"), sp.Symbol(r"\Delta o", positive=True), "n_classes", "classes of the readout")

X1 = Variable(sp.Symbol("x_1", real=True), ROWS, sp.Idx("p", ROWS.size))
X2 = Variable(sp.Symbol("x_2", real=True), COLS, sp.Idx("q", COLS.size))
SIGMA1 = Variable(sp.Symbol(r"\sigma_1", real=True), KERNEL_ROWS, sp.Idx("r", KERNEL_ROWS.size))
SIGMA2 = Variable(sp.Symbol(r"\sigma_2", real=True), KERNEL_COLS, sp.Idx("s", KERNEL_COLS.size))
C = Variable(sp.Symbol("c", real=True), CHANNELS, sp.Idx("c", CHANNELS.size))
O = Variable(sp.Symbol("o", real=True), CLASSES, sp.Idx("o", CLASSES.size))

#: The block's variables and the image variables together (index letters are einsum labels).
IMAGE_VARIABLES: dict[sp.Symbol, Variable] = {
    **VARIABLES, **{variable.symbol: variable for variable in (X1, X2, SIGMA1, SIGMA2, C, O)},
}


#: The index letters of a convolution's kernel offsets (its kernel rows and columns): ``r`` in a read ``S p + r``.
KERNEL_OFFSETS = frozenset(str(variable.index) for variable in IMAGE_VARIABLES.values()
                           if variable.domain in (KERNEL_ROWS, KERNEL_COLS))


def register_variable(variable: Variable) -> Variable:
    """Make a model's own variable (``cvt``'s key nodes) known to the image grids."""
    IMAGE_VARIABLES[variable.symbol] = variable
    return variable


@dataclass
class ShiftedGrid(Grid):
    """A ``Grid`` that also samples fields at shifted points ``x + σ``.

    ``positions`` gives each variable's point as a function of its index (``x_1 → S Δ p``);
    ``sampled`` names the fields read at shifted points and, per argument, the spacing of
    the grid the field lives on. Their index is ``position / spacing``, expanded.
    """

    positions: Mapping[sp.Symbol, sp.Expr] = field(default_factory=dict)
    sampled: Mapping[str, tuple[sp.Expr, ...]] = field(default_factory=dict)

    def _sample(self, expr):
        name = expr.func.__name__
        if name not in self.sampled:
            return super()._sample(expr)
        indices = tuple(sp.expand(argument.xreplace(self.positions) / spacing)
                        for argument, spacing in zip(expr.args, self.sampled[name]))
        return self.arrays[name][indices]
