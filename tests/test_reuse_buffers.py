"""The ``reuse-buffers`` pass on the feed-forward activations: GELU and SwiGLU's gated SiLU write into their dead
product (torch only without autograd), with the same bits as the out-of-place statements."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.ir import ExactGelu, Silu, TanhGelu
from splitformer.codegen.lowering import lower
from splitformer.codegen.output import write_files
from splitformer.codegen.passes import PASSES
from splitformer.codegen.passes.reuse_buffers import called
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import derive, load_scheme

from conftest import GENERATED, import_path

D, HEADS, D_FF = 16, 4, 24


def test_called_finds_the_routine_and_refuses_a_factor_that_reads_its_argument():
    w, gate = (sp.IndexedBase(name)[sp.Idx("i")] for name in ("w", "gate"))
    assert called(ExactGelu(w)) == ExactGelu(w) and called(TanhGelu(w)) == TanhGelu(w)
    assert called(gate * Silu(w)) == Silu(w)
    assert called(w * Silu(w)) is None  # in place, the argument would be read after it is overwritten
    assert called(Silu(w) * ExactGelu(gate)) is None and called(gate * w) is None


@pytest.mark.parametrize("scheme", ["gpt2", "llama", "post-ln gelu"])
def test_the_activation_reuses_its_dead_product_and_only_with_the_pass(scheme):
    name, *activation = scheme.split()
    program = derive(load_scheme(name).with_activation(*activation) if activation else load_scheme(name))
    ops = {op.out: op for op in lower(program).ops}
    assert ops["ffn_s"].reuse == "ffn_w"
    without = tuple(function for name, function in PASSES.items() if name != "reuse-buffers")
    assert {op.out: op for op in lower(program, without).ops}["ffn_s"].reuse is None  # control


def _random(block, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.5)
    return block.eval()


@pytest.mark.parametrize("name, kwargs", [("gpt2", {}), ("post_ln_gelu", {}), ("llama", {"n_kv_heads": 2})])
def test_torch_in_place_activations_give_autograds_bits(name, kwargs):
    module = import_path(GENERATED / "torch" / f"{name}.py")
    source = (GENERATED / "torch" / f"{name}.py").read_text()
    assert ("silu(ffn_w, inplace=True).mul_(ffn_gate)" if name == "llama" else "torch.ops.aten.gelu_(ffn_w") in source
    block = _random(module.Block(D, HEADS, D_FF, dtype=torch.float64, **kwargs))
    u = torch.randn(2, 7, D, dtype=torch.float64) * 3
    with torch.no_grad():
        in_place = block(u)
    out_of_place = block(u)  # parameters that require gradients: the statements out of place
    assert out_of_place.requires_grad and torch.equal(in_place, out_of_place.detach())
    scripted = torch.jit.script(block)  # TorchScript takes the in-place statements too
    with torch.no_grad():
        torch.testing.assert_close(scripted(u), in_place, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme, in_place", [
    ("gpt2", "ffn_s = _gelu_tanh(ffn_w, out=ffn_w)\n"),
    ("llama", "ffn_s = _silu(ffn_w, out=ffn_w)\n    ffn_s *= ffn_gate\n"),  # SwiGLU: SiLU in place, then the gate
])
def test_numpy_activation_into_its_product_gives_the_bits_of_the_statement_without_the_pass(rng, tmp_path, scheme,
                                                                                            in_place):
    without = tuple(function for name, function in PASSES.items() if name != "reuse-buffers")
    write_files(generate(load_scheme(scheme), ("numpy",), tmp_path, passes=without))
    module = scheme.replace("-", "_")
    passed, plain = import_path(GENERATED / "numpy" / f"{module}.py"), import_path(tmp_path / "numpy" / f"{module}.py")
    assert in_place in (GENERATED / "numpy" / f"{module}.py").read_text()
    assert "out=ffn_w)" not in (tmp_path / "numpy" / f"{module}.py").read_text()  # control
    params = {name: rng.standard_normal(tuple({"d_ff": D_FF}.get(axis, D) for axis in axes)) * 0.5
              for name, axes in passed.PARAMETERS.items()}
    u = rng.standard_normal((2, 7, D)) * 3
    for dtype in (np.float32, np.float64):
        typed = {name: value.astype(dtype) for name, value in params.items()}
        np.testing.assert_array_equal(passed.forward(u.astype(dtype), typed, n_heads=HEADS),
                                      plain.forward(u.astype(dtype), typed, n_heads=HEADS))


def test_numpy_writes_an_activation_in_place_and_then_multiplies_its_other_factors_in(rng):
    """``c·act(w)`` into a dead ``w``: the routine's ``out=``, then ``*= c`` (SwiGLU's gate); the lines compute the
    expression's values (evaluated here against the formula written in NumPy)."""
    from splitformer.codegen.backends import NumpyBackend
    from splitformer.codegen.ir import Elementwise, Module
    from splitformer.codegen.printers import NumpyPrinter
    from splitformer.runtime.numpy_helpers import _gelu, _gelu_tanh, _silu

    w, gate = sp.IndexedBase("ffn_w"), sp.IndexedBase("ffn_gate")
    b, i, z = (sp.Idx(label) for label in ("b", "i", "z"))
    module = Module("m", {}, [], "ffn_s")
    values = {"ffn_gate": rng.standard_normal((2, 3, 5)), "ffn_w": rng.standard_normal((2, 3, 5))}
    x = values["ffn_w"]  # the formulas written here, independently of the routines
    silu = x / (1 + np.exp(-x))
    exact = x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))) / 2
    tanh = x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) / 2
    for expr, expected, value in (
            (ExactGelu(w[b, i, z]), ["ffn_s = _gelu(ffn_w, out=ffn_w)"], exact),
            (gate[b, i, z] * Silu(w[b, i, z]), ["ffn_s = _silu(ffn_w, out=ffn_w)", "ffn_s *= ffn_gate"],
             values["ffn_gate"] * silu),
            (3 * TanhGelu(w[b, i, z]), ["ffn_s = _gelu_tanh(ffn_w, out=ffn_w)", "ffn_s *= 3"], 3 * tanh)):
        op = Elementwise(out="ffn_s", labels=("b", "i", "z"), expr=expr, reuse="ffn_w")
        lines = NumpyBackend().elementwise(op, NumpyPrinter(module, op.labels))
        assert lines == expected
        scope = {"np": np, "_gelu": _gelu, "_gelu_tanh": _gelu_tanh, "_silu": _silu,
                 **{name: array.copy() for name, array in values.items()}}
        exec("\n".join(lines), scope)
        np.testing.assert_allclose(scope["ffn_s"], value, rtol=1e-14, atol=1e-15)
        assert not np.allclose(scope["ffn_s"], values["ffn_gate"] * value)  # control: a factor the lines lack


def test_an_export_records_no_in_place_update_so_its_program_runs_with_autograd_too():
    module = import_path(GENERATED / "torch" / "llama.py")
    block = _random(module.Block(D, HEADS, D_FF, n_kv_heads=2, dtype=torch.float64))
    u = torch.randn(2, 7, D, dtype=torch.float64)
    with torch.no_grad():
        expected = block(u)
        program = torch.export.export(block, (u,))
    updates = [str(node.target) for node in program.graph.nodes
               if node.op == "call_function" and getattr(getattr(node.target, "_schema", None), "is_mutable", False)]
    # only the rotation's sum into its fresh product, which autograd allows (silu_ of a split's output it refuses)
    assert set(updates) == {"aten.addcmul_.default"}
    torch.testing.assert_close(program.module()(u), expected, rtol=0, atol=1e-12)
