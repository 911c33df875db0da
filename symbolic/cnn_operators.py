"""Operators of convolutional networks on the 2-D grid; channels are the feature domain.

A state is ``u(c, x_1, x_2)`` (channels first, as ``NCHW``). Each operator reads a field on
a grid of spacing ``h`` and writes one on its own grid:

- ``convolution``: ``∫_{Ω_in} ∫_{supp} W(c, σ, y) u(c, x + σ) dσ dc + b(y)``, a relative kernel
  with local support ``σ = h (r − padding)``, output grid of spacing ``S h`` (stride ``S``);
- ``transposed-convolution`` (prolongation): the fine field at ``x + σ`` is
  ``∫_{Ω_in} W(c, σ, y) u(c, x) dc + b(y)``, ``σ = (h/S) r``; with kernel = stride every
  fine node has exactly one coarse node;
- ``batch-norm``: BatchNorm in inference mode, ``γ (u − μ)/√(v + ε) + β``, *derived* to be a
  per-channel affine map ``a(y) u + c(y)`` (collecting the coefficients of ``u``);
- ``relu-projection``: the projection onto ``S_2 = {u ≥ 0}``, derived from its KKT conditions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import FEATURES, XI, Y
from .errors import SplitformerError
from .image import C, CHANNELS, KERNEL_COLS, KERNEL_ROWS, SIGMA1, SIGMA2, X1, X2
from .operators import EPSILON, STATE, Definition, Operator, Parameter, apply, register_operator
from .cvt_operators import config_symbol
from .projections import derive_relu_projection
from .quadrature import integral

__all__ = ["Convolution", "TransposedConvolution", "BatchNorm", "ReluProjection", "STRIDE", "SPACING",
           "channel_variable"]

#: The configurable stride ``S`` (``stride`` in code).
STRIDE = sp.Symbol("S", integer=True, positive=True)
#: The spacing ``h`` of the grid an operator reads.
SPACING = sp.Symbol("h", positive=True)


def channel_variable(domain: str, role: str):
    """The variable of a channel domain: ``c`` → ``Ω_c`` (the block's input channels), ``y`` → ``Ω_y``."""
    if domain == "c":
        return C
    return XI if role == "in" else Y


def _stride(value) -> sp.Expr:
    """``"stride"`` is the block's stride ``S``; another name is a configuration value; else an int."""
    return STRIDE if value == "stride" else config_symbol(value)


@dataclass(frozen=True)
class _GridOperator(Operator):
    """Options every grid operator takes from a network file."""

    inputs: str = "y"
    outputs: str = "y"

    #: Whether the operator sums over its input channels (a convolution): then they need their own index.
    contracts_channels: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.contracts_channels and self.inputs == self.outputs == "c":  # one index for the input and output channel
            raise SplitformerError(f'operator {self.key!r}: inputs and outputs are both "c"; a grid operator maps the '
                                   'input channels c to the features y (inputs = "c"), y to y, or y to c (outputs = "c")')
        if not self.contracts_channels and self.inputs != self.outputs:  # per channel: it writes the channels it reads
            raise SplitformerError(f'operator {self.key!r}: inputs = "{self.inputs}" and outputs = "{self.outputs}"; '
                                   f'{self.kind} acts on each channel alone and writes the channels it reads: give '
                                   "inputs only")

    def field(self, *arguments) -> sp.Expr:
        return sp.Function(STATE)(channel_variable(self.inputs, "in").symbol, *arguments)


@register_operator
@dataclass(frozen=True)
class Convolution(_GridOperator):
    """A (strided, padded) convolution: a relative kernel with local support over the grid."""

    kernel: int = 3
    contracts_channels: ClassVar[bool] = True
    stride: object = 1
    padding: int = 0
    kind: ClassVar[str] = "convolution"
    discretization: ClassVar[str] = r"""A convolution reads a field on a grid of spacing $h$; with stride $S$ it
writes on the grid of spacing $S h$ and samples its kernel's support at $\sigma = h (r - \text{padding})$: the field
read at $x + \sigma$ is read at index $(x + \sigma)/h = S p + r - \text{padding}$ (zero outside the grid). Its kernel
is **relative** ($k(\tilde x - x)$) with **local support**, and absorbs $h$: the spacing cancels."""
    model_only: ClassVar[bool] = True  # acts on a network's grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{K}"

    def parameters(self) -> tuple[Parameter, ...]:
        c, y = channel_variable(self.inputs, "in"), channel_variable(self.outputs, "out")
        return (Parameter("W", "W", "W", (c, SIGMA1, SIGMA2, y), (c.domain, KERNEL_ROWS, KERNEL_COLS, y.domain),
                          (c, SIGMA1, SIGMA2)),
                Parameter("b", "b", "b", (y,), (y.domain,)))

    def positions(self) -> dict[sp.Symbol, sp.Expr]:
        stride = _stride(self.stride)
        c = channel_variable(self.inputs, "in")
        return {X1.symbol: stride * SPACING * X1.index, X2.symbol: stride * SPACING * X2.index,
                SIGMA1.symbol: SPACING * (SIGMA1.index - config_symbol(self.padding)),
                SIGMA2.symbol: SPACING * (SIGMA2.index - config_symbol(self.padding)), c.symbol: c.domain.spacing * c.index}

    def sampled(self) -> dict[str, tuple[sp.Expr, ...]]:
        return {STATE: (channel_variable(self.inputs, "in").domain.spacing, SPACING, SPACING)}

    def sizes(self) -> dict[sp.Symbol, sp.Expr]:
        return {KERNEL_ROWS.size: config_symbol(self.kernel)}

    def definitions(self) -> tuple[Definition, ...]:
        c, y = channel_variable(self.inputs, "in"), channel_variable(self.outputs, "out")
        kernel = apply("W", c, SIGMA1, SIGMA2, y)
        body = kernel * self.field(X1.symbol + SIGMA1.symbol, X2.symbol + SIGMA2.symbol)
        value = integral(integral(integral(body, SIGMA2), SIGMA1), c) + apply("b", y)
        return (Definition("out", r"\mathcal{K}", (y, X1, X2), value,
                           rf"convolution: kernel {self.kernel}×{self.kernel}, stride {self.stride}, "
                           f"padding {self.padding} (a relative kernel with local support)"),)


@register_operator
@dataclass(frozen=True)
class TransposedConvolution(_GridOperator):
    """Prolongation to a grid ``kernel`` times finer (kernel = stride: no overlaps)."""

    kernel: int = 2
    contracts_channels: ClassVar[bool] = True
    kind: ClassVar[str] = "transposed-convolution"
    discretization: ClassVar[str] = r"""A transposed convolution with kernel = stride $= S$ writes on the grid of
spacing $h/S$: the fine node $x + \sigma$, $\sigma = (h/S) r$, has index $S p + r$ and exactly one coarse node $x$."""
    model_only: ClassVar[bool] = True  # acts on a network's grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{P}"

    def parameters(self) -> tuple[Parameter, ...]:
        c, y = channel_variable(self.inputs, "in"), channel_variable(self.outputs, "out")
        return (Parameter("W", "W", "W", (c, SIGMA1, SIGMA2, y), (c.domain, KERNEL_ROWS, KERNEL_COLS, y.domain), (c,)),
                Parameter("b", "b", "b", (y,), (y.domain,)))

    def positions(self) -> dict[sp.Symbol, sp.Expr]:
        c = channel_variable(self.inputs, "in")
        fine = SPACING / self.kernel
        return {X1.symbol: SPACING * X1.index, X2.symbol: SPACING * X2.index,
                SIGMA1.symbol: fine * SIGMA1.index, SIGMA2.symbol: fine * SIGMA2.index,
                c.symbol: c.domain.spacing * c.index, Y.symbol: FEATURES.spacing * Y.index,
                C.symbol: CHANNELS.spacing * C.index}

    def sampled(self) -> dict[str, tuple[sp.Expr, ...]]:
        y = channel_variable(self.outputs, "out")
        return {"out": (y.domain.spacing, SPACING / self.kernel, SPACING / self.kernel)}

    def sizes(self) -> dict[sp.Symbol, sp.Expr]:
        return {KERNEL_ROWS.size: sp.Integer(self.kernel)}

    def targets(self) -> dict[str, sp.Expr]:
        """The definition's left-hand side: the fine field at ``x + σ``."""
        y = channel_variable(self.outputs, "out")
        return {"out": sp.Function("out")(y.symbol, X1.symbol + SIGMA1.symbol, X2.symbol + SIGMA2.symbol)}

    def definitions(self) -> tuple[Definition, ...]:
        c, y = channel_variable(self.inputs, "in"), channel_variable(self.outputs, "out")
        value = integral(apply("W", c, SIGMA1, SIGMA2, y) * self.field(X1.symbol, X2.symbol), c) + apply("b", y)
        return (Definition("out", r"\mathcal{P}", (y, X1, X2), value,
                           f"prolongation (transposed convolution, kernel = stride = {self.kernel}): "
                           "each fine node x + σ gets its coarse node x"),)


@register_operator
@dataclass(frozen=True)
class BatchNorm(_GridOperator):
    """BatchNorm in inference mode: derived to be the per-channel affine map ``a u + c``."""

    kind: ClassVar[str] = "batch-norm"
    discretization: ClassVar[str] = r"""BatchNorm in inference mode is not a projection: its statistics are frozen,
and $\gamma (u - \mu)/\sqrt{v + \varepsilon} + \beta$ is, collected in $u$, the per-channel affine map
$a(y) u + c(y)$."""
    model_only: ClassVar[bool] = True  # acts on a network's grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{B}"

    def parameters(self) -> tuple[Parameter, ...]:
        y = channel_variable(self.outputs, "out")
        return tuple(Parameter(name, name, latex, (y,), (y.domain,))
                     for name, latex in (("gain", r"\gamma"), ("bias", r"\beta"), ("mean", r"\mu"), ("var", "v")))

    def definitions(self) -> tuple[Definition, ...]:
        y = channel_variable(self.outputs, "out")
        u = sp.Function(STATE)(y.symbol, X1.symbol, X2.symbol)
        gain, bias, mean, var = (apply(name, y) for name in ("gain", "bias", "mean", "var"))
        normalized = gain * (u - mean) / sp.sqrt(var + EPSILON) + bias
        scale, shift = sp.expand(normalized).coeff(u, 1), sp.expand(normalized).coeff(u, 0)
        if sp.expand(scale * u + shift - normalized) != 0:
            raise AssertionError("BatchNorm is not affine in u")
        return (
            Definition("a", "a", (y,), scale, r"the coefficient of $u$ in $\gamma (u - \mu)/\sqrt{v + \varepsilon} + \beta$"),
            Definition("c", "c", (y,), shift, "the constant term"),
            Definition("out", r"\mathcal{B}", (y, X1, X2), apply("a", y) * u + apply("c", y),
                       "BatchNorm (inference): a per-channel affine map"),
        )


@register_operator
@dataclass(frozen=True)
class ReluProjection(_GridOperator):
    """The projection onto ``S_2 = {u ≥ 0}`` (ReLU), from the KKT conditions."""

    kind: ClassVar[str] = "relu-projection"
    model_only: ClassVar[bool] = True  # acts on a network's grids, not in block schemes
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_2}"
    is_projection: ClassVar[bool] = True
    constraint: ClassVar[str] = "S_2"

    @property
    def discretization(self) -> str:
        """ReLU's derivation from the KKT conditions, step by step."""
        return "ReLU is the projection onto $S_2 = \\{u \\ge 0\\}$, derived from its KKT conditions:\n\n" + "\n".join(
            f"{n}. {text}: $ {latex} $" for n, (text, latex) in enumerate(derive_relu_projection().steps, 1))

    def parameters(self) -> tuple[Parameter, ...]:
        return ()

    def definitions(self) -> tuple[Definition, ...]:
        y = channel_variable(self.outputs, "out")
        projection = derive_relu_projection().formula
        (v,) = projection.free_symbols
        value = projection.xreplace({v: sp.Function(STATE)(y.symbol, X1.symbol, X2.symbol)})
        return (Definition("out", r"\mathrm{Proj}_{S_2}", (y, X1, X2), value,
                           r"projection onto $S_2 = \{u \ge 0\}$ (derived from its KKT conditions)"),)
