"""The ``convolution-adjoint`` pass: a network's derived kernel gradient (the windows of a convolution's input
contracted with its output's costate) and input costate (each window's values added back at its points) become one
``ConvolutionWeightAdjoint`` and one ``ConvolutionInputAdjoint``: torch's ``convolution_backward`` for the kernel, for
the input; NumPy the two statements written as one.

The references are the two by their formulas, ``W̄[c, r, s, l] = Σ_{b,p,q} x[b, c, S p + r − P, S q + s − P]
K̄[b, l, p, q]`` and ``x̄[b, c, S p + r − P, S q + s − P] += Σ_l W[c, r, s, l] K̄[b, l, p, q]``, written here as loops
over the kernel offsets in NumPy (float64); the controls are statements that are neither (left alone) and the modules
derived without the pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import splitformer
from splitformer.codegen.adjoint import lower_stage_adjoint
from splitformer.codegen.backends import BACKENDS
from splitformer.codegen.ir import Contraction, ConvolutionInputAdjoint, ConvolutionWeightAdjoint, Operand, Window
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes import PASSES, convolution, convolution_adjoint
from splitformer.codegen.printers import code
from splitformer.runtime import numpy_grids, numpy_helpers
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import derive_cvt
from splitformer.symbolic.network_derivation import derive_network
from splitformer.symbolic.network_spec import load_network

_WITHOUT_PASS = ",".join(name for name in PASSES if name != "convolution-adjoint")


def _adjoint(network: str, piece: str):
    program = derive_cvt() if network == "cvt" else derive_network(load_network(network))
    part = program.pieces[piece]
    forward = lower(part.program, (convolution,), network=True)
    return lower_stage_adjoint(derive_adjoint(part.program), forward, part.input).adjoint


def _by_formula(x, costate, size, stride, padding, depthwise):
    """The kernel gradient by its formula: per kernel offset, the input at the strided points times the costate."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    rows, cols = costate.shape[2:]
    gradient = np.zeros((size, size, x.shape[1]) if depthwise else (x.shape[1], size, size, costate.shape[1]))
    for r in range(size):
        for s in range(size):
            points = padded[:, :, r:r + stride * (rows - 1) + 1:stride, s:s + stride * (cols - 1) + 1:stride]
            if depthwise:
                gradient[r, s] = np.sum(points * costate, axis=(0, 2, 3))
            else:
                gradient[:, r, s] = np.einsum("bcpq,blpq->cl", points, costate)
    return gradient


def _recognized(case: tuple[str, str, str], sizes: dict, backend: str):
    """The adjoint of ``case``'s program after the pass, its op writing ``case``'s array, that op's one statement in
    ``backend``, and ``sizes``."""
    network, piece, name = case
    module = convolution_adjoint(_adjoint(network, piece))
    (op,) = [op for op in module.ops if op.out == name]
    (line,) = BACKENDS[backend].statements(module, op)
    return module, op, line, sizes


def _integers(values, sizes: dict) -> tuple[int, ...]:
    """``values`` (sizes, strides, paddings) with the symbols named by their code names in ``sizes``."""
    return tuple(int(value.xreplace({symbol: sizes[code(symbol)] for symbol in value.free_symbols})) for value in values)


_CASES = {  # (network, piece, gradient): the sizes its code names
    ("cvt", "step", "qconv_W_bar"): {"kernel_qkv": 3, "stride_q": 1, "padding_q": 1},
    ("cvt", "step", "kconv_W_bar"): {"kernel_qkv": 3, "stride_kv": 2, "padding_kv": 1},
    ("cvt", "embedding", "embed_W_bar"): {"patch_size": 7, "patch_stride": 4, "patch_padding": 2},
    ("resnet-block", "step_with", "shortcut_W_bar"): {"stride": 2},
    ("resnet-block", "step_with", "conv1_W_bar"): {"stride": 2},
}


