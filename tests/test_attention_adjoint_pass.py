"""The softmax-attention adjoint recognized as one operation (``attention-adjoint`` pass): torch's flash-attention
backward (the forward keeps each row's log-normalizer), the kernel recomputed once elsewhere. Parity with
``--passes none``: tests/test_adjoint_passes_parity.py."""

from dataclasses import replace

import pytest
import sympy as sp
import torch

from splitformer.codegen.adjoint import _token_pair
from splitformer.codegen.ir import Attention, AttentionAdjoint, Elementwise
from splitformer.codegen.passes import DEFAULT, PASSES, attention_adjoint

from conftest import GENERATED, import_path, lowered_backward, unfused_backward

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "attention-adjoint")


def test_the_attention_adjoint_is_one_operation_and_no_kernel_is_kept_or_recomputed():
    passed, without = lowered_backward("post-ln", DEFAULT), lowered_backward("post-ln", WITHOUT)
    (fused,) = [op for op in passed.adjoint.ops if isinstance(op, AttentionAdjoint)]
    (forward,) = [op for op in passed.forward.ops if isinstance(op, Attention)]
    assert fused.outputs == ("attn_q_bar", "attn_k_bar", "attn_v_bar") and fused.o == forward.out == "attn_o"
    assert forward.normalizer == fused.normalizer and fused.normalizer in passed.saved
    # the derived statements it stands for, each under its formula, but the row sum written out in ā's (s46: a reader
    # looked for its t7 in the code)
    assert fused.comment.count("\n") == 4 and "t7" not in fused.comment
    assert not any(_token_pair(op) for op in [*passed.forward.ops, *passed.adjoint.ops])
    # without the pass: the kernel's adjoint statements over (b, m, i, j), the kernel recomputed for them
    assert not any(isinstance(op, AttentionAdjoint) for op in without.adjoint.ops)
    assert {"attn_a", "attn_gamma", "attn_gamma_bar", "attn_a_bar"} <= {op.out for op in without.adjoint.ops
                                                                         if _token_pair(op)}


@pytest.mark.parametrize("name", ["post-ln", "llama"], ids=["plain-heads", "grouped-heads"])
def test_the_pass_matches_the_derived_statements_and_nothing_else(name):
    module = unfused_backward(name)
    assert sum(isinstance(op, AttentionAdjoint) for op in attention_adjoint(module).ops) == 1
    # controls: a softmax adjoint with the wrong sign, a kernel read by one more statement
    (scores_bar,) = [op for op in module.ops if op.out == "attn_a_bar"]
    arrays = scores_bar.expr.atoms(sp.Indexed)
    gamma = next(array for array in arrays if str(array.base.label) == "attn_gamma")
    total = min(arrays, key=lambda array: len(array.indices))  # the row sum Σ_n γ γ̄
    flipped = replace(scores_bar, expr=scores_bar.expr.xreplace({total: -total}))
    extra = Elementwise("extra", scores_bar.labels, expr=2 * gamma)
    for ops in ([flipped if op is scores_bar else op for op in module.ops], [*module.ops, extra]):
        assert not any(isinstance(op, AttentionAdjoint) for op in attention_adjoint(replace(module, ops=ops)).ops)


def test_a_key_costate_not_summed_over_the_members_is_no_grouped_attention_adjoint():
    """Control: k̄ = scale Σ_{s,i} ā q sums over each key head's members s; summed over the queries alone (s kept),
    the statements are no attention's adjoint."""
    module = unfused_backward("llama")
    (k_bar,) = [op for op in module.ops if op.out == "attn_kr_bar"]
    kept = replace(k_bar, labels=k_bar.labels[:3] + ("s",) + k_bar.labels[3:])
    ops = [kept if op is k_bar else op for op in module.ops]
    assert not any(isinstance(op, AttentionAdjoint) for op in attention_adjoint(replace(module, ops=ops)).ops)


def test_grouped_heads_keep_no_kernel():
    """llama's grouped heads: one adjoint operation reading the forward's row normalizers; no array over two token
    axes is kept or recomputed."""
    passed = lowered_backward("llama", DEFAULT)
    (fused,) = [op for op in passed.adjoint.ops if isinstance(op, AttentionAdjoint)]
    (forward,) = [op for op in passed.forward.ops if isinstance(op, Attention)]
    assert fused.outputs == ("attn_qr_bar", "attn_kr_bar", "attn_v_bar") and len(fused.q.labels) == 6
    assert forward.normalizer == fused.normalizer and fused.normalizer in passed.saved
    assert not any(_token_pair(op) for op in [*passed.forward.ops, *passed.adjoint.ops])


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
def test_grouped_torch_derived_backward_equals_autograd(mask):
    """The derived backward of a llama block (8 query heads over 2 key heads) against autograd through the same
    block's forward, float64, random parameters: flash attention's backward over the groups' heads (no mask, causal),
    the kernel recomputed with the members as query rows (a padding mask)."""
    module = import_path(GENERATED / "torch" / "llama.py")
    options = {"none": {}, "causal": {"causal": True},
               "padding": {"key_padding_mask": torch.tensor([[False] * 7, [False] * 4 + [True] * 3])}}[mask]
    results = {}
    for backward in ("autograd", "derived"):
        block = module.Block(16, 8, 24, n_kv_heads=2, bias=False, backward=backward, dtype=torch.float64)
        with torch.no_grad():
            for index, parameter in enumerate(block.parameters()):
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(index),
                                            dtype=torch.float64) * 0.4 + 0.1)
        x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64, requires_grad=True)
        block(x, **options).backward(torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(5),
                                                 dtype=torch.float64))
        results[backward] = [x.grad] + [parameter.grad for parameter in block.parameters()]
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-12
