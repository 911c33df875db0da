"""Causality of a whole block, a stack and the next-token distribution, on the emitted NumPy code.

The Lean formalization of the paper (SauersML/params, ``Causal.lean``, ``LanguageModel.lean``)
proves that causal self-attention is *prefix dependent* (output row ``i`` reads rows ``≤ i``
only), that prefix dependence survives composition and residual addition, and hence that a
decoder's next-token distribution at position ``i`` is a function of the tokens ``≤ i``.
``structure/attention/causal`` states the first for one attention substep; here the same
statement for every scheme (a plug-in's token integral need not read the support χ to leak):

- ``causality/<scheme>/block``: one step of the emitted ``forward`` with ``causal=True``;
- ``causality/<scheme>/stack``: three steps of ``forward_stack`` with the final projection;
- ``causality/<scheme>/next-token``: token ids through an embedding (a table ``E`` plus
  positions), the stack, the final projection and the tied read-out ``logits = h Eᵀ``, the
  softmax over the vocabulary (embedding, read-out and softmax written here, not emitted);
- ``causality/<scheme>/cache``, where the emitted stack keeps a cache: decoding with it (three
  tokens, then one a call) equals the full causal pass; control: a cache filled from other first
  tokens moves the later outputs (a plug-in that read its keys' positions at ``η`` from the new
  tokens decoded wrong tokens, and every other check held).

In each, at every cut ``i`` of the 6 tokens, the tokens after position ``i`` are changed (new
values; new token ids) and the outputs at positions ``≤ i`` must not move: a leak that starts
at a later position is seen too. Negative control: the same comparison with ``causal=False``
must show a change; where it shows none either, no output reads another position's token
(the block is token-wise) and the statement holds as such.
"""

from __future__ import annotations

from inspect import signature

import numpy as np

from splitformer.symbolic.scheme import Scheme

from .parameters import emitted_sizes, random_parameters
from .semantics import Sizes
from .statements import SKIPPED, Check
from .undefined import gap

__all__ = ["causality_checks", "changed_after", "prefix_change"]

_SIZES = Sizes(tokens=6, features=8, heads=2, hidden=8)
_VOCABULARY = 11
_TIGHT, _SEPARATED = 1e-12, 1e-3
#: The tokens a cached decoding check gives its first call.
_PROMPT = 3


def _verdict(moved: float, control: float) -> tuple[bool, str]:
    where = f"max change at positions ≤ i, the tokens after i changed, over every cut i: {moved:.1e} (causal)"
    if moved < _TIGHT and control < _TIGHT:
        return True, f"{where}; without the mask {control:.1e} too: no output reads another position (token-wise)"
    return bool(moved < _TIGHT and control > _SEPARATED), f"{where}; negative control (causal=False) {control:.2e}"


def changed_after(first: np.ndarray, other: np.ndarray):
    """``later(i)``: ``first`` (batch, tokens, …) with the tokens after position ``i`` taken from ``other``."""
    return lambda cut: np.concatenate([first[:, :cut + 1], other[:, cut + 1:]], axis=1)


