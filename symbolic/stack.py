"""What a stack of steps adds: the final projection of pre-LN stacks (docs/model.md §6)."""

from __future__ import annotations

from functools import cache

from .kinds import OPERATOR_KINDS
from .scheme import Scheme, Sequence, Substep

__all__ = ["final_norm_scheme", "final_norm_kind"]


def final_norm_kind(scheme: Scheme) -> str:
    """The kind of a stack's final projection: the scheme's last normalization kind (LayerNorm if none)."""
    kinds = [kind for kind in scheme.operators.values()
             if kind in OPERATOR_KINDS and OPERATOR_KINDS[kind].is_projection
             and getattr(OPERATOR_KINDS[kind], "affine", ())]
    return kinds[-1] if kinds else "layer-norm"


@cache
def final_norm_scheme(kind: str = "layer-norm") -> Scheme:
    """One projection substep of a normalization operator (``kind``) called ``final_norm``."""
    return Scheme(
        name="final-norm",
        summary="the final projection of a stack, then its diagonal affine map",
        operators={"final_norm": kind},
        body=Sequence((Substep("final_norm", "projection"),)),
    )
