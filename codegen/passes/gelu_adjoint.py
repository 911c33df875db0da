"""Recognize the adjoint of a GELU, ``λ d/dx Gelu(x)``, exact or tanh-approximated, as one call.

The derived adjoint of a feed-forward ``s = Gelu(w)`` writes the costate of ``w`` as SymPy differentiated the GELU:
for the exact one ``(1/2 + erf(√2 w/2)/2 + √2 w e^{−w²/2}/(2√π)) s̄``, for GPT-2's tanh approximation
``(1/2 + tanh(a)/2 + √2 (1 − tanh²(a)) (1 + 3·0.044715 w²) w/(2√π)) s̄`` with ``a = √(2/π) (w + 0.044715 w³)``:
torch runs the latter as 28 kernels (``tanh`` twice, four ``pow``, seven ``div``: 13–16 ms at B·N = 1024,
d_ff = 2048, float32, 2 threads, the statement alone; GPT-2's derived training step took 1.2× its autograd one).
The statement is recognized as ``activation_adjoint`` describes, ``erf``, ``e^{…}`` and ``tanh`` each a symbol of
its own, and becomes ``ExactGeluBackward(λ, w)`` or ``TanhGeluBackward(λ, w)``: torch spells them
``torch.ops.aten.gelu_backward`` (one kernel, what autograd runs for torch's ``gelu``: 1.2 ms so measured, 0.45 ms
for the exact GELU's 7.6), NumPy the runtime's ``_gelu_backward`` (its signature; one ``tanh`` or ``erf`` per entry:
17.1 → 4.4 ms for the tanh form, 20.6 → 8.7 for the exact one, 2 M float32).
"""

from __future__ import annotations

import sympy as sp

from ..ir import ExactGelu, ExactGeluBackward, Module, TanhGelu, TanhGeluBackward
from .activation_adjoint import Activation, recognize

__all__ = ["gelu_adjoint", "EXACT_GELU", "TANH_GELU"]

#: The exact GELU, ``x (1 + erf(x/√2))/2``, and its backward call.
EXACT_GELU = Activation(ExactGelu, (sp.erf, sp.exp), ExactGeluBackward)
#: GELU's tanh approximation and its backward call.
TANH_GELU = Activation(TanhGelu, (sp.tanh,), TanhGeluBackward)


def gelu_adjoint(module: Module) -> Module:
    return recognize(module, (EXACT_GELU, TANH_GELU))