@pytest.mark.parametrize("case", _CASES, ids=["/".join(case) for case in _CASES])
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_the_kernel_gradient_is_one_op_equal_to_its_formula(case, backend, rng=np.random.default_rng(3)):
    module, op, line, sizes = _recognized(case, _CASES[case], backend)
    gradient = op.out
    assert isinstance(op, ConvolutionWeightAdjoint)
    assert not any(isinstance(other, Window) and other.out == op.window.out for other in module.ops)
    size, stride, padding = _integers((op.window.size, op.window.stride, op.window.padding), sizes)
    channels = 6
    out_channels = channels if op.depthwise else 4
    x = rng.standard_normal((2, channels, 11, 9))
    rows, cols = ((n + 2 * padding - size) // stride + 1 for n in x.shape[2:])
    costate = rng.standard_normal((2, out_channels, rows, cols))
    wrap = torch.from_numpy if backend == "torch" else np.asarray
    namespace = {**sizes, "torch": torch, "np": np, op.window.source: wrap(x), op.costate: wrap(costate),
                 "_windows": numpy_grids._windows, "_einsum": numpy_helpers._einsum}
    exec(line, namespace)
    expected = _by_formula(x, costate, size, stride, padding, op.depthwise)
    assert np.abs(np.asarray(namespace[gradient]) - expected).max() <= 1e-12 * np.abs(expected).max()


def test_a_contraction_of_the_windows_that_is_no_kernel_gradient_is_left_alone():
    module = _adjoint("cvt", "step")
    (window,) = [op for op in module.ops if isinstance(op, Window) and op.out == "qconv_W_bar_windows"]
    (product,) = [op for op in module.ops if op.out == "qconv_W_bar"]
    b, l, p, q, r, s = window.labels
    transposed = Contraction("qconv_W_bar", (s, r, l), product.comment, product.section, operands=product.operands)
    summed_over_r = Contraction("qconv_W_bar", (s, l), product.comment, product.section, operands=product.operands)
    scaled = Contraction("qconv_W_bar", product.labels, product.comment, product.section, operands=product.operands,
                         scale=2)
    extra = Contraction("spare", (b, l, p, q, r, s), operands=(Operand(window.out, window.labels),))
    # the windows read by a further statement stay, and the contraction with them
    variants = [[other if op is product else op for op in module.ops] for other in (transposed, summed_over_r, scaled)]
    for ops in [*variants, [*module.ops, extra]]:
        passed = convolution_adjoint(replace(module, ops=ops)).ops
        assert window in passed and [op for op in passed if op.out == "qconv_W_bar"] == [
            op for op in ops if op.out == "qconv_W_bar"]


def test_only_with_the_pass():
    passed, without = splitformer.derive("cvt"), splitformer.derive("cvt", passes=_WITHOUT_PASS)
    torch_source = passed.source("torch")  # 3 depth-wise and 1 full convolution, in two programs
    assert torch_source.count("[False, True, False])[1]") == torch_source.count("[True, False, False])[0]") == 8
    assert "convolution_backward(" not in without.source("torch") and "_fold(" not in torch_source
    assert "_W_bar_windows = _windows(" in without.source("numpy")
    assert "_W_bar_windows = _windows(" not in passed.source("numpy")


def _input_by_formula(costates, weights, shape, size, stride, padding, depthwise):
    """The input's costate by its formula: per term and kernel offset, the kernel times the costate added at the
    strided points of the zero-padded input, the padding cut off."""
    padded = np.zeros((shape[0], shape[1], shape[2] + 2 * padding, shape[3] + 2 * padding))
    for costate, weight in zip(costates, weights):
        rows, cols = costate.shape[2:]
        for r in range(size):
            for s in range(size):
                value = (weight[r, s][None, :, None, None] * costate if depthwise
                         else np.einsum("cl,blpq->bcpq", weight[:, r, s], costate))
                padded[:, :, r:r + stride * (rows - 1) + 1:stride, s:s + stride * (cols - 1) + 1:stride] += value
    return padded[:, :, padding:padding + shape[2], padding:padding + shape[3]]


_INPUT_CASES = {  # (network, piece, costate of the input): the sizes its code names
    ("cvt", "step", "grid_bar1"): {"kernel_qkv": 3, "stride_kv": 2, "padding_kv": 1},
    ("cvt", "step", "grid_bar2"): {"kernel_qkv": 3, "stride_q": 1, "padding_q": 1},
    ("cvt", "embedding", "u0_bar"): {"patch_size": 7, "patch_stride": 4, "patch_padding": 2},
    ("resnet-block", "step_with", "u0_bar2"): {"stride": 2},
    ("resnet-block", "step_with", "relu_out_bar"): {},  # an input computed in the program: its labels are (b, l, …)
    ("unet-level", "step_identity", "u0_bar1"): {},
    ("unet-level", "step_identity", "down_out_bar"): {},
}


@pytest.mark.parametrize("case", _INPUT_CASES, ids=["/".join(case) for case in _INPUT_CASES])
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_the_input_costate_is_one_op_equal_to_its_formula(case, backend, rng=np.random.default_rng(5)):
    module, op, line, sizes = _recognized(case, _INPUT_CASES[case], backend)
    costate_name = op.out
    assert isinstance(op, ConvolutionInputAdjoint) and op.blocks not in module.ops
    size, stride, padding = _integers((op.fold.size, op.fold.stride, op.fold.padding), sizes)
    channels, out_channels = 6, 6 if op.depthwise else 4
    shape = (2, channels, 11, 9)
    rows, cols = ((n + 2 * padding - size) // stride + 1 for n in shape[2:])
    costates = [rng.standard_normal((2, out_channels, rows, cols)) for _ in op.terms]
    weights = [rng.standard_normal((size, size, channels) if op.depthwise else (channels, size, size, out_channels))
               for _ in op.terms]
    wrap = torch.from_numpy if backend == "torch" else np.asarray
    arrays = {name: wrap(value) for (costate, weight), values in zip(op.terms, zip(costates, weights))
              for name, value in zip((costate, weight), values)}
    namespace = {**sizes, "torch": torch, "np": np, op.fold.like: wrap(np.zeros(shape)), **arrays,
                 "_fold": numpy_grids._fold, "_einsum": numpy_helpers._einsum}
    exec(line, namespace)
    expected = _input_by_formula(costates, weights, shape, size, stride, padding, op.depthwise)
    assert np.abs(np.asarray(namespace[costate_name]) - expected).max() <= 1e-12 * np.abs(expected).max()


def test_blocks_that_are_no_convolutions_values_are_left_alone():
    module = _adjoint("cvt", "step")
    (blocks,) = [op for op in module.ops if op.out == "grid_bar2_blocks"]
    w, k = blocks.expr.args
    for expr in (2 * blocks.expr, blocks.expr + w, w * k * k):
        ops = [replace(op, expr=expr) if op is blocks else op for op in module.ops]
        passed = convolution_adjoint(replace(module, ops=ops)).ops
        assert [op for op in passed if op.out in ("grid_bar2_blocks", "grid_bar2")] == [
            op for op in ops if op.out in ("grid_bar2_blocks", "grid_bar2")]
