"""The initialization torch gives the layer a generated block replaces, per canonical parameter.

``torch.nn.MultiheadAttention`` draws its fused ``(3d × d)`` in-projection from
``xavier_uniform`` (half-width ``√(6 / (d + 3d))``) and zeroes its biases; every other
``Linear`` (the attention's out-projection included) draws weight and bias from
``kaiming_uniform(a=√5)``, i.e. ``U(±1/√fan_in)``; LayerNorm gains are ones, biases zeros.
Returned as Python expressions in the size names of the emitted code (``d``, ``d_ff``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from splitformer.symbolic.kinds import OPERATOR_KINDS

__all__ = ["init_bounds"]

_FUSED_IN_PROJECTION = ("W_q", "W_k", "W_v")


def _fan_in(shape: Sequence[str]) -> str:
    return " * ".join(shape[:-1])


def _bound(name: str, kind: str, shape: Sequence[str], operator_kind: str, shapes: Mapping[str, Sequence[str]]) -> str:
    group, attribute = name.split(".")
    attention = operator_kind == "attention"
    if kind == "gain":
        return "None"
    if kind == "step":  # a learned time step starts at 0: the identity step (LayerScale, ReZero)
        return "0.0"
    if kind == "weight":
        if attention and attribute in _FUSED_IN_PROJECTION:
            return f"math.sqrt(6 / ({_fan_in(shape)} + 3 * {shape[-1]}))"
        return f"1 / math.sqrt({_fan_in(shape)})"
    weight = f"{group}.W_{attribute.removeprefix('b_')}"
    operator = OPERATOR_KINDS.get(operator_kind)
    if attention or weight not in shapes or operator is None or operator.is_projection:
        return "0.0"
    return f"1 / math.sqrt({_fan_in(shapes[weight])})"


def init_bounds(parameters: Sequence[Mapping], operators: Mapping[str, str]) -> dict[str, str]:
    """Canonical name → half-width of its uniform draw as code (``"None"``: ones; ``"0.0"``: zeros).

    ``parameters``: the template's parameter entries (``name``, ``kind``, ``shape``);
    ``operators``: the scheme's operator key → kind.
    """
    shapes = {p["name"]: p["shape"] for p in parameters}
    return {p["name"]: _bound(p["name"], p["kind"], p["shape"], operators.get(p["group"], ""), shapes)
            for p in parameters}
