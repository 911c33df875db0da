"""Recognize the derived convolutions of a network: window sums → ``Convolution``, blocks → ``TransposedConvolution``.

A convolution is lowered as a ``Window`` view ``x_windows[b, c, p, q, r, s]`` (the field at
``S p + r − P``) and the contraction ``Σ_{c,r,s} x_windows W[c, r, s, l]`` (depth-wise: ``W[r, s, l]``
with ``c = l``); a transposed convolution (kernel = stride) as the blocks
``Σ_k x[b, k, p, q] W[k, r, s, l]`` and their ``Interleave``. When the intermediate is read by
that one operation only, the pair becomes one operation, which torch spells as ``conv2d`` /
``conv_transpose2d`` and NumPy as one GEMM over the gathered windows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..ir import BATCH, Contraction, Convolution, Interleave, Module, Op, TransposedConvolution, Window

__all__ = ["convolution"]


def _bias(op: Contraction, channel: str) -> str | None | bool:
    """The bias's name, None without one, False when it is not one value per output channel."""
    if op.bias is None:
        return None
    return op.bias.name if op.bias.labels == (channel,) else False


def _convolution(window: Window, op: Contraction, module: Module) -> Convolution | None:
    if window.axes != (2, 3) or len(window.labels) != 6 or op.scale != 1 or len(op.operands) != 2:
        return None
    windows, weight = op.operands
    if windows.name != window.out:
        windows, weight = weight, windows
    info = module.tensors.get(weight.name)
    if windows.name != window.out or windows.labels != window.labels or info is None or info.role != "param":
        return None
    _, channel, p, q, r, s = window.labels
    out = weight.labels[-1]
    depthwise = weight.labels == (r, s, channel)
    if not depthwise and (weight.labels != (channel, r, s, out) or out in window.labels):
        return None
    bias = _bias(op, out)
    channels_last = op.labels == (BATCH, p, q, out) and not depthwise
    if (op.labels != (BATCH, out, p, q) and not channels_last) or bias is False:
        return None
    return Convolution(op.out, op.labels, window.read_in(op.comment), op.section, x=window.source, weight=weight.name,
                       bias=bias, size=window.size, stride=window.stride, padding=window.padding, depthwise=depthwise,
                       channels_last=channels_last)


def _transposed(op: Contraction, interleave: Interleave, module: Module) -> TransposedConvolution | None:
    if interleave.axes != (2, 3) or op.scale != 1 or len(op.operands) != 2:
        return None
    x, weight = op.operands
    info = module.tensors.get(weight.name)
    if info is None or info.role != "param" or len(x.labels) != 4 or len(weight.labels) != 4:
        return None
    _, k, p, q = x.labels
    _, r, s, channel = weight.labels
    bias = _bias(op, channel)
    if weight.labels[0] != k or op.labels != (BATCH, channel, p, q, r, s) or bias is False:
        return None
    return TransposedConvolution(interleave.out, interleave.labels, interleave.comment, interleave.section,
                                 x=x.name, weight=weight.name, bias=bias)


def convolution(module: Module) -> Module:
    reads = Counter(name for op in module.ops for name in op.reads())
    producers = {op.out: op for op in module.ops}
    fused: dict[str, Op | None] = {}  # None: an intermediate the fused operation absorbed
    for op in module.ops:
        if isinstance(op, Contraction):
            window = next((producers.get(operand.name) for operand in op.operands
                           if isinstance(producers.get(operand.name), Window)), None)
            if window is not None and reads[window.out] == 1 and (found := _convolution(window, op, module)):
                fused[op.out], fused[window.out] = found, None
        elif isinstance(op, Interleave):
            blocks = producers.get(op.source)
            if isinstance(blocks, Contraction) and reads[blocks.out] == 1 and (found := _transposed(blocks, op, module)):
                fused[op.out], fused[blocks.out] = found, None
    ops = [fused.get(op.out, op) for op in module.ops]
    return replace(module, ops=[op for op in ops if op is not None])
