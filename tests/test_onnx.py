"""ONNX: every emitted torch module exports with ``torch.onnx.export`` and runs in onnxruntime.

Both exporters: TorchScript (``dynamo=False``, fast: every block and network) and dynamo
(``dynamo=True``, seconds per module: a few representatives). The
reference is the module itself in eager float32; each parity has a negative control (a
parameter changed after the export moves the eager output away from the exported graph).
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pytest

import torch  # test dependencies: a broken install fails, never skips
import onnx
import onnxruntime as ort

from conftest import GENERATED, import_path  # noqa: E402

BLOCKS = sorted(path.stem for path in (GENERATED / "torch").glob("*.py")
                if path.stem != "__init__" and "class Block(" in path.read_text(encoding="utf-8"))
#: float32 parity of ONNX Runtime and eager torch (the same formulas, other kernels).
TOLERANCE = 1e-5


def _module(name: str):
    return import_path(GENERATED / "torch" / f"{name}.py", f"_onnx_{name}")


def _randomized(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` in eval mode with every parameter random (variances positive)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            values = torch.randn(parameter.shape, generator=generator) * 0.5
            parameter.copy_(values.abs() + 0.5 if name.endswith("var") else values)
    return module.eval()


def _case(name: str) -> tuple[torch.nn.Module, tuple, dict]:
    """A small float32 module of ``name`` with random parameters, its inputs and keywords."""
    generator = torch.Generator().manual_seed(1)
    module = _module(name)
    if name in BLOCKS:
        extra = {"n_kv_heads": 1} if "n_kv_heads" in module.Block.__init__.__code__.co_varnames else {}
        block = module.Block(8, 2, 16, **extra)
        u = torch.randn(2, 5, 8, generator=generator)
        memory = (torch.randn(2, 3, 8, generator=generator),) if "memory" in module.Block.forward.__code__.co_varnames else ()
        return _randomized(block), (u, *memory), {}
    return _randomized(NETWORKS[name](module)), (torch.randn(2, 3, 16, 16, generator=generator),), {}


def _cvt_stage(n_heads: int, cls: bool) -> dict:
    return {"patch_size": 3, "patch_stride": 2, "patch_padding": 1, "n_heads": n_heads, "kernel_qkv": 3,
            "stride_q": 1, "padding_q": 1, "stride_kv": 2, "padding_kv": 1, "cls": cls}


#: The networks, small, on (batch 2, 3 channels, 16 × 16) images.
NETWORKS = {
    "vit": lambda module: module.Model(n_layers=2, d_model=8, n_heads=2, d_ff=16, n_channels=3, patch_size=4,
                                       image_size=(16, 16)),
    "cvt": lambda module: module.Model(3, [8, 12], [1, 1], [16, 24], [_cvt_stage(1, False), _cvt_stage(2, True)]),
    "resnet_block": lambda module: module.Model(3, 6, stride=2, transfer=True),
    "unet_level": lambda module: module.Model(3, 6),
}


def _export(module: torch.nn.Module, args: tuple, kwargs: dict, dynamo: bool) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)  # the dynamo exporter logs what it skips (torchvision)
        try:
            if dynamo:
                return torch.onnx.export(module, args, kwargs=kwargs, dynamo=True, verbose=False).model_proto.SerializeToString()
            buffer = io.BytesIO()
            torch.onnx.export(module, args, buffer, kwargs=kwargs, dynamo=False)
            return buffer.getvalue()
        finally:
            logging.disable(logging.NOTSET)


def _run(model: bytes, args: tuple) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {spec.name: arg.numpy() for spec, arg in zip(session.get_inputs(), args)})


def _outputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*args, **kwargs)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,)) if t is not None]


def _assert_parity(module, args, kwargs, dynamo):
    exported = _run(_export(module, args, kwargs, dynamo), args)
    eager = _outputs(module, args, kwargs)
    assert [a.shape for a in exported] == [e.shape for e in eager]
    assert all(np.abs(e).max() > 0.1 for e in eager)  # not a vacuous comparison
    assert max(float(np.abs(a - e).max()) for a, e in zip(exported, eager)) <= TOLERANCE
    with torch.no_grad():  # negative control: the graph holds the parameters it was exported with
        for parameter in module.parameters():
            parameter.mul_(1.5)
    changed = _outputs(module, args, kwargs)
    assert max(float(np.abs(a - c).max()) for a, c in zip(exported, changed)) > 1e3 * TOLERANCE


def test_every_block_module_is_covered():
    assert {"post_ln", "pre_ln", "gpt2", "llama", "decoder", "macaron", "rk4"} <= set(BLOCKS)


@pytest.mark.parametrize("name", BLOCKS)
def test_torchscript_export_runs_in_onnxruntime(name):
    _assert_parity(*_case(name), dynamo=False)


@pytest.mark.parametrize("name", NETWORKS)
def test_torchscript_export_of_the_networks(name):
    _assert_parity(*_case(name), dynamo=False)


@pytest.mark.parametrize("causal", [True, False])
def test_torchscript_export_keeps_a_bool_flag(causal):
    """The exporter passes ``causal`` as a 0-d tensor while tracing: the graph is the one for its value."""
    block, args, _ = _case("pre_ln")
    _assert_parity(block, args, {"causal": causal}, dynamo=False)
    with pytest.raises(TypeError, match="causal must be a bool"):  # outside tracing, a tensor is still refused
        block(*args, causal=torch.tensor(causal))


#: The dynamo exporter takes seconds per module: the two norms' portable statistics (LayerNorm;
#: RMSNorm with rotary, grouped attention), the vit and a CNN network (zero-padded windows).
DYNAMO = ["post_ln", "llama", "vit", "unet_level"]


@pytest.mark.parametrize("name", DYNAMO)
def test_dynamo_export_runs_in_onnxruntime(name):
    import onnxscript  # noqa: F401 - the dynamo exporter needs it (test extra)
    _assert_parity(*_case(name), dynamo=True)


def test_exported_norm_statistics_are_overflow_safe():
    """Rows near float32's largest values: the exported graph (log₂, floor, pow in place of frexp)
    normalizes them as eager does, where a plain LayerNorm's variance overflows."""
    _, (u,), _ = _case("pre_ln")
    block = _randomized(_module("pre_ln").Stack(1, 8, 2, 16, final_norm=True))  # LayerNorms before and after
    big = u * 1e37
    graph = _export(block, (big,), {}, dynamo=False)
    ops = {node.op_type for node in onnx.load_from_string(graph).graph.node}
    assert "Log" in ops and "Pow" in ops
    exported, eager = _run(graph, (big,))[0], _outputs(block, (big,), {})[0]
    assert np.isfinite(eager).all() and np.abs(exported - eager).max() <= TOLERANCE
    plain = torch.nn.functional.layer_norm(big, (8,))
    assert not torch.isfinite(plain).all()  # negative control: without the row scale the statistics overflow
