"""Structural properties the recovery argument relies on, checked on emitted (derived) code.

Attention, from the derived one-substep scheme ``u + A(u)``: equivariance under token
permutations (no masks, no positions), heads combining as a sum over the head grid, causal
masks removing the dependence on later tokens, padding masks on padded keys; a block: N
steps equal the stack. Each check carries its negative control: the same comparison where
the property must not hold (a causal mask breaks equivariance, an average of heads is not
their sum, no mask lets later tokens in, reversed layers are another stack).
"""

from __future__ import annotations

from inspect import signature

import numpy as np

from splitformer.symbolic.checks import Check
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.scheme import Scheme, Sequence, Substep

from .emitted import emitted_modules
from .scheme_checks import random_parameters
from .semantics import Sizes

__all__ = ["attention_checks", "stack_check"]

_SIZES = Sizes(tokens=6, features=8, heads=2, hidden=8)
_TIGHT, _SEPARATED = 1e-12, 1e-3


def _attention_scheme() -> Scheme:
    return Scheme("attention-only", "one explicit attention substep", {"attn": "attention"},
                  Sequence((Substep("attn", "explicit"),)))


def _verdict(holds: float, control: float) -> tuple[bool, str]:
    return (bool(holds < _TIGHT and control > _SEPARATED),
            f"max deviation {holds:.1e}; negative control {control:.2e}")


def attention_checks() -> list[Check]:
    scheme = _attention_scheme()
    module = emitted_modules(scheme, derive(scheme), ("numpy",))["numpy"]
    params = random_parameters(scheme, _SIZES, 21)
    rng = np.random.default_rng(22)
    u = rng.standard_normal((2, _SIZES.tokens, _SIZES.features))
    heads = _SIZES.heads

    def field(v, p=params, **masks):
        return module.forward(v, p, n_heads=heads, eps=1e-5, **masks) - v

    checks = []
    order = rng.permutation(_SIZES.tokens)
    equivariant = np.abs(field(u[:, order]) - field(u)[:, order]).max()
    control = np.abs(field(u[:, order], causal=True) - field(u, causal=True)[:, order]).max()
    holds, detail = _verdict(equivariant, control)
    checks.append(Check("structure/attention/permutation", None,
                        "Without masks or positions, attention is equivariant under permutations of the tokens: "
                        "A(Pu) = P A(u) (the kernel depends on token values only). Control: with the causal mask.",
                        "numeric", holds, detail))

    width = _SIZES.features // heads
    parts = []
    for m in range(heads):
        single = dict(params)
        rows = np.zeros_like(params["attn.W_o"])
        rows[m * width:(m + 1) * width] = params["attn.W_o"][m * width:(m + 1) * width]
        single["attn.W_o"], single["attn.b_o"] = rows, np.zeros_like(params["attn.b_o"])
        parts.append(field(u, single))
    total = field(u) - params["attn.b_o"]
    summed = np.abs(sum(parts) - total).max()
    control = np.abs(sum(parts) / heads - total).max()
    holds, detail = _verdict(summed, control)
    checks.append(Check("structure/attention/heads", None,
                        "Heads combine as the integral over the head grid (a sum): A(u) − b^O = Σ_m A_m(u), A_m "
                        "with the output kernel of head m only. Control: the average over heads.",
                        "numeric", holds, detail))

    later = u.copy()
    later[:, 3:] += rng.standard_normal(later[:, 3:].shape)
    causal = np.abs(field(later, causal=True)[:, :3] - field(u, causal=True)[:, :3]).max()
    control = np.abs(field(later)[:, :3] - field(u)[:, :3]).max()
    holds, detail = _verdict(causal, control)
    checks.append(Check("structure/attention/causal", None,
                        "With the causal mask (support x̃ ≤ x) the output at a token does not depend on later tokens. "
                        "Control: without the mask.", "numeric", holds, detail))

    padding = np.zeros((2, _SIZES.tokens), dtype=bool)
    padding[:, [1, 4]] = True
    changed = u.copy()
    changed[:, [1, 4]] += rng.standard_normal(changed[:, [1, 4]].shape)
    keep = [0, 2, 3, 5]
    padded = np.abs(field(changed, key_padding_mask=padding)[:, keep] - field(u, key_padding_mask=padding)[:, keep]).max()
    control = np.abs(field(changed)[:, keep] - field(u)[:, keep]).max()
    holds, detail = _verdict(padded, control)
    checks.append(Check("structure/attention/padding", None,
                        "Padded keys are outside the support: the outputs at the other tokens do not depend on them. "
                        "Control: without the mask.", "numeric", holds, detail))
    return checks


def stack_check(scheme: Scheme, module) -> Check:
    """``forward_stack`` of N layers equals N steps of ``forward``; reversed layers do not."""
    layers = [random_parameters(scheme, _SIZES, 31 + n) for n in range(3)]
    rng = np.random.default_rng(34)
    u = rng.standard_normal((2, _SIZES.tokens, _SIZES.features))
    # cross-attention: a memory, the same for every step
    memory = (rng.standard_normal((2, 3, _SIZES.features)),) if "memory" in signature(module.forward).parameters else ()
    stepped = u
    for layer in layers:
        stepped = module.forward(stepped, *memory, layer, n_heads=_SIZES.heads, eps=1e-5)
    stack = module.forward_stack(u, *memory, layers, n_heads=_SIZES.heads, eps=1e-5)
    control = module.forward_stack(u, *memory, layers[::-1], n_heads=_SIZES.heads, eps=1e-5)
    holds, detail = _verdict(float(np.abs(stack - stepped).max()), float(np.abs(control - stepped).max()))
    return Check(f"structure/{scheme.name}/stack", scheme.name,
                 f"N = 3 steps of {scheme.name} (forward, each with its own controls θⁿ) equal the emitted stack "
                 "(forward_stack, no final projection). Control: the stack with the layers reversed.",
                 "numeric", holds, detail)
