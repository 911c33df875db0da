"""The softmax-attention adjoint recognized as one operation (``attention-adjoint`` pass): torch's flash-attention
backward (the forward keeps each row's log-normalizer), the kernel recomputed once elsewhere; parity with
``--passes none``."""

from dataclasses import replace

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.adjoint import _token_pair, lower_adjoint
from splitformer.codegen.ir import Attention, AttentionAdjoint, Elementwise
from splitformer.codegen.output import write_files
from splitformer.codegen.passes import DEFAULT, PASSES, attention_adjoint
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint

from conftest import GENERATED, import_path

import reference

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "attention-adjoint")


def _backward(name: str, passes):
    return lower_adjoint(derive_adjoint(derive(load_scheme(name))), passes)


def test_the_attention_adjoint_is_one_operation_and_no_kernel_is_kept_or_recomputed():
    passed, without = _backward("post-ln", DEFAULT), _backward("post-ln", WITHOUT)
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


def _unfused(name: str):
    """The forward and adjoint of ``name`` lowered without passes, as one module (the kernel not recomputed)."""
    backward = _backward(name, ())
    adjoint = [op for op in backward.adjoint.ops if not op.section.startswith("recomputed")]
    return replace(backward.forward, ops=[*backward.forward.ops, *adjoint])


def test_the_pass_matches_the_derived_statements_and_nothing_else():
    module = _unfused("post-ln")
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
    assert not any(isinstance(op, AttentionAdjoint) for op in _backward("llama", DEFAULT).adjoint.ops)


@pytest.fixture(scope="module")
def unpassed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("passes-none")
    write_files(generate(load_scheme("post-ln"), ("numpy", "torch"), folder, passes=()))
    return folder


@pytest.mark.parametrize("options", [{}, {"key_padding_mask": True}, {"causal": True}])
def test_parity_with_passes_none_in_float64(unpassed, options, rng):
    """No support: flash attention's backward (torch); a support: the kernel recomputed (and NumPy always)."""
    assert "_attention_adjoint(" in (GENERATED / "torch" / "post_ln.py").read_text()
    assert "_attention_adjoint(" not in (unpassed / "torch" / "post_ln.py").read_text()
    d, n_heads, d_ff, batch, tokens = 16, 4, 24, 3, 9
    numpy_passed, numpy_plain = (import_path(folder / "numpy" / "post_ln.py") for folder in (GENERATED, unpassed))
    params = reference.random_params(numpy_passed.PARAMETERS, d, d_ff, rng)
    u, grad_out = rng.standard_normal((batch, tokens, d)), rng.standard_normal((batch, tokens, d))
    if options.get("key_padding_mask"):
        padding = np.zeros((batch, tokens), dtype=bool)
        padding[-1, tokens - 3:] = True
        options = {"key_padding_mask": padding}
    gradients = {}
    for label, folder in (("passed", GENERATED), ("plain", unpassed)):
        module = import_path(folder / "torch" / "post_ln.py")
        block = module.Block(d, n_heads, d_ff, dtype=torch.float64, backward="derived").load_params(params)
        x = torch.tensor(u, requires_grad=True)
        block(x, **{k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in options.items()}).backward(
            torch.tensor(grad_out))
        gradients[label] = [x.grad.numpy(), *(module._tensor(block, name).grad.numpy() for name in module.PARAMETERS)]
    for got, expected in zip(gradients["passed"], gradients["plain"]):
        assert np.abs(got - expected).max() <= 1e-12 * max(1.0, np.abs(expected).max())
    grad_u, grads = numpy_passed.vjp(u, params, grad_out, n_heads=n_heads, **options)
    expected_u, expected = numpy_plain.vjp(u, params, grad_out, n_heads=n_heads, **options)
    assert np.abs(grad_u - expected_u).max() <= 1e-12 * np.abs(expected_u).max()
    for name, value in expected.items():
        assert np.abs(grads[name] - value).max() <= 1e-12 * max(1.0, np.abs(value).max()), name
