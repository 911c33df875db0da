"""Recognize the adjoint of a SiLU, ``λ d/dx Silu(x)``, as one call: ``SiluBackward(λ, x)``.

The derived adjoint of llama's gated feed-forward ``s = w̃ Silu(w)`` writes the costate of ``w`` as

    w̄ = (w̃/(1 + e^{−w}) + e^{−w} s/(1 + e^{−w})) s̄,

reading the kept ``s``: three ``exp``, three ``neg``, two ``div`` and their temporaries (torch: 9.6 ms at B·N = 1024,
d_ff = 2048, float32, 2 threads, the statement alone in a loop), and ∞/∞ = NaN where ``e^{−w}`` overflows
(``w`` below −88.7 in float32). With ``s = w̃ w σ`` substituted (``σ = 1/(1 + e^{−w})``), the statement is
``(s̄ w̃) σ (1 + w (1 − σ))``: the costate ``s̄ w̃`` times the SiLU's derivative. The statement is recognized
as ``activation_adjoint`` describes, the kept ``s`` written out and ``e^{−x}`` a symbol of its own.
torch spells the call ``torch.ops.aten.silu_backward`` (0.56 ms so measured, one kernel: what autograd runs), NumPy
``_silu_backward``.
"""

from __future__ import annotations

import sympy as sp

from ..ir import Module, Silu, SiluBackward
from .activation_adjoint import Activation, recognize

__all__ = ["silu_adjoint", "SILU"]

#: The SiLU, ``x/(1 + e^{−x})``, and its backward call.
SILU = Activation(Silu, (sp.exp,), SiluBackward)


def silu_adjoint(module: Module) -> Module:
    return recognize(module, (SILU,))
