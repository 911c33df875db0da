"""The benchmark shapes (the performance issue's) and their floating-point work."""

from __future__ import annotations

__all__ = ["SHAPES", "flops"]

#: name: (batch, tokens, d, heads, d_ff); B·N = 1024 rows each, float32.
SHAPES = {
    "N128": (8, 128, 512, 8, 2048),
    "N1024": (1, 1024, 512, 8, 2048),
    "tiny": (2, 16, 32, 4, 64),  # a smoke test of the harness, not a target
}


def flops(shape: str, *, training: bool = False, scheme: str = "post-ln") -> float:
    """Multiply-adds × 2 of one block's GEMMs (×3 for forward + backward).

    ``post-ln`` and ``gpt2``: Q, K, V, O and a two-matrix feed-forward; ``llama``: keys and values
    on a quarter of the heads and a three-matrix (gated) feed-forward; ``decoder``: a second
    attention over as many memory tokens. Attention counts every score (causal or not)."""
    batch, tokens, d, _, d_ff = SHAPES[shape]
    rows = batch * tokens
    widths = {"post-ln": 4 * d + 2 * d_ff, "gpt2": 4 * d + 2 * d_ff, "llama": 2 * d + d // 2 + 3 * d_ff,
              "decoder": 8 * d + 2 * d_ff}[scheme]
    attentions = 2 if scheme == "decoder" else 1
    work = 2 * rows * d * widths + attentions * 2 * 2 * batch * tokens * tokens * d
    return float(work) * (3 if training else 1)
