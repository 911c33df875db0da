"""The benchmark shapes (the performance issue's) and their floating-point work."""

from __future__ import annotations

__all__ = ["SHAPES", "flops"]

#: name: (batch, tokens, d, heads, d_ff); B·N = 1024 rows each, float32.
SHAPES = {
    "N128": (8, 128, 512, 8, 2048),
    "N1024": (1, 1024, 512, 8, 2048),
    "tiny": (2, 16, 32, 4, 64),  # a smoke test of the harness, not a target
}


def flops(shape: str, *, training: bool = False) -> float:
    """Multiply-adds × 2 of one encoder layer's GEMMs (×3 for forward + backward)."""
    batch, tokens, d, _, d_ff = SHAPES[shape]
    rows = batch * tokens
    projections = 2 * rows * d * (4 * d + 2 * d_ff)
    attention = 2 * 2 * batch * tokens * tokens * d
    return float(projections + attention) * (3 if training else 1)
