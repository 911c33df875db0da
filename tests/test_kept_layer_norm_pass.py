"""A derived LayerNorm whose ``P`` and ``β`` the adjoint reads, as one ``Normalize`` keeping them
(``kept-layer-norm`` pass). Parity with ``--passes none``: tests/test_adjoint_passes_parity.py."""

from dataclasses import replace

from splitformer.codegen.ir import Normalize, Reduction
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes import DEFAULT, PASSES, inline_elementwise, kept_layer_norm
from splitformer.symbolic import derive, load_scheme

from conftest import lowered_backward, unfused_backward

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "kept-layer-norm")


def _kept(module) -> dict[str, tuple]:
    return {op.out: (op.x.name, op.gain, op.bias, op.kept) for op in module.ops if isinstance(op, Normalize) and op.kept}


def test_the_derived_forward_normalizes_in_one_operation_keeping_p_and_beta():
    passed, without = lowered_backward("post-ln", DEFAULT), lowered_backward("post-ln", WITHOUT)
    assert _kept(passed.forward) == {"u2": ("u1", "norm1_gain", "norm1_bias", ("norm1_p", "norm1_beta")),
                                     "u4": ("u3", "norm2_gain", "norm2_bias", ("norm2_p", "norm2_beta"))}
    assert {"norm1_p", "norm1_beta", "norm2_p", "norm2_beta"} <= set(passed.saved)
    assert not any(isinstance(op, Reduction) for op in passed.forward.ops)
    assert not _kept(without.forward) and sum(isinstance(op, Reduction) for op in without.forward.ops) == 4


def test_controls_the_inference_forward_a_shifted_mean_and_rms_norm():
    program = derive(load_scheme("post-ln"))
    assert lower(program, DEFAULT) == lower(program, WITHOUT)  # there layer-norm fuses it, nothing kept
    assert not _kept(lowered_backward("llama", DEFAULT).forward)
    module = inline_elementwise(unfused_backward("post-ln"))
    assert set(_kept(kept_layer_norm(module))) == {"u2", "u4"}
    # α read once more: the mean is needed on its own, the statements stay
    mean = next(op for op in module.ops if op.out == "norm1_alpha")
    reader = replace(next(op for op in module.ops if op.out == "norm1_p"), out="extra")
    assert set(_kept(kept_layer_norm(replace(module, ops=[*module.ops, reader])))) == {"u4"}
    assert mean in kept_layer_norm(replace(module, ops=[*module.ops, reader])).ops
