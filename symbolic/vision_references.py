"""The published formulas of the vision models, written with SymPy matrices and pixel loops.

References for the exact-recovery checks of whole models, written from the papers and
the reference implementations (a ``Conv2d`` with kernel = stride = patch, the class token
prepended, the position table added), not from the derivation: the patch embedding visits
each pixel and asks which patch it belongs to, instead of sampling ``P p + r``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp

__all__ = ["patch_embedding", "class_token_head"]

Entry = Callable[..., sp.Expr]


def patch_embedding(image: Entry, embed: Mapping[str, Entry], channels: int, height: int, width: int,
                    patch: int, d: int) -> sp.Matrix:
    """Dosovitskiy et al.: x_0 = [x_cls; x_p^1 E; …; x_p^N E] + E_pos, patches row by row."""
    rows, cols = height // patch, width // patch
    tokens = sp.zeros(1 + rows * cols, d)
    for l in range(d):
        tokens[0, l] = embed["cls"](l) + embed["pos"](0, l)
    for rho_1 in range(rows * patch):
        for rho_2 in range(cols * patch):
            node = 1 + (rho_1 // patch) * cols + rho_2 // patch
            for c in range(channels):
                for l in range(d):
                    tokens[node, l] += embed["W"](c, rho_1 % patch, rho_2 % patch, l) * image(c, rho_1, rho_2)
    for node in range(1, 1 + rows * cols):
        for l in range(d):
            tokens[node, l] += embed["b"](l) + embed["pos"](node, l)
    return tokens


def class_token_head(x: sp.Matrix, head: Mapping[str, sp.Matrix]) -> sp.Matrix:
    """ViT's classifier: a linear map of the class token's final state (token 0)."""
    return x[0, :] * head["head.W"] + head["head.b"].T
