"""The softmax-attention adjoint recognized as one operation (``attention-adjoint`` pass): torch's flash-attention
backward (the forward keeps each row's log-normalizer), the kernel recomputed once elsewhere. Parity with
``--passes none``: tests/test_adjoint_passes_parity.py."""

from dataclasses import replace

import sympy as sp

from splitformer.codegen.adjoint import _token_pair
from splitformer.codegen.ir import Attention, AttentionAdjoint, Elementwise
from splitformer.codegen.passes import DEFAULT, PASSES, attention_adjoint

from conftest import lowered_backward, unfused_backward

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "attention-adjoint")


def test_the_attention_adjoint_is_one_operation_and_no_kernel_is_kept_or_recomputed():
    passed, without = lowered_backward("post-ln", DEFAULT), lowered_backward("post-ln", WITHOUT)
    (fused,) = [op for op in passed.adjoint.ops if isinstance(op, AttentionAdjoint)]
    (forward,) = [op for op in passed.forward.ops if isinstance(op, Attention)]
    assert fused.outputs == ("attn_q_bar", "attn_k_bar", "attn_v_bar") and fused.o == forward.out == "attn_o"
    assert forward.normalizer == fused.normalizer and fused.normalizer in passed.saved
    assert fused.comment.count("\n") == 5  # the six derived statements it stands for, each under its formula
    assert not any(_token_pair(op) for op in [*passed.forward.ops, *passed.adjoint.ops])
    # without the pass: the kernel's adjoint statements over (b, m, i, j), the kernel recomputed for them
    assert not any(isinstance(op, AttentionAdjoint) for op in without.adjoint.ops)
    assert {"attn_a", "attn_gamma", "attn_gamma_bar", "attn_a_bar"} <= {op.out for op in without.adjoint.ops
                                                                         if _token_pair(op)}


def test_the_pass_matches_the_derived_statements_and_nothing_else():
    module = unfused_backward("post-ln")
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


def test_grouped_heads_are_left_alone():
    """Control: llama's grouped-head attention keeps its derived adjoint statements."""
    assert not any(isinstance(op, AttentionAdjoint) for op in lowered_backward("llama", DEFAULT).adjoint.ops)
