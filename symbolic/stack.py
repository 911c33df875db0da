"""What a stack of steps adds: the final projection of pre-LN stacks (docs/model.md §6)."""

from __future__ import annotations

from functools import cache

from .scheme import Scheme, Sequence, Substep

__all__ = ["final_norm_scheme"]


@cache
def final_norm_scheme() -> Scheme:
    """One projection substep of a LayerNorm operator called ``final_norm``."""
    return Scheme(
        name="final-norm",
        summary="the final projection onto S_1 of a stack, then gain and bias",
        operators={"final_norm": "layer-norm"},
        body=Sequence((Substep("final_norm", "projection"),)),
    )
