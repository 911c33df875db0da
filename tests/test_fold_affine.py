"""The fold-affine pass: an inference BatchNorm after a convolution folded into its kernel and bias; and the
dead convolution outputs the networks' elementwise maps update in place (reuse-buffers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.backends import BACKENDS
from splitformer.codegen.ir import Convolution, Elementwise
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes import NETWORK_STAGE, run_passes
from splitformer.codegen.passes.convolution import convolution
from splitformer.codegen.passes.fold_affine import fold_affine
from splitformer.symbolic.network_spec import load_network
from splitformer.symbolic.network_derivation import derive_grid_network

from conftest import GENERATED, import_path

HELPERS = import_path(GENERATED / "numpy" / "resnet_block.py")
WITHOUT = tuple(rewrite for rewrite in NETWORK_STAGE if rewrite is not fold_affine)


def _lowered(transfer: bool, name: str = "resnet-block"):
    piece = derive_grid_network(load_network(name)).pieces["step_with" if transfer else "step_identity"]
    return lower(piece.program, (convolution,), network=True)


def _grid_reads(module, prefix: str) -> list[str]:
    """The statements over the batched grid that read an array named ``prefix…``."""
    return [op.out for op in module.ops if isinstance(op, Elementwise) and module.batched(op.out)
            and any(name.startswith(prefix) for name in op.reads())]


@pytest.mark.parametrize("transfer", [False, True], ids=["identity", "projection"])
def test_batch_norms_after_convolutions_are_folded_into_kernels_and_biases(transfer):
    folded = run_passes(_lowered(transfer), NETWORK_STAGE)
    convolutions = [op for op in folded.ops if isinstance(op, Convolution)]
    assert len(convolutions) == 2 + transfer and all(op.weight.endswith("_folded") for op in convolutions)
    assert _grid_reads(folded, "bn") == []  # no BatchNorm pass over the grid
    # negative control: without the pass the ReLUs read each BatchNorm's scale and shift per entry
    assert len(_grid_reads(run_passes(_lowered(transfer), WITHOUT), "bn")) == 2


def _run(module, backend: str, values: dict) -> np.ndarray:
    """The module's statements executed one by one (``backend``'s spelling) on ``values``."""
    if backend == "numpy":
        namespace = {"np": np, "_conv2d": HELPERS._conv2d, **values}
    else:
        namespace = {"torch": torch, "inference": True, **{name: torch.from_numpy(value) if isinstance(value, np.ndarray)
                                                          else value for name, value in values.items()}}
    for op in module.ops:
        for line in BACKENDS[backend].statements(module, op):
            exec(line, namespace)
    out = namespace[module.output]
    return out if backend == "numpy" else out.numpy()


def _values(module, stride: int) -> dict:
    rng = np.random.default_rng(stride)
    values = {"eps": 1e-5, "stride": stride, "u0": rng.standard_normal((2, 3, 9, 8))}
    sizes = {"c": 3, "k": 5, "l": 5, "r": 3, "s": 3}
    for name, info in module.tensors.items():
        if info.role == "param" and info.parameter:
            shape = tuple(sizes[label] for label in info.labels)
            if info.parameter.startswith("shortcut.W"):
                shape = (3, 1, 1, 5)
            values[name] = rng.uniform(0.5, 2.0, shape) if name.endswith("_var") else rng.standard_normal(shape)
    return values


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_folded_program_computes_what_the_unfolded_one_does(backend, stride):
    forward = _lowered(True)
    values = _values(forward, stride)
    expected = _run(forward, "numpy", values)  # no pass but the convolutions recognized
    out = _run(run_passes(forward, NETWORK_STAGE), backend, values)
    assert np.abs(out - expected).max() <= 1e-12 * np.abs(expected).max()
    # negative control: the BatchNorm's shift dropped from the folded bias is far off
    broken = run_passes(forward, NETWORK_STAGE)
    broken = replace(broken, ops=[replace(op, expr=op.expr.xreplace({sp.Symbol("bn1_c"): sp.Symbol("bn1_bias")}))
                                  if isinstance(op, Elementwise) and op.out.startswith("conv1_b") else op
                                  for op in broken.ops])
    assert np.abs(_run(broken, backend, values) - expected).max() > 1e-3


def test_maps_not_affine_per_channel_in_the_convolution_are_left_alone():
    module = run_passes(_lowered(False), NETWORK_STAGE[:2])
    relu = next(op for op in module.ops if op.out == "relu_out")
    (conv,) = (item for item in relu.expr.atoms(sp.Indexed) if str(item.base.label) == "conv1_out")
    u0 = sp.IndexedBase("u0")[conv.indices]
    for expr in (sp.Max(0, conv**2), sp.Max(0, u0 * conv + 1)):  # a square; a scale that varies over the grid
        control = replace(module, ops=[replace(op, expr=expr) if op is relu else op for op in module.ops])
        ops = {op.out: op for op in fold_affine(control).ops}
        assert ops["conv1_out"].weight == "conv1_W" and ops["relu_out"].expr == expr
        assert ops["conv2_out"].weight == "conv2_W_folded"  # the BatchNorm after the other one still folded
    assert {op.out: op for op in fold_affine(module).ops}["conv1_out"].weight == "conv1_W_folded"


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_dead_convolution_outputs_hold_the_relu_that_reads_them(backend):
    source = (GENERATED / backend / "resnet_block.py").read_text()
    step = source[source.index("def _step_identity("):source.index("def _step_identity_vjp(")]
    if backend == "torch":
        assert "relu2_out = conv2_out.add_(u0).clamp_min_(0) if inference else torch.relu(conv2_out + u0)" in step
        assert "inference = _in_place()" in step
    else:
        assert "relu2_out = np.maximum(np.add(conv2_out, u0, out=conv2_out)," in step
