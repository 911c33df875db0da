"""Operators of the convolutional vision Transformer (CvT, Wu et al. 2021).

- ``depthwise-convolution``: ``∫_{supp} W(σ, y) u(y, x + σ) dσ``, a relative kernel per
  channel with local support (no channel integral, no bias), stride and padding configurable;
- ``convolutional-attention``: multi-head attention whose queries are read on the token
  nodes and whose keys and values live on another (coarser) quadrature grid of key nodes
  ``Ω_k``; the score is scaled by ``|Ω_y|^{-1/2}``, the measure of the *whole* feature domain
  ``Ω_y = Ω_h × Ω_e`` (ViT's attention uses the head's ``|Ω_e|^{-1/2}``).

The key grid's spacing ``Δk`` (a stride times the token spacing) cancels between the
softmax kernel and its normalizing integral, as ``Δx`` does on the fine grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import E, FEATURES, H, X, XI, Y, Domain, Variable
from .image import KERNEL_COLS, KERNEL_ROWS, SIGMA1, SIGMA2, X1, X2, register_variable
from .operators import STATE, Definition, Operator, Parameter, apply, register_operator
from .quadrature import integral

__all__ = ["DepthwiseConvolution", "ConvolutionalAttention", "KEYS", "KEY", "KEY_DUMMY", "config_symbol"]

#: The key nodes of convolutional attention (class node and the coarse K/V grid).
KEYS = Domain("k", sp.Symbol("N_k", integer=True, positive=True), sp.Symbol(r"\Delta k", positive=True),
              "n_keys", "key and value nodes (a coarser quadrature grid)")
KEY = register_variable(Variable(sp.Symbol(r"\tilde{x}_k", real=True), KEYS, sp.Idx("t", KEYS.size)))
KEY_DUMMY = register_variable(Variable(sp.Symbol(r"\tilde{\eta}", real=True), KEYS, sp.Idx("w", KEYS.size)))
#: The spacing ``h`` of the grid a depthwise convolution reads.
_SPACING = sp.Symbol("h", positive=True)


def config_symbol(value) -> sp.Expr:
    """A model-file option: an int, or the name of a configuration value (``stride_kv``)."""
    return sp.Symbol(value, integer=True, nonnegative=True) if isinstance(value, str) else sp.Integer(value)


@register_operator
@dataclass(frozen=True)
class DepthwiseConvolution(Operator):
    """One relative kernel per channel: ``∫ W(σ, y) u(y, x + σ) dσ`` on a grid of stride ``S``."""

    kernel: object = 3
    stride: object = 1
    padding: object = 1
    kind: ClassVar[str] = "depthwise-convolution"
    discretization: ClassVar[str] = (r"A depth-wise convolution: one relative kernel $W(\sigma, y)$ per channel, local"
                                     " support, no channel integral.")
    model_only: ClassVar[bool] = True  # acts on a vision model\'s grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{K}^{\mathrm{dw}}"

    def parameters(self) -> tuple[Parameter, ...]:
        return (Parameter("W", "W", "W", (SIGMA1, SIGMA2, Y), (KERNEL_ROWS, KERNEL_COLS, FEATURES), (SIGMA1, SIGMA2)),)

    def positions(self) -> dict[sp.Symbol, sp.Expr]:
        stride, padding = config_symbol(self.stride), config_symbol(self.padding)
        return {X1.symbol: stride * _SPACING * X1.index, X2.symbol: stride * _SPACING * X2.index,
                SIGMA1.symbol: _SPACING * (SIGMA1.index - padding), SIGMA2.symbol: _SPACING * (SIGMA2.index - padding),
                Y.symbol: FEATURES.spacing * Y.index}

    def sampled(self) -> dict[str, tuple[sp.Expr, ...]]:
        return {STATE: (FEATURES.spacing, _SPACING, _SPACING)}

    def sizes(self) -> dict[sp.Symbol, sp.Expr]:
        return {KERNEL_ROWS.size: config_symbol(self.kernel)}

    def definitions(self) -> tuple[Definition, ...]:
        field = sp.Function(STATE)(Y.symbol, X1.symbol + SIGMA1.symbol, X2.symbol + SIGMA2.symbol)
        value = integral(integral(apply("W", SIGMA1, SIGMA2, Y) * field, SIGMA2), SIGMA1)
        return (Definition("out", r"\mathcal{K}_{\mathrm{dw}}", (Y, X1, X2), value,
                           "depth-wise convolution: a relative kernel per channel with local support"),)


@register_operator
@dataclass(frozen=True)
class ConvolutionalAttention(Operator):
    """Attention from query nodes ``x`` to key nodes ``x̃ ∈ Ω_k``; score scale ``|Ω_y|^{-1/2}``."""

    kind: ClassVar[str] = "convolutional-attention"
    discretization: ClassVar[str] = r"""K and V use stride `stride_kv`: their nodes $\tilde x \in \Omega_k$ (the
class node and the grid of spacing $S_{kv} \Delta x$) form a coarser quadrature grid of the same integral
$\int \gamma(x, \tilde x) V(\tilde x)\, d\tilde x$; the kernel absorbs $\Delta k$, which cancels in the softmax as
$\Delta x$ does on the fine grid, whatever the stride. **The score scale.** HF's `CvtSelfAttention` scales by
`embed_dim ** -0.5`: the measure of the whole feature domain, $a = |\Omega_y|^{-1/2} \int_{\Omega_e} Q\,K\, de$ with
$|\Omega_y| = |\Omega_h|\,|\Omega_e|$, at unit spacing $1/\sqrt{N_y} = 1/\sqrt{d}$. ViT's attention uses the head's,
$|\Omega_e|^{-1/2} = 1/\sqrt{d/H}$: the two differ by $|\Omega_h|^{-1/2} = 1/\sqrt{H}$ and agree only with one head."""
    model_only: ClassVar[bool] = True  # acts on a vision model\'s grids, not in block schemes
    symbol: ClassVar[str] = r"\mathcal{A}^{\mathrm{conv}}"

    def parameters(self) -> tuple[Parameter, ...]:
        square = (FEATURES, FEATURES)
        params = []
        for name in "qkv":
            params.append(Parameter(f"W_{name}", f"W_{name}", f"W^{{{name.upper()}}}", (XI, H, E), square, (XI,)))
            params.append(Parameter(f"b_{name}", f"b_{name}", f"b^{{{name.upper()}}}", (H, E), (FEATURES,)))
        params.append(Parameter("W_o", "W_o", "W^{O}", (H, E, Y), square, (H, E)))
        params.append(Parameter("b_o", "b_o", "b^{O}", (Y,), (FEATURES,)))
        return tuple(params)

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}

        def projection(name: str, node: Variable) -> Definition:
            rhs = integral(p[f"W_{name}"] * sp.Function(f"{name}in")(node.symbol, XI.symbol), XI) + p[f"b_{name}"]
            return Definition(name, name.upper(), (node, H, E), rhs,
                              f"{'queries on the token nodes' if name == 'q' else name.upper() + ' on the key nodes'}: "
                              "a point-wise affine map over features")

        score = integral(apply("q", X, H, E) * apply("k", KEY, H, E), E) / sp.sqrt(FEATURES.measure)
        normalizer = integral(sp.exp(apply("a", H, X, KEY_DUMMY)), KEY_DUMMY)
        mixed = integral(apply("gamma", H, X, KEY) * apply("v", KEY, H, E), KEY)
        output = integral(integral(p["W_o"] * apply("o", X, H, E), E), H) + p["b_o"]
        return (
            projection("q", X), projection("k", KEY), projection("v", KEY),
            Definition("a", "a", (H, X, KEY), score, r"scores, scaled by $|\Omega_y|^{-1/2}$ (the whole feature domain)"),
            Definition("gamma", r"\gamma", (H, X, KEY), sp.exp(apply("a", H, X, KEY)) / normalizer,
                       r"attention kernel $\mathrm{Softmax}_2$ over the key nodes", absorbs=(KEY,)),
            Definition("o", "O", (X, H, E), mixed, r"the integral over the key nodes $\Omega_k$"),
            Definition("out", r"\mathcal{A}", (X, Y), output, "heads combined by the output kernel"),
        )
