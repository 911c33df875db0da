"""Plug-in kinds whose parameters are stored on axes a block's code does not size (review s33, F1: they derived, then
the forward raised KeyError 'd_head'), with their controls; a control per head read at another head variable (F3)."""
from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import (FEATURES, HEADS, HEAD_FEATURES, TOKENS, KV_FEATURES, E, H, H_MIX, X, X_KEY,
                                          XI, Y)
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


def _field(cls):
    return register_operator(dataclass(frozen=True)(cls))


@_field
class HeadTable(Operator):
    """c(h, e) stored (n_heads, d_head): out(x, y) = u(x, y) * ∫∫ c(h, e) de dh."""
    kind: ClassVar[str] = "head-table"
    symbol: ClassVar[str] = r"\mathcal{C}"

    def parameters(self):
        return (kernel("W_v", "W", (XI, H, E), (FEATURES, FEATURES), (XI,)), kernel("c", "c", (H, E), (HEADS, HEAD_FEATURES)),
                kernel("W_o", "W", (H, E, Y), (FEATURES, FEATURES), (H, E)))

    def definitions(self):
        v = apply("c", H, E) * integral(apply("W_v", XI, H, E) * apply(STATE, X, XI), XI)
        return (Definition("v", "v", (X, H, E), v, "v"),
                Definition("out", "o", (X, Y), integral(integral(apply("W_o", H, E, Y) * apply("v", X, H, E), E), H), "m"))


@_field
class HeadTableFlat(HeadTable):
    """the same c(h, e) stored (d,): the control."""
    kind: ClassVar[str] = "head-table-flat"

    def parameters(self):
        return (kernel("W_v", "W", (XI, H, E), (FEATURES, FEATURES), (XI,)), kernel("c", "c", (H, E), (FEATURES,)),
                kernel("W_o", "W", (H, E, Y), (FEATURES, FEATURES), (H, E)))


@_field
class HeadOut3d(Operator):
    """W_o(h, e, y) stored (n_heads, d_head, d), the same map as stored (d, d)."""
    kind: ClassVar[str] = "head-out-3d"
    symbol: ClassVar[str] = r"\mathcal{O}"

    def parameters(self):
        return (kernel("W_v", "W", (XI, H, E), (FEATURES, FEATURES), (XI,)),
                kernel("W_o", "W", (H, E, Y), (HEADS, HEAD_FEATURES, FEATURES), (H, E)))

    def definitions(self):
        v = integral(apply("W_v", XI, H, E) * apply(STATE, X, XI), XI)
        return (Definition("v", "v", (X, H, E), v, "v"),
                Definition("out", "o", (X, Y), integral(integral(apply("W_o", H, E, Y) * apply("v", X, H, E), E), H), "m"))


@_field
class TokenParam(Operator):
    """pe(x, y) stored (n_tokens, d): out = pe."""
    kind: ClassVar[str] = "token-param"
    symbol: ClassVar[str] = r"\mathcal{E}"

    def parameters(self):
        return (kernel("pe", "p", (X, Y), (TOKENS, FEATURES)),)

    def definitions(self):
        return (Definition("out", "o", (X, Y), apply("pe", X, Y) * apply(STATE, X, Y), "m"),)


@_field
class HeadMixAbsorb(Operator):
    """o(x, h, e) = ∫ m(h̃) v(x, h̃, e) dh̃ with the control m declared on (h,), absorbing h̃'s spacing (F3: refused)."""
    kind: ClassVar[str] = "head-mix-absorb"
    symbol: ClassVar[str] = r"\mathcal{M}"
    mix: ClassVar = H

    def parameters(self):
        return (kernel("W_v", "W", (XI, H, E), (FEATURES, FEATURES), (XI,)), kernel("m", "m", (self.mix,), (HEADS,), (H_MIX,)),
                kernel("W_o", "W", (H, E, Y), (FEATURES, FEATURES), (H, E)))

    def definitions(self):
        v = integral(apply("W_v", XI, H, E) * apply(STATE, X, XI), XI)
        o = integral(apply("m", H_MIX) * apply("v", X, H_MIX, E), H_MIX)
        return (Definition("v", "v", (X, H, E), v, "v"), Definition("o", "o", (X, H, E), o, "o"),
                Definition("out", "o", (X, Y), integral(integral(apply("W_o", H, E, Y) * apply("o", X, H, E), E), H), "m"))


@_field
class HeadMixAbsorbControl(HeadMixAbsorb):
    """the same with m declared on (h̃,): accepted."""
    kind: ClassVar[str] = "head-mix-absorb-control"
    mix: ClassVar = H_MIX
