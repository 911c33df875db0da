"""Lowering: which IR operations the index-notation assignments become."""

import sympy as sp

from codegen.ir import Contraction, Elementwise, Reduction, Softmax
from codegen.lowering import lower
from codegen.passes import inline_elementwise
from codegen.printers import broadcast
from symbolic import derive, load_scheme


def _ops(passes=None):
    return {op.out: op for op in lower(derive(load_scheme("post-ln")), passes).ops}


def test_projections_and_scores_become_einsum_contractions_with_bias_and_scale():
    ops = _ops()
    assert isinstance(ops["attn_q"], Contraction) and ops["attn_q"].spec == "bik,kme->bime"
    assert ops["attn_q"].bias.name == "attn_b_q"
    assert ops["attn_a"].spec == "bime,bjme->bmij"
    assert ops["attn_a"].scale == 1 / sp.sqrt(sp.Symbol("N_e", integer=True, positive=True))
    assert ops["attn_out"].spec == "bime,mel->bil"


def test_softmax_kernel_is_recognized_with_its_support():
    op = _ops()["attn_gamma"]
    assert isinstance(op, Softmax)
    assert op.scores.name == "attn_a" and op.support.name == "chi" and op.support.labels == ("b", "i", "j")


def test_layer_norm_becomes_two_means_and_one_elementwise_map():
    ops = _ops()
    assert isinstance(ops["norm1_alpha"], Reduction) and ops["norm1_alpha"].mean
    assert isinstance(ops["norm1_beta"], Reduction) and ops["norm1_beta"].axis == "k"
    assert isinstance(ops["u2"], Elementwise)
    assert "norm1_p" not in ops and "norm1_out" not in ops  # inlined


def test_inline_pass_can_be_switched_off():
    ops = _ops(passes=())
    assert {"norm1_p", "norm1_out", "u2"} <= set(ops)
    module = lower(derive(load_scheme("post-ln")), passes=())
    assert len(inline_elementwise(module).ops) == len(module.ops) - 4


def test_broadcast_inserts_new_axes_only_where_needed():
    assert broadcast("g", ("l",), ("b", "i", "l")) == "g"
    assert broadcast("alpha", ("b", "i"), ("b", "i", "l")) == "alpha[:, :, None]"
    assert broadcast("chi", ("b", "i", "j"), ("b", "m", "i", "j")) == "chi[:, None]"
