"""The passes on networks: which derived window sums become one convolution, the NumPy helpers
that compute them against loops written here (float64, random everything), and CvT's stages
through the block passes (fused LayerNorm, attention, GEMMs, dead arrays freed)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from splitformer.codegen.ir import Convolution, TransposedConvolution, Window
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes.convolution import convolution
from splitformer.runtime import numpy_grids
from splitformer.symbolic.cvt import derive_cvt
from splitformer.symbolic.network_spec import load_network
from splitformer.symbolic.network_derivation import derive_grid_network
from splitformer.symbolic.stages import stage_program

from conftest import GENERATED



def _ops(stages):
    return [op for stage in stages for op in lower(stage_program(stage), (convolution,), network=True).ops]


def test_every_forward_convolution_of_the_grid_networks_is_recognized():
    for name, transposed in (("resnet-block", 0), ("unet-level", 1)):
        ops = _ops(derive_grid_network(load_network(name)).stages())
        assert not any(isinstance(op, Window) for op in ops), name
        assert sum(isinstance(op, TransposedConvolution) for op in ops) == transposed, name
        assert any(isinstance(op, Convolution) and not op.depthwise for op in ops), name


def test_a_fused_convolution_states_its_formula_on_the_field_it_reads():
    """The window view a convolution absorbs is never made, so its formula reads the field at the window's points
    (``u[c, S*p + r - 1, …]``), not the view's name; the lowering's own (unfused) window keeps the name and says what
    it views."""
    stage = derive_grid_network(load_network("resnet-block")).stages()[0]
    fused = {op.out: op.comment for op in _ops([stage]) if isinstance(op, Convolution)}
    assert fused["conv1_out"].endswith("Σ_{c,r,s}(W_conv1[c, r, s, l]*u[c, S*p + r - 1, S*q + s - 1])"), fused
    assert not any("_windows" in comment for comment in fused.values())
    unfused = lower(stage_program(stage), (), network=True).ops  # control: no convolution pass
    window = next(op for op in unfused if isinstance(op, Window) and op.out == "conv1_out_windows")
    assert window.comment == "u[c, S*p + r - 1, S*q + s - 1] at every grid point and kernel offset (a view)"
    assert any("conv1_out_windows[c, p, q, r, s]" in op.comment for op in unfused)
    for path in (GENERATED / "numpy").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        read = set(re.findall(r"#.*?\b(\w+_windows\d*)\[", text))
        assert all(re.search(rf"\b{name} = ", text) for name in read), (path.name, read)


def test_cvt_projections_are_depthwise_and_its_embeddings_full():
    program = derive_cvt()
    projections = [op for op in _ops([program.stage(f"{letter}{part}") for letter in "qkv" for part in ("conv", "bn")])
                   if isinstance(op, Convolution)]
    embeddings = [op for op in _ops(program.parts["embedding"]) if isinstance(op, Convolution)]
    assert projections and all(op.depthwise for op in projections)
    assert embeddings and not any(op.depthwise for op in embeddings)


def _reference_conv(x, W, stride, padding):
    """``Σ_{c,r,s} x[b, c, S p + r − P, S q + s − P] W[c, r, s, l]``, loops over the output grid."""
    batch, channels, rows, cols = x.shape
    size = W.shape[1]
    padded = np.zeros((batch, channels, rows + 2 * padding, cols + 2 * padding))
    padded[:, :, padding:padding + rows, padding:padding + cols] = x
    out_rows, out_cols = (rows + 2 * padding - size) // stride + 1, (cols + 2 * padding - size) // stride + 1
    out = np.zeros((batch, W.shape[-1], out_rows, out_cols))
    for p in range(out_rows):
        for q in range(out_cols):
            patch = padded[:, :, stride * p:stride * p + size, stride * q:stride * q + size]
            out[:, :, p, q] = np.tensordot(patch, W, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize("channels", [3, 20], ids=["one-GEMM", "GEMM-per-kernel-row"])
@pytest.mark.parametrize("size, stride, padding, grid", [
    (3, 1, 1, (9, 8)), (3, 2, 1, (9, 8)), (3, 3, 0, (9, 8)), (1, 2, 0, (9, 8)), (7, 4, 2, (9, 8)), (4, 2, 3, (9, 8)),
    (2, 3, 0, (9, 8)), (3, 1, 1, (1, 1)), (3, 2, 1, (1, 2)), (2, 2, 0, (9, 8)), (4, 4, 0, (8, 8)), (1, 1, 0, (3, 2))])
@pytest.mark.parametrize("layout", ["channel-major", "channels-last", "swapped"])
def test_numpy_convolutions_match_loops(size, stride, padding, grid, channels, layout):
    """Every stride phase and kernel offset: strides above the kernel, padding beyond it, one-node images;
    a field channel-major, channels last (a token grid) or with its axes swapped."""
    rng = np.random.default_rng(size + stride + padding)
    x, W = rng.standard_normal((2, channels, *grid)), rng.standard_normal((channels, size, size, 5))
    x = {"channel-major": x, "channels-last": np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
         "swapped": np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)}[layout]
    depthwise, bias = rng.standard_normal((size, size, channels)), rng.standard_normal(5)
    channel_bias = rng.standard_normal(channels)
    assert np.max(np.abs(numpy_grids._conv2d(x, W, stride, padding) - _reference_conv(x, W, stride, padding))) < 1e-12
    with_bias = numpy_grids._conv2d(x, W, stride, padding, bias) - bias[:, None, None]
    assert np.max(np.abs(with_bias - _reference_conv(x, W, stride, padding))) < 1e-12
    # depth-wise: channel l convolved with W[:, :, l] alone (a full kernel that is zero off the diagonal)
    full = np.einsum("rsl,lk->lrsk", depthwise, np.eye(channels))
    expected = _reference_conv(x, full, stride, padding)
    assert np.max(np.abs(numpy_grids._depthwise_conv2d(x, depthwise, stride, padding) - expected)) < 1e-12
    with_bias = numpy_grids._depthwise_conv2d(x, depthwise, stride, padding, channel_bias) - channel_bias[:, None, None]
    assert np.max(np.abs(with_bias - expected)) < 1e-12
    # negative control: the kernel flipped (a correlation is not a convolution; the channels flipped too, since a
    # 1×1 kernel, or one node under a 3×3, reads its centre alone) is far off
    assert np.max(np.abs(numpy_grids._conv2d(x, W[::-1, ::-1, ::-1], stride, padding) - _reference_conv(x, W, stride, padding))) > 1e-3


@pytest.mark.parametrize("size, stride, padding", [(3, 2, 1), (3, 1, 1), (7, 4, 2)])
def test_a_channels_last_convolution_past_the_scratch_limit_takes_the_phases(size, stride, padding, monkeypatch):
    """A token grid's convolution is one GEMM over its output nodes' windows (``_window_rows``) while that matrix is
    within ``_SCRATCH_LIMIT``; past it, the phases' GEMMs per offset: both equal to the loop. Control: the windows'
    path is the one taken within the limit (it fills the "windows" scratch), and not past it."""
    rng = np.random.default_rng(size)
    x = np.ascontiguousarray(rng.standard_normal((2, 9, 8, 20)).astype(np.float32)).transpose(0, 3, 1, 2)
    W, bias = rng.standard_normal((20, size, size, 6)), rng.standard_normal(6)
    expected = _reference_conv(x.astype(np.float64), W, stride, padding) + bias[:, None, None]
    numpy_grids._SCRATCH.__dict__.pop("kept", None)
    within = numpy_grids._conv2d(x, W, stride, padding, bias)
    assert any(key[1] == "windows" for key in numpy_grids._SCRATCH.kept)
    numpy_grids._SCRATCH.__dict__.pop("kept", None)
    monkeypatch.setattr(numpy_grids, "_SCRATCH_LIMIT", 1024)
    past = numpy_grids._conv2d(x, W, stride, padding, bias)
    assert not any(key[1] == "windows" for key in numpy_grids._SCRATCH.__dict__.get("kept", {}))
    for out in (within, past):
        assert out.shape == expected.shape and np.max(np.abs(out - expected)) < 1e-12


@pytest.mark.parametrize("grid, size, stride", [(5, 7, 2), (2, 3, 2), (4, 7, 3)])
def test_a_convolution_without_nodes_is_empty_in_either_layout(grid, size, stride):
    """A kernel that reaches past the field on its first node, with (grid − size)//stride + 1 = 0: no output node, for
    a channels-last field as for a channel-major one (the windows' slices would count from the end, the windows'
    view refuse a window larger than the field)."""
    field = np.ones((2, grid, grid, 3))
    for helper, W in ((numpy_grids._conv2d, np.ones((3, size, size, 4))), (numpy_grids._depthwise_conv2d, np.ones((size, size, 3)))):
        channel_major = helper(np.ascontiguousarray(field.transpose(0, 3, 1, 2)), W, stride, 0)
        channels_last = helper(field.transpose(0, 3, 1, 2), W, stride, 0)
        assert channel_major.shape == channels_last.shape == (2, W.shape[-1], 0, 0)


def test_numpy_convolution_of_tiling_windows_takes_an_empty_batch():
    W = np.ones((3, 4, 4, 5))
    for stride, grid in ((4, 2), (2, 3)):  # the tiling path and, as a control, the general one
        assert numpy_grids._conv2d(np.zeros((0, 3, 8, 8)), W, stride, 0).shape == (0, 5, grid, grid)
    channels_last = np.zeros((0, 8, 8, 3)).transpose(0, 3, 1, 2)  # a token grid's windows (``_window_rows``)
    assert numpy_grids._conv2d(channels_last, W, 2, 1).shape == (0, 5, 4, 4)


def test_numpy_transposed_convolution_matches_a_loop():
    rng = np.random.default_rng(7)
    x, W = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((4, 2, 2, 3))
    out = np.zeros((2, 3, 6, 10))
    for p in range(3):
        for q in range(5):
            for r in range(2):
                for s in range(2):
                    out[:, :, 2 * p + r, 2 * q + s] = x[:, :, p, q] @ W[:, r, s, :]
    assert np.max(np.abs(numpy_grids._conv_transpose2d(x, W) - out)) < 1e-12
    bias = rng.standard_normal(3)
    assert np.max(np.abs(numpy_grids._conv_transpose2d(x, W, bias) - bias[:, None, None] - out)) < 1e-12
    assert np.max(np.abs(numpy_grids._conv_transpose2d(x, W[:, ::-1]) - out)) > 1e-3  # negative control


def _function(source: str, name: str) -> str:
    return re.search(rf"^def {name}\(.*?(?=^def )", source, re.S | re.M).group(0)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_emitted_cvt_step_uses_the_fused_layer_norm_and_frees_its_arrays(backend):
    step = _function((GENERATED / backend / "cvt.py").read_text(), "_step")
    code = [line.strip() for line in step.splitlines() if not line.strip().startswith("#")]
    assert "norm1_out = _layer_norm(u0, norm1_gain, norm1_bias, eps)" in code
    assert "norm2_out = _layer_norm(u1, norm2_gain, norm2_bias, eps)" in code
    assert not any("_alpha" in line or "mean(" in line for line in code)  # no unfused statistics
    assert any(line.startswith("attn_o = _attention(") for line in code)
    assert "del attn_k, attn_q, attn_v" in code and "del ffn_w" in code
    assert ("ffn_s = _gelu(ffn_w, out=ffn_w)" if backend == "numpy" else
            "ffn_s = torch.ops.aten.gelu_(ffn_w) if inference else torch.nn.functional.gelu(ffn_w)") in code
    # BatchNorm's a = γ/√(v + ε) stays a per-channel statement, not inlined into every entry
    assert any(line.startswith("qbn_a = ") for line in code)


_CVT_STAGE = {"patch_size": 3, "patch_stride": 2, "patch_padding": 1, "n_heads": 2, "kernel_qkv": 3, "stride_q": 1,
              "padding_q": 1, "stride_kv": 2, "padding_kv": 1}
#: Each network: its torch Model's arguments and an input's shape.
_NETWORKS = {
    "vit": ({"n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 12, "n_channels": 3, "patch_size": 4,
             "image_size": (8, 8), "n_classes": 5}, (2, 3, 8, 8)),
    "cvt": ((3, [8, 12], [1, 2], [16, 24], [{**_CVT_STAGE, "cls": False}, {**_CVT_STAGE, "cls": True}]), (2, 3, 16, 16)),
    "resnet-block": ((4, 6), (2, 4, 8, 8), {"stride": 2, "transfer": True}),
    "unet-level": ((4, 6), (2, 4, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(_NETWORKS))
def test_the_pass_selection_reaches_every_network_program(name):
    """``passes="none"`` emits each network's programs without the selectable passes (no fused LayerNorm, GELU or
    attention routine, no GEMM), and the textbook module computes what the optimized one does (float64, random
    parameters, both backends); the convolution recognition stays (it is not a selectable pass)."""
    import torch

    import splitformer

    arguments, shape, *keywords = _NETWORKS[name]
    textbook, optimized = splitformer.derive(name, passes="none"), splitformer.derive(name)
    for backend in ("numpy", "torch"):
        assert textbook.source(backend) != optimized.source(backend), backend
        for helper in ("_layer_norm(", "_gelu(", "_attention(", "scaled_dot_product_attention("):
            assert helper not in _function(textbook.source(backend), "_step" if name in ("vit", "cvt") else "_step_identity"), helper
    build = (lambda module: module.Model(**arguments, dtype=torch.float64)) if isinstance(arguments, dict) else (
        lambda module: module.Model(*arguments, **(keywords[0] if keywords else {}), dtype=torch.float64))
    models = [build(derivation.torch_module()).eval() for derivation in (textbook, optimized)]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in models[0].parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator, dtype=torch.float64) + 0.5)
    models[1].load_params(dict(models[0].named_parameters()))
    pixels = torch.randn(shape, generator=generator, dtype=torch.float64)
    outputs = [model(pixels) for model in models]
    params = {key: value.detach().numpy() for key, value in models[0].named_parameters()}
    options = {key: value for key, value in models[0].options.items() if key != "eps"}
    arrays = [derivation.numpy_module().forward(pixels.numpy(), params, **options) for derivation in (textbook, optimized)]
    for first, second in ((outputs[0], outputs[1]), (arrays[0], arrays[1]), (arrays[0], outputs[1])):
        for a, b in zip(*((x if isinstance(x, tuple) else (x,)) for x in (first, second))):
            if a is not None:
                np.testing.assert_allclose(np.asarray(a.detach() if hasattr(a, "detach") else a),
                                           np.asarray(b.detach() if hasattr(b, "detach") else b), rtol=1e-10, atol=1e-10)
