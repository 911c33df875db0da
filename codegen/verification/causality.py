"""Causality of a whole block, a stack and the next-token distribution, on the emitted NumPy code.

The Lean formalization of the paper (SauersML/params, ``Causal.lean``, ``LanguageModel.lean``)
proves that causal self-attention is *prefix dependent* (output row ``i`` reads rows ``≤ i``
only), that prefix dependence survives composition and residual addition, and hence that a
decoder's next-token distribution at position ``i`` is a function of the tokens ``≤ i``.
``structure/attention/causal`` states the first for one attention substep; here the same
statement for every scheme whose program reads the support χ:

- ``causality/<scheme>/block``: one step of the emitted ``forward`` with ``causal=True``;
- ``causality/<scheme>/stack``: three steps of ``forward_stack`` with the final projection;
- ``causality/<scheme>/next-token``: token ids through an embedding (a table ``E`` plus
  positions), the stack, the final projection and the tied read-out ``logits = h Eᵀ``, the
  softmax over the vocabulary (embedding, read-out and softmax written here, not emitted).

In each, the tokens after position ``i`` are changed (new values; new token ids) and the
outputs at positions ``≤ i`` must not move. Negative control: the same comparison with
``causal=False`` must show a change.
"""

from __future__ import annotations

from inspect import signature

import numpy as np

from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme

from .parameters import emitted_sizes, random_parameters
from .semantics import Sizes
from .statements import SKIPPED, Check

__all__ = ["causality_checks", "SUPPORT"]

#: The program input that carries the support of the token integrals (masks).
SUPPORT = "chi"
_SIZES = Sizes(tokens=6, features=8, heads=2, hidden=8)
_PREFIX = 3  # positions 0 … 2 are kept, 3 … 5 changed
_VOCABULARY = 11
_TIGHT, _SEPARATED = 1e-12, 1e-3


def _verdict(moved: float, control: float) -> tuple[bool, str]:
    return (bool(moved < _TIGHT and control > _SEPARATED),
            f"max change at positions < {_PREFIX}: {moved:.1e} (causal); negative control (causal=False) {control:.2e}")


def _prefix_change(evaluate, first, second) -> tuple[float, float]:
    """max |F(first) − F(second)| over the kept positions, with ``causal=True`` and ``causal=False``."""
    return tuple(float(np.abs(evaluate(first, causal)[:, :_PREFIX] - evaluate(second, causal)[:, :_PREFIX]).max())
                 for causal in (True, False))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the vocabulary (the distribution, compared on the scale of the logits)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def causality_checks(scheme: Scheme, program: Program, module) -> list[Check]:
    """Block, stack and next-token causality of ``scheme``'s emitted NumPy ``module``, with controls."""
    kinds = ("block", "stack", "next-token")
    if SUPPORT not in program.tensors:
        return [Check(f"causality/{scheme.name}/{kind}", scheme.name,
                      f"The {kind} of {scheme.name} with the causal mask is prefix dependent.", SKIPPED, True,
                      "skipped: no operator of the scheme integrates over the tokens (it reads no support χ), so "
                      "every output is token-wise") for kind in kinds]
    sizes = emitted_sizes(_SIZES, scheme)
    rng = np.random.default_rng(41)
    layers = [random_parameters(scheme, sizes, 42 + n) for n in range(3)]
    final_norm = {name.removeprefix("final_norm."): 1.0 + 0.5 * rng.standard_normal(sizes.features)
                  for name in module.FINAL_NORM_PARAMETERS}
    memory = ((rng.standard_normal((2, 4, sizes.features)),)
              if "memory" in signature(module.forward).parameters else ())
    options = {"n_heads": sizes.heads, "eps": 1e-5}
    u = rng.standard_normal((2, sizes.tokens, sizes.features))
    later = u.copy()
    later[:, _PREFIX:] += rng.standard_normal(later[:, _PREFIX:].shape)

    def block(v, causal):
        return module.forward(v, *memory, layers[0], causal=causal, **options)

    def stack(v, causal):
        return module.forward_stack(v, *memory, layers, final_norm=final_norm, causal=causal, **options)

    table = 0.5 * rng.standard_normal((_VOCABULARY, sizes.features))  # logits of order 1: no saturated softmax
    positions = 0.5 * rng.standard_normal((sizes.tokens, sizes.features))

    def next_token(tokens, causal):
        return _log_softmax(stack(table[tokens] + positions, causal) @ table.T)

    tokens = rng.integers(0, _VOCABULARY, (2, sizes.tokens))
    other = tokens.copy()
    other[:, _PREFIX:] = (tokens[:, _PREFIX:] + 1 + rng.integers(0, _VOCABULARY - 1, (2, sizes.tokens - _PREFIX))) \
        % _VOCABULARY  # every later token id changed
    memory_text = " (the memory held fixed)" if memory else ""
    statements = {
        "block": (block, u, later,
                  f"One step of {scheme.name} (emitted forward, causal=True, padding none) is prefix dependent: "
                  f"changing the tokens at positions ≥ {_PREFIX} leaves the outputs at positions < {_PREFIX} "
                  f"unchanged{memory_text}; 2 sequences of {sizes.tokens} tokens, d = {sizes.features}, "
                  f"{sizes.heads} heads, random parameters."),
        "stack": (stack, u, later,
                  f"A stack of 3 steps of {scheme.name} with its final projection (emitted forward_stack, "
                  f"causal=True) is prefix dependent: changing the tokens at positions ≥ {_PREFIX} leaves the "
                  f"outputs at positions < {_PREFIX} unchanged{memory_text}."),
        "next-token": (next_token, tokens, other,
                       f"The next-token distribution of a decoder built on {scheme.name} (token ids → table E plus "
                       f"learned positions → 3 causal steps → final projection → logits h Eᵀ → softmax over "
                       f"{_VOCABULARY} ids, compared as log p) at position i depends on the tokens ≤ i only: "
                       f"changing every token id at positions ≥ {_PREFIX} leaves the distributions at positions < {_PREFIX} unchanged."),
    }
    checks = []
    for kind, (evaluate, first, second, statement) in statements.items():
        holds, detail = _verdict(*_prefix_change(evaluate, first, second))
        checks.append(Check(f"causality/{scheme.name}/{kind}", scheme.name,
                            statement + " Control: the same change without the causal mask.", "numeric", holds,
                            detail))
    return checks
