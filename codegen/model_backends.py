"""How the model-level IR operations (``codegen.model_ir``) are spelled in each backend.

Every other operation is spelled by the block backends (``codegen.backends``).
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, KERNEL_ROWS, ROWS
from splitformer.symbolic.cnn_operators import STRIDE
from splitformer.symbolic.cvt_adjoint import KEY_COLS, KEY_ROWS
from splitformer.symbolic.vision_operators import PATCH

from .backends import BACKENDS
from .ir import Module, Op
from .model_ir import (Convolution, Fold, Interleave, Join, Place, PlaceRows, Point, Rows, Tokens,
                       TransposedConvolution, Window)
from .printers import SIZE_NAMES

__all__ = ["statements", "code", "CODE_NAMES"]

#: Symbols of the model derivations and their names in emitted code.
CODE_NAMES = {**SIZE_NAMES, PATCH: "patch_size", STRIDE: "stride", KERNEL_ROWS.size: "kernel_size",
              CHANNELS.size: "n_channels", ROWS.size: "n_rows", COLS.size: "n_cols", CLASSES.size: "n_classes",
              KEY_ROWS: "n_rows_kv", KEY_COLS: "n_cols_kv"}


def code(expr: sp.Expr) -> str:
    """A size or configuration expression (``P``, ``2``) as code."""
    expr = sp.sympify(expr)
    return str(expr.xreplace({symbol: sp.Symbol(CODE_NAMES.get(symbol, symbol.name)) for symbol in expr.free_symbols}))


def _window(op: Window, backend: str) -> list[str]:
    return [f"{op.out} = _windows({op.source}, {op.axes}, {code(op.size)}, {code(op.stride)}, {code(op.padding)})"]


def _interleave(op: Interleave, backend: str) -> list[str]:
    return [f"{op.out} = _interleave({op.source}, {op.axes})"]


def _tokens(op: Tokens, backend: str) -> list[str]:
    return [f"{op.out} = _tokens({op.node}, {op.grid}) + {op.position}"]


def _point(op: Point, backend: str) -> list[str]:
    return [f"{op.out} = {op.source}[{', '.join(str(i) for i in op.index)}]"]


def _rows(op: Rows, backend: str) -> list[str]:
    return [f"{op.out} = _rows({op.source}, {op.axis}, {op.offset}, ({', '.join(code(size) for size in op.sizes)}{',' if len(op.sizes) == 1 else ''}))"]


def _fold(op: Fold, backend: str) -> list[str]:
    return [f"{op.out} = _fold({op.source}, {op.like}.shape, {op.axes}, {code(op.size)}, {code(op.stride)}, "
            f"{code(op.padding)})"]


def _place(op: Place, backend: str) -> list[str]:
    zeros = f"{op.source}.new_zeros({op.like}.shape)" if backend == "torch" else \
        f"np.zeros({op.like}.shape, dtype={op.source}.dtype)"
    return [f"{op.out} = {zeros}", f"{op.out}[{', '.join(str(i) for i in op.index)}] = {op.source}"]


def _place_rows(op: PlaceRows, backend: str) -> list[str]:
    return [f"{op.out} = _place_rows({op.source}, {op.like}.shape, {op.axis}, {op.offset})"]


def _join(op: Join, backend: str) -> list[str]:
    return [f"{op.out} = _join({', '.join(op.parts)})"]


def _convolution(op: Convolution, backend: str) -> list[str]:
    stride, padding = code(op.stride), code(op.padding)
    last = ".permute(0, 2, 3, 1)" if op.channels_last else ""
    if backend == "torch":
        weight = f"{op.weight}.permute(2, 0, 1).unsqueeze(1)" if op.depthwise else f"{op.weight}.permute(3, 0, 1, 2)"
        groups = f", groups={op.x}.shape[1]" if op.depthwise else ""
        return [f"{op.out} = torch.nn.functional.conv2d({op.x}, {weight}, {op.bias}, {stride}, {padding}{groups}){last}"]
    helper = "_depthwise_conv2d" if op.depthwise else "_conv2d"
    bias = f", {op.bias}" if op.bias else ""
    return [f"{op.out} = {helper}({op.x}, {op.weight}, {stride}, {padding}{bias}){last.replace('permute', 'transpose')}"]


def _transposed_convolution(op: TransposedConvolution, backend: str) -> list[str]:
    if backend == "torch":
        return [f"{op.out} = torch.nn.functional.conv_transpose2d({op.x}, {op.weight}.permute(0, 3, 1, 2), {op.bias}, "
                f"{op.weight}.shape[1])"]
    return [f"{op.out} = _conv_transpose2d({op.x}, {op.weight}{f', {op.bias}' if op.bias else ''})"]


_MODEL_OPS = {Window: _window, Interleave: _interleave, Tokens: _tokens, Point: _point, Rows: _rows, Fold: _fold,
              Place: _place, PlaceRows: _place_rows, Join: _join,
              Convolution: _convolution, TransposedConvolution: _transposed_convolution}


def statements(backend: str, module: Module, op: Op) -> list[str]:
    """The statements computing ``op`` in ``backend``."""
    spell = _MODEL_OPS.get(type(op))
    return spell(op, backend) if spell else BACKENDS[backend].statements(module, op)
