"""The QK and OV circuits of attention (Lean: ``Circuits.lean``), on the emitted NumPy code.

``attention/circuits``: per head ``m`` the attention pattern depends on the queries and keys
through ``W^Q_m (W^K_m)ᵀ`` only, and the head's output through ``W^V_m W^O_m`` only. So the
gauge ``W^Q_m → W^Q_m R_m``, ``W^K_m → W^K_m R_m^{-T}`` (biases alike) and ``W^V_m → W^V_m S_m``,
``W^O_m → S_m^{-1} W^O_m`` (the rows of ``W^O`` that head ``m`` writes; ``b^V_m`` alike) leaves
``A(u)`` unchanged for random invertible ``R_m, S_m`` (2 heads, causal plus padding masks).
Controls: ``R_m`` in place of ``R_m^{-T}`` on the keys; ``S_m`` in place of ``S_m^{-1}`` on ``W^O``.
"""

from __future__ import annotations

import numpy as np

from .attention_kernel import attention_only
from .parameters import random_parameters
from .semantics import Sizes
from .statements import Check

__all__ = ["circuits_check"]

_SIZES = Sizes(tokens=5, features=8, heads=2, hidden=8)
_TIGHT, _SEPARATED = 1e-11, 1e-3


def _gauged(params: dict, rotations: list, mixers: list, keys_inverse: bool = True, output_inverse: bool = True):
    """``params`` under the per-head gauge (the controls drop one of the inverses)."""
    width = _SIZES.features // _SIZES.heads
    result = {name: value.copy() for name, value in params.items()}
    for m, (rotation, mixer) in enumerate(zip(rotations, mixers)):
        block = slice(m * width, (m + 1) * width)
        key_map = np.linalg.inv(rotation).T if keys_inverse else rotation
        output_map = np.linalg.inv(mixer) if output_inverse else mixer
        for name, matrix in (("q", rotation), ("k", key_map), ("v", mixer)):
            result[f"attn.W_{name}"][:, block] = params[f"attn.W_{name}"][:, block] @ matrix
            result[f"attn.b_{name}"][block] = params[f"attn.b_{name}"][block] @ matrix
        result["attn.W_o"][block] = output_map @ params["attn.W_o"][block]
    return result


def circuits_check() -> Check:
    scheme, module = attention_only()
    params = random_parameters(scheme, _SIZES, 91)
    rng = np.random.default_rng(92)
    width = _SIZES.features // _SIZES.heads
    rotations = [np.eye(width) + 0.5 * rng.standard_normal((width, width)) for _ in range(_SIZES.heads)]
    mixers = [np.eye(width) + 0.5 * rng.standard_normal((width, width)) for _ in range(_SIZES.heads)]
    u = rng.standard_normal((2, _SIZES.tokens, _SIZES.features))
    padding = np.zeros((2, _SIZES.tokens), dtype=bool)
    padding[1, [1, 3]] = True

    def field(p):
        return module.forward(u, p, n_heads=_SIZES.heads, eps=1e-5, key_padding_mask=padding, causal=True) - u

    reference = field(params)
    scale = max(1.0, float(np.abs(reference).max()))

    def moved(**dropped) -> float:
        return float(np.abs(field(_gauged(params, rotations, mixers, **dropped)) - reference).max()) / scale

    holds = moved()
    controls = {"keys by R": moved(keys_inverse=False), "W^O by S": moved(output_inverse=False)}
    return Check(
        "attention/circuits", None,
        "Per head m the emitted attention reads queries and keys through W^Q_m (W^K_m)ᵀ only and values through "
        "W^V_m W^O_m only: the gauge W^Q_m R_m, W^K_m R_m^-T, W^V_m S_m, S_m^-1 W^O_m (biases alike) leaves A(u) "
        "unchanged for random invertible R_m, S_m (2 heads, causal plus padding masks; Lean: Circuits.lean). "
        "Controls: R_m for R_m^-T on the keys, S_m for S_m^-1 on W^O.",
        "numeric", bool(holds < _TIGHT and min(controls.values()) > _SEPARATED),
        f"max relative change {holds:.1e}; controls: " + ", ".join(f"{k} {v:.2e}" for k, v in controls.items()))
