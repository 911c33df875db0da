"""Where a torch figure's time goes: profiler operators grouped by what they compute.

The reference (torch's fused C++ layer) and the generated block call different operators for
the same work (``_addmm_activation`` against ``addmm`` + ``clamp_min_``, ``bmm`` + ``_softmax``
against one flash-attention kernel); grouped by kind, their times compare line by line and the
difference per kind is the gap.
"""

from __future__ import annotations

__all__ = ["KINDS", "kind", "by_kind"]

#: kind: the aten operators (forward and backward) whose self time counts there.
KINDS = {
    "GEMM (projections, feed-forward)": ("addmm", "mm", "_addmm_activation", "matmul", "linear"),
    "attention kernel": ("_scaled_dot_product_flash_attention_for_cpu",
                         "_scaled_dot_product_flash_attention_for_cpu_backward", "bmm", "baddbmm", "_softmax",
                         "_softmax_backward_data", "_transform_bias_rescale_qkv", "_masked_softmax"),
    "LayerNorm": ("native_layer_norm", "native_layer_norm_backward"),
    "copies, concatenation": ("copy_", "cat", "clone", "contiguous", "_to_copy", "narrow_copy"),
    "elementwise (residual, ReLU, loss)": ("add", "add_", "clamp_min", "clamp_min_", "relu", "relu_", "threshold_backward",
                                           "mul", "mul_", "div", "sub", "sum", "mean", "square", "pow", "fill_", "zero_"),
}
_OF = {f"aten::{name}": label for label, names in KINDS.items() for name in names}
OTHER = "other (dispatch, views, allocation, autograd)"


def kind(operator: str) -> str:
    """The kind of a profiler event name (``aten::addmm`` → GEMM)."""
    return _OF.get(operator, OTHER)


def by_kind(events: list[tuple[str, float]]) -> dict[str, float]:
    """(operator, self time) pairs → total self time per kind, in the order of ``KINDS``."""
    totals = dict.fromkeys([*KINDS, OTHER], 0.0)
    for operator, seconds in events:
        totals[kind(operator)] += seconds
    return totals
