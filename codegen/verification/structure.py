"""Structural properties the recovery argument relies on, checked on emitted (derived) code.

Attention, from the derived one-substep scheme ``u + A(u)``: equivariance under token
permutations (no masks, no positions), heads combining as a sum over the head grid, causal
masks removing the dependence on later tokens, padding masks on padded keys; rotary
attention depending on the positions through their differences only; cross-attention
blind to the order of the memory tokens and to padded ones; a block: N steps equal the
stack (combined by the scheme's method when it has ``[across_layers]``; with a second state, against
the evaluator's two states). Each check carries its negative control: the same comparison where the property
must not hold (a causal mask breaks equivariance, an average of heads is not their sum, no
mask lets later tokens in, scaled positions change the gaps, a memory reordered without its
mask, reversed layers are another stack, a second state started at 0 is another read-out).
"""

from __future__ import annotations

from inspect import signature

import numpy as np

from splitformer.codegen.verification.statements import Check
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.scheme import Scheme, Sequence, Substep
from splitformer.symbolic.stack import final_norm_kind, final_norm_scheme

from .across_layers import run_layers
from .causality import changed_after, prefix_change
from .emitted import emitted_modules
from .parameters import emitted_sizes, random_parameters
from .semantics import FLOAT, Semantics, Sizes
from .undefined import gap

__all__ = ["attention_checks", "stack_check", "across_stack_check", "stream_stack_check"]

_SIZES = Sizes(tokens=6, features=8, heads=2, hidden=8)
_TIGHT, _SEPARATED = 1e-12, 1e-3


def _attention_scheme(kind: str = "attention") -> Scheme:
    return Scheme(f"{kind}-only", f"one explicit {kind} substep", {"attn": kind},
                  Sequence((Substep("attn", "explicit"),)))


def _single(kind: str, seed: int):
    """The emitted NumPy ``forward`` of ``u + A(u)`` for one operator kind, and random parameters."""
    scheme = _attention_scheme(kind)
    module = emitted_modules(scheme, derive(scheme), ("numpy",))["numpy"]
    return module.forward, random_parameters(scheme, _SIZES, seed)


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

    later = changed_after(u, u + rng.standard_normal(u.shape))
    holds, detail = _verdict(*prefix_change(lambda v, causal: field(v, causal=causal), u, later))
    checks.append(Check("structure/attention/causal", None,
                        "With the causal mask (support x̃ ≤ x) the output at a token does not depend on later tokens "
                        "(at every position i, the tokens after i changed). Control: without the mask.",
                        "numeric", holds, detail))

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
    return checks + [_relative_positions_check(u), *_memory_checks(u, rng)]


def _relative_positions_check(u: np.ndarray) -> Check:
    forward, params = _single("rotary-attention", 23)
    positions = np.array([0.0, 1.0, 2.0, 4.0, 7.0, 8.0])

    def field(p):
        return forward(u, params, n_heads=_SIZES.heads, eps=1e-5, causal=False, positions=p, rope_theta=100.0) - u

    shifted = np.abs(field(positions + 7.25) - field(positions)).max()
    control = np.abs(field(2 * positions) - field(positions)).max()
    holds, detail = _verdict(shifted, control)
    return Check("structure/rotary-attention/relative-positions", None,
                 "Rotary attention depends on the token positions through their differences only: shifting every "
                 "position by 7.25 leaves A(u) unchanged (θ = 100, no masks). Control: the positions doubled.",
                 "numeric", holds, detail)


def _memory_checks(u: np.ndarray, rng: np.random.Generator) -> list[Check]:
    forward, params = _single("cross-attention", 24)
    memory = rng.standard_normal((u.shape[0], 4, _SIZES.features))
    padding = np.zeros((u.shape[0], 4), dtype=bool)
    padding[:, 2] = True

    def field(m, mask=None):
        return forward(u, m, params, n_heads=_SIZES.heads, eps=1e-5, causal=False, memory_key_padding_mask=mask) - u

    order = np.array([2, 0, 3, 1])  # the padded token moves
    permuted = np.abs(field(memory[:, order], padding[:, order]) - field(memory, padding)).max()
    control = np.abs(field(memory[:, order], padding) - field(memory, padding)).max()
    holds, detail = _verdict(permuted, control)
    checks = [Check("structure/cross-attention/memory-permutation", None,
                    "Cross-attention integrates over the memory tokens: reordering them (with their padding mask) "
                    "leaves C(u; m) unchanged. Control: the memory reordered, its mask not.", "numeric", holds, detail)]
    changed = memory.copy()
    changed[:, 2] += rng.standard_normal(changed[:, 2].shape)
    padded = np.abs(field(changed, padding) - field(memory, padding)).max()
    control = np.abs(field(changed) - field(memory)).max()
    holds, detail = _verdict(padded, control)
    checks.append(Check("structure/cross-attention/memory-padding", None,
                        "Padded memory tokens are outside the support χ_m: C(u; m) does not depend on them. "
                        "Control: without the memory mask.", "numeric", holds, detail))
    return checks


