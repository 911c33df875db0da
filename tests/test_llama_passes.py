"""The passes written for llama's step: ``silu`` (``w/(1 + e^{−w})`` as one call) and ``shared-trig`` (each
``cos φ``, ``sin φ`` of the rotary angles computed once), against the step emitted without any pass."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.ir import Elementwise, MatMul, Sigmoid, Silu, Unrolled, flat
from splitformer.codegen.lowering import lower
from splitformer.codegen.output import write_files
from splitformer.codegen.passes import DEFAULT, PASSES
from splitformer.codegen.passes.silu import _product
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import derive, load_scheme

from conftest import GENERATED, import_path


@pytest.fixture(scope="module")
def llama():
    scheme = load_scheme("llama")
    return scheme, derive(scheme)


def _without(name: str) -> tuple:
    return tuple(rewrite for rewrite in DEFAULT if rewrite is not PASSES[name])


def _trig_calls(module) -> int:
    expressions = [entry for op in flat(module.ops) if isinstance(op, Unrolled) for row in op.entries for entry in row]
    expressions += [op.expr for op in flat(module.ops) if isinstance(op, Elementwise)]
    return sum(1 for expr in expressions for item in sp.preorder_traversal(expr) if isinstance(item, (sp.cos, sp.sin)))


def test_the_gated_silu_becomes_one_call_and_only_with_the_pass(llama):
    _, program = llama
    (passed,) = [op for op in lower(program).ops if op.out == "ffn_s"]
    (without,) = [op for op in lower(program, _without("silu")).ops if op.out == "ffn_s"]
    assert passed.expr.has(Silu) and not passed.expr.has(sp.exp)
    # negative control: the formula as derived, its quotient by 1 + e^{−w} a logistic function (codegen.logistic)
    assert without.expr.has(Sigmoid) and not without.expr.has(Silu)
    assert sp.simplify(passed.expr.replace(Silu, lambda x: x / (1 + sp.exp(-x)))
                       - without.expr.replace(Sigmoid, Sigmoid.formula)) == 0
    assert "ffn_s = ffn_gate*torch.nn.functional.silu(ffn_w)" in (GENERATED / "torch" / "llama.py").read_text()


def test_products_that_are_no_silu_are_left_alone():
    x, y = (sp.IndexedBase(name)[sp.Idx("i")] for name in ("w", "v"))
    for product in (y / (1 + sp.exp(-x)), x / (1 + sp.exp(x)), x / (2 + sp.exp(-x)), x * sp.exp(-x)):
        assert _product(product) == product
    assert _product(y * x / (1 + sp.exp(-x))) == y * Silu(x)


def test_grouped_queries_keys_and_values_are_one_product_of_unequal_widths(llama):
    _, program = llama
    products = {op.out: op for op in lower(program).ops if isinstance(op, MatMul)}
    fused = products["attn_qkv"]
    assert fused.weights == ("attn_W_q", "attn_W_k", "attn_W_v") and len({labels for _, labels in fused.outputs}) == 3
    separate = {op.out for op in lower(program, _without("fuse-projections")).ops if isinstance(op, MatMul)}
    assert {"attn_q", "attn_k", "attn_v"} <= separate and "attn_qkv" not in separate  # negative control
    for backend, split in (("numpy", "np.split(attn_qkv, ["), ("torch", "attn_qkv.split_with_sizes([")):
        assert split in (GENERATED / backend / "llama.py").read_text()


def test_each_rotation_angle_has_one_cosine_and_one_sine(llama):
    _, program = llama
    assert _trig_calls(lower(program)) == 2  # attn_phi_cos, attn_phi_sin
    assert _trig_calls(lower(program, _without("shared-trig"))) == 8  # negative control: twice per entry pair, q and k
    single = lower(program, ())
    assert PASSES["shared-trig"](single) == single  # no pass before it: the kernel is not unrolled, no cos repeated


def test_parity_with_passes_none(llama, tmp_path, rng):
    scheme, program = llama
    write_files(generate(scheme, ("torch",), tmp_path, passes=(), program=program))
    plain, passed = import_path(tmp_path / "torch" / "llama.py"), import_path(GENERATED / "torch" / "llama.py")
    d, heads, d_ff = 16, 4, 24
    blocks = [module.Block(d, heads, d_ff, n_kv_heads=2, dtype=torch.float64) for module in (plain, passed)]
    blocks[1].load_state_dict(blocks[0].state_dict())
    u = torch.tensor(rng.standard_normal((2, 7, d)) * 3)
    with torch.no_grad():
        expected, out = (block(u) for block in blocks)
        cache = {}
        steps = torch.cat([blocks[1](u[:, :4], cache=cache), blocks[1](u[:, 4:], cache=cache)], 1)
    assert np.abs((out - expected).numpy()).max() <= 1e-12 and np.abs((steps - expected).numpy()).max() <= 1e-12
    with torch.no_grad():  # negative control: another rotation base is far off
        other = passed.Block(d, heads, d_ff, n_kv_heads=2, rope_theta=100.0, dtype=torch.float64)
        other.load_state_dict(blocks[0].state_dict())
        assert np.abs((other(u) - expected).numpy()).max() > 1e-3