def prefix_change(evaluate, first, later) -> tuple[float, float]:
    """max over the cuts i of |F(first) − F(later(i))| at positions ≤ i, with ``causal=True`` and ``causal=False``:
    ``later(i)`` is ``first`` with the tokens after position ``i`` changed."""
    tokens = first.shape[1]
    return tuple(max(gap(evaluate(later(cut), causal)[:, :cut + 1], base[:, :cut + 1])
                     for cut in range(tokens - 1))
                 for causal, base in ((causal, evaluate(first, causal)) for causal in (True, False)))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the vocabulary (the distribution, compared on the scale of the logits)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def causality_checks(scheme: Scheme, module, uncached: tuple[str, ...] = ()) -> list[Check]:
    """Block, stack and next-token causality of ``scheme``'s emitted NumPy ``module``, with controls."""
    sizes = emitted_sizes(_SIZES, scheme)
    rng = np.random.default_rng(41)
    layers = [random_parameters(scheme, sizes, 42 + n) for n in range(3)]
    final_norm = {name.removeprefix("final_norm."): 1.0 + 0.5 * rng.standard_normal(sizes.features)
                  for name in module.FINAL_NORM_PARAMETERS}
    memory = ((rng.standard_normal((2, 4, sizes.features)),)
              if "memory" in signature(module.forward).parameters else ())
    options = {"n_heads": sizes.heads, "eps": 1e-5}
    u = rng.standard_normal((2, sizes.tokens, sizes.features))
    later = changed_after(u, u + rng.standard_normal(u.shape))

    def block(v, causal):
        return module.forward(v, *memory, layers[0], causal=causal, **options)

    def stack(v, causal):
        return module.forward_stack(v, *memory, layers, final_norm=final_norm, causal=causal, **options)

    table = 0.5 * rng.standard_normal((_VOCABULARY, sizes.features))  # logits of order 1: no saturated softmax
    positions = 0.5 * rng.standard_normal((sizes.tokens, sizes.features))

    def next_token(tokens, causal):
        return _log_softmax(stack(table[tokens] + positions, causal) @ table.T)

    tokens = rng.integers(0, _VOCABULARY, (2, sizes.tokens))
    other = (tokens + 1 + rng.integers(0, _VOCABULARY - 1, tokens.shape)) % _VOCABULARY  # every id changed
    later_ids = changed_after(tokens, other)
    memory_text = " (the memory held fixed)" if memory else ""
    statements = {
        "block": (block, u, later,
                  f"One step of {scheme.name} (emitted forward, causal=True, padding none) is prefix dependent: "
                  f"at every position i, changing the tokens after i leaves the outputs at positions ≤ i "
                  f"unchanged{memory_text}; 2 sequences of {sizes.tokens} tokens, d = {sizes.features}, "
                  f"{sizes.heads} heads, random parameters."),
        "stack": (stack, u, later,
                  f"A stack of 3 steps of {scheme.name} with its final projection (emitted forward_stack, "
                  f"causal=True) is prefix dependent: at every position i, changing the tokens after i leaves the "
                  f"outputs at positions ≤ i unchanged{memory_text}."),
        "next-token": (next_token, tokens, later_ids,
                       f"The next-token distribution of a decoder built on {scheme.name} (token ids → table E plus "
                       f"learned positions → 3 causal steps → final projection → logits h Eᵀ → softmax over "
                       f"{_VOCABULARY} ids, compared as log p) at position i depends on the tokens ≤ i only: "
                       "changing every token id after i leaves the distributions at positions ≤ i unchanged."),
    }
    checks = []
    for kind, (evaluate, first, second, statement) in statements.items():
        holds, detail = _verdict(*prefix_change(evaluate, first, second))
        checks.append(Check(f"causality/{scheme.name}/{kind}", scheme.name,
                            statement + " Control: the same change without the causal mask.", "numeric", holds,
                            detail))
    accepted = signature(module.forward_stack).parameters
    if "cache" in accepted and uncached:
        checks.append(Check(f"causality/{scheme.name}/cache", scheme.name,
                            f"Decoding a stack of 3 steps of {scheme.name} with its cache gives the full causal pass's "
                            "outputs.", SKIPPED, True,
                            f"not checked: the emitted code refuses a cache ({', '.join(uncached)} read the support "
                            "with a key in the query's place, χ(x̃, x), or the count of every token, |Ω_x|, which a "
                            "cached step does not hold)"))
    elif "cache" in accepted:
        # positions 1, 3, 5, …, where the stack takes them: not what a cache would count from its length alone
        positions = 2.0 * np.arange(sizes.tokens) + 1 if "positions" in accepted else None

        def cached(v, cache, start: int = 0):
            given = {} if positions is None else {"positions": positions[start:start + v.shape[1]]}
            return module.forward_stack(v, *memory, layers, final_norm=final_norm, causal=True, cache=cache,
                                        **given, **options)

        checks.append(_cached_decoding(scheme, cached, u, later(-1), positions is not None,
                                       getattr(module, "LateTokenRead", ())))
    return checks


def _cached_decoding(scheme: Scheme, stack, u: np.ndarray, other: np.ndarray, positioned: bool,
                     refusal: type[Exception] | tuple = ()) -> Check:
    """Decoding with the cache (the first ``_PROMPT`` tokens in one call, then one token a call) equals the full
    causal pass; control: a cache filled from other first tokens moves the later outputs. ``stack(v, cache, start)``
    runs the stack on the tokens from ``start`` (``positioned``: at positions it gives them). ``refusal``: the
    module's ``LateTokenRead``, where it emits one (a cached token would read a later one: the check is skipped);
    any other error of the cache is a failure."""
    def decoded(prompt: np.ndarray) -> np.ndarray:
        cache = [{} for _ in range(3)]
        outputs = [stack(prompt[:, :_PROMPT], cache)]
        outputs += [stack(u[:, position:position + 1], cache, position) for position in range(_PROMPT, u.shape[1])]
        return np.concatenate(outputs, axis=1)

    statement = (f"Decoding a stack of 3 steps of {scheme.name} with its cache (emitted forward_stack, cache=…: the "
                 f"first {_PROMPT} tokens in one call, then one token a call"
                 f"{', at positions 1, 3, 5, …' if positioned else ''}) gives the full causal pass's outputs. "
                 "Control: a cache filled from other first tokens moves the later outputs.")
    full = stack(u, None)
    try:
        moved = gap(decoded(u), full)
    except refusal as error:  # the module's refusal of a kernel reading later tokens: the other statements run
        return Check(f"causality/{scheme.name}/cache", scheme.name, statement, SKIPPED, True,
                     f"not checked: the emitted module refuses this cached decoding: {error}")
    control = gap(decoded(np.concatenate([other[:, :_PROMPT], u[:, _PROMPT:]], axis=1))[:, _PROMPT:], full[:, _PROMPT:])
    where = f"max |cached − full| {moved:.1e}"
    if moved < _TIGHT and control < _TIGHT:
        holds, detail = True, f"{where}; with other first tokens {control:.1e} too: no output reads an earlier token"
    else:
        holds, detail = bool(moved < _TIGHT and control > _SEPARATED), f"{where}; control {control:.2e}"
    return Check(f"causality/{scheme.name}/cache", scheme.name, statement, "numeric", holds, detail)
