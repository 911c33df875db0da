"""The GRU gate as a residual combiner (the gated Transformer, Parisotto et al. 2020; x-transformers'
``gate_residual``): the state ``u`` moves toward a candidate ``n`` by a learned gate ``1 − z``.

A combiner is a vector field of two fields, the state ``u`` and a branch's output ``v`` (``BRANCH``):
a substep ``combine = "gate"`` takes ``u ← u + fraction·Δt·c(u, v)`` with ``v`` the substep's field.
Here ``c`` is the relaxation field of a GRU cell,

    r = σ(W_ir v + b_ir + W_hr u + b_hr),   z = σ(W_iz v + b_iz + W_hz u + b_hz),
    n = tanh(W_in v + b_in + r ⊙ (W_hn u + b_hn)),   c(u, v) = (1 − z) ⊙ (n − u),

each ``W`` an integral transform over the features, ``σ(a) = 1/(1 + e^{−a})``. One explicit
step of it with ``Δt = 1`` (the emitted code's) is torch's ``GRUCell(v, u) = (1 − z) n + z u``.
Canonical parameters ``W_{i,h}{r,z,n} (d, d)`` and ``b_{i,h}{r,z,n} (d,)`` (``bias = false`` drops
the biases); torch's ``weight_ih`` is ``[W_ir; W_iz; W_in]ᵀ``. Defined through the public operator API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import FEATURES, X, XI, Y
from .operators import BRANCH, STATE, Definition, Operator, Parameter, apply, integral, kernel, register_operator

__all__ = ["GRUGate", "GATES"]

#: The gates of a GRU cell in torch's order: reset, update, candidate.
GATES = ("r", "z", "n")


def _sigmoid(value: sp.Expr) -> sp.Expr:
    return 1 / (1 + sp.exp(-value))


@register_operator
@dataclass(frozen=True)
class GRUGate(Operator):
    """The GRU cell's relaxation field ``(1 − z) ⊙ (n − u)`` of the state ``u`` and a branch output ``v``."""

    bias: bool = True
    kind: ClassVar[str] = "gru-gate"
    symbol: ClassVar[str] = r"\mathcal{C}"
    is_combiner: ClassVar[bool] = True

    def parameters(self) -> tuple[Parameter, ...]:
        parameters = []
        for gate in GATES:
            for source, latex in (("i", "I"), ("h", "H")):
                parameters.append(kernel(f"W_{source}{gate}", f"W^{{{latex}{gate}}}", (XI, Y), (FEATURES, FEATURES), (XI,)))
                parameters.append(kernel(f"b_{source}{gate}", f"b^{{{latex}{gate}}}", (Y,), (FEATURES,)))
        return tuple(p for p in parameters if self.bias or p.kind != "bias")

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        inputs = {"i": apply(BRANCH, X, XI), "h": apply(STATE, X, XI)}

        def transform(source: str, gate: str) -> sp.Expr:
            return integral(p[f"W_{source}{gate}"] * inputs[source], XI) + p.get(f"b_{source}{gate}", 0)

        stages = [Definition(f"{gate}_{source}", f"{gate}^{{{source}}}", (X, Y), transform(source, gate),
                             f"the {'branch' if source == 'i' else 'state'}'s transform for the gate {gate}")
                  for gate in GATES for source in "ih"]
        reset = _sigmoid(apply("r_i", X, Y) + apply("r_h", X, Y))
        update = _sigmoid(apply("z_i", X, Y) + apply("z_h", X, Y))
        candidate = sp.tanh(apply("n_i", X, Y) + apply("r", X, Y) * apply("n_h", X, Y))
        return (
            *stages,
            Definition("r", "r", (X, Y), reset, r"the reset gate $\sigma(\cdot)$"),
            Definition("z", "z", (X, Y), update, r"the update gate $\sigma(\cdot)$"),
            Definition("n", "n", (X, Y), candidate, "the candidate state"),
            Definition("out", r"\mathcal{C}", (X, Y), (1 - apply("z", X, Y)) * (apply("n", X, Y) - apply(STATE, X, Y)),
                       r"the relaxation toward the candidate at the rate $1 - z$"),
        )