def _control(module, u, memory, layers: list[dict], stepped: np.ndarray, sizes) -> tuple[float, str]:
    """The stack check's negative control, its distance from the stepped layers and what it is: the layers reversed;
    one fewer where reversed they give the same (layers that hold no parameters, or layers that commute: a
    per-feature scale of a mean over the tokens)."""
    def distance(control_layers):
        return gap(module.forward_stack(u, *memory, control_layers, n_heads=sizes.heads, eps=1e-5), stepped)

    if any(layers):
        reversed_distance = distance(layers[::-1])
        if reversed_distance > _SEPARATED:
            return reversed_distance, "the layers reversed"
        return distance(layers[:-1]), "one layer fewer (reversed, the layers give the same stack: they commute)"
    return distance(layers[:-1]), "one layer fewer (the layers hold no parameters)"


def stack_check(scheme: Scheme, module) -> Check:
    """``forward_stack`` of N layers equals N steps of ``forward``; the control (``_control``) does not."""
    sizes = emitted_sizes(_SIZES, scheme)
    layers = [random_parameters(scheme, sizes, 31 + n) for n in range(3)]
    rng = np.random.default_rng(34)
    u = rng.standard_normal((2, sizes.tokens, sizes.features))
    # cross-attention: a memory, the same for every step
    memory = (rng.standard_normal((2, 3, sizes.features)),) if "memory" in signature(module.forward).parameters else ()
    stepped = u
    for layer in layers:
        stepped = module.forward(stepped, *memory, layer, n_heads=sizes.heads, eps=1e-5)
    stack = module.forward_stack(u, *memory, layers, n_heads=sizes.heads, eps=1e-5)
    control, control_text = _control(module, u, memory, layers, stepped, sizes)
    holds, detail = _verdict(gap(stack, stepped), control)
    return Check(f"structure/{scheme.name}/stack", scheme.name,
                 f"N = 3 steps of {scheme.name} (forward, each with its own controls θⁿ) equal the emitted stack "
                 f"(forward_stack, no final projection). Control: the stack with {control_text}.",
                 "numeric", holds, detail)


def stream_stack_check(scheme: Scheme, module) -> Check:
    """``forward_stack`` of a scheme with a second state against the evaluator's two states: ``d⁰ = u⁰``,
    ``d ← d + Δd`` per layer, read out as ``u + P(d)`` (``P`` the final projection)."""
    sizes = emitted_sizes(_SIZES, scheme)
    layers = [random_parameters(scheme, sizes, 31 + n) for n in range(3)]
    rng = np.random.default_rng(34)
    u = rng.standard_normal((2, sizes.tokens, sizes.features))
    final = {"gain": 1 + 0.5 * rng.standard_normal(sizes.features), "bias": 0.5 * rng.standard_normal(sizes.features)}
    projection = final_norm_scheme(final_norm_kind(scheme))

    def evaluated(first_second_state) -> np.ndarray:
        results = []
        for sequence in u:
            state, second = sequence, first_second_state(sequence)
            for params in layers:
                state, increment = Semantics(scheme, params, sizes, FLOAT, eps=1e-5).streams(state)
                second = second + increment
            named = {f"final_norm.{name}": value for name, value in final.items()}
            results.append(state + Semantics(projection, named, sizes, FLOAT, eps=1e-5).step(second))
        return np.stack(results)

    stack = module.forward_stack(u, layers, n_heads=sizes.heads, eps=1e-5, final_norm=final)
    holds, detail = _verdict(gap(stack, evaluated(lambda start: start)), gap(stack, evaluated(np.zeros_like)))
    return Check(f"structure/{scheme.name}/stack", scheme.name,
                 f"N = 3 layers of {scheme.name} with its second state d (d⁰ = u⁰, each layer adding its stream "
                 "substeps' increments; read out as u + P(d), P the final projection), run by the independent "
                 "evaluator, equal the emitted stack (forward_stack with final_norm). Control: the evaluator "
                 "starting d at 0.", "numeric", holds, detail)


def across_stack_check(scheme: Scheme, module) -> Check:
    """``forward_stack`` of N layers against the method driven by the emitted ``forward``."""
    sizes = emitted_sizes(_SIZES, scheme)
    layers = [random_parameters(scheme, sizes, 31 + n) for n in range(3)]
    u = np.random.default_rng(34).standard_normal((2, sizes.tokens, sizes.features))

    def steps(order):
        return [lambda w, params=params: module.forward(w, params, n_heads=sizes.heads, eps=1e-5) for params in order]

    stepped = run_layers(scheme.across_layers, steps(layers), u)
    stack = module.forward_stack(u, layers, n_heads=sizes.heads, eps=1e-5)
    control, control_text = _control(module, u, (), layers, stepped, sizes)
    holds, detail = _verdict(gap(stack, stepped), control)
    return Check(f"structure/{scheme.name}/stack", scheme.name,
                 f"N = 3 layers of {scheme.name} (forward, each with its own controls θⁿ) combined by "
                 f"{scheme.across_layers.method} across layers equal the emitted stack (forward_stack, no final "
                 f"projection). Control: the stack with {control_text}.", "numeric", holds, detail)
