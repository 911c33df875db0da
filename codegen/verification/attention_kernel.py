"""The attention kernel is a Markov kernel on its support, checked on the emitted NumPy code.

The Lean formalization of the paper (SauersML/params, ``Attention.lean``, ``Causal.lean``)
proves: the rows of the (masked) softmax kernel are non-negative and sum to one as soon as
the support is non-empty (``attnWeights_sum``, ``sum_maskedSoftmax``); every attention
output entry lies between the smallest and the largest value of its column (``attention_le``,
``le_attention``: the output is in the convex hull of the values); values constant across
tokens come out unchanged (``attention_const``). Here, on the emitted ``u + A(u)``:

- ``attention/kernel-rows``: the kernel itself, read off the emitted code by feeding one-hot
  values (features 4…7 carry the token's one-hot vector; queries and keys read features
  0…3 only; ``W^V`` copies the one-hot block, ``W^O = I``): entries ≥ 0, zero outside the
  support (causal plus padding), rows summing to 1. Control: a query whose support is empty
  (the hypothesis of ``sum_maskedSoftmax``) has a row summing to 0.
- ``attention/convex-hull``: random kernels, 2 heads, ``W^O = I``, ``b^O = 0``: each output
  entry lies within the range of that column of the values ``u W^V + b^V`` over the query's
  support. Control: the same bounds for an output computed without the causal mask.
- ``attention/constant-rows``: with ``W^V = 0`` and ``b^V = c`` (values constant across tokens)
  ``A(u) = c W^O + b^O`` at every query with a non-empty support, for random queries and keys.
  Control: ``W^V`` restored (values vary across tokens).
"""

from __future__ import annotations

import numpy as np

from splitformer.symbolic.derivation import derive
from splitformer.symbolic.scheme import Scheme, Sequence, Substep

from .emitted import emitted_modules
from .parameters import random_parameters
from .semantics import Sizes
from .statements import Check
from .undefined import worst

__all__ = ["attention_kernel_checks", "attention_only"]

_TIGHT, _SEPARATED = 1e-12, 1e-3
_TOKENS, _WIDTH = 4, 8  # one-hot block: features _TOKENS … 2·_TOKENS − 1


def _supports() -> tuple[np.ndarray, np.ndarray]:
    """A padding mask (sequence 1: tokens 0 and 2 padded) and the support it makes with the causal mask."""
    padding = np.zeros((2, _TOKENS), dtype=bool)
    padding[1, [0, 2]] = True  # query 0 of sequence 1 has an empty support
    causal = np.tril(np.ones((_TOKENS, _TOKENS), dtype=bool))
    return padding, causal[None] & ~padding[:, None, :]


def _field(module, params: dict, heads: int):
    def field(u, **masks):
        return module.forward(u, params, n_heads=heads, eps=1e-5, **masks) - u
    return field


def _kernel_rows(module, rng: np.random.Generator) -> Check:
    params = random_parameters(_scheme(), Sizes(_TOKENS, _WIDTH, 1, _WIDTH), 51)
    for name in ("attn.W_q", "attn.W_k"):
        params[name][_TOKENS:] = 0.0  # scores read the random features 0 … 3 only
    params["attn.W_v"] = np.zeros((_WIDTH, _WIDTH))
    params["attn.W_v"][_TOKENS:, _TOKENS:] = np.eye(_TOKENS)
    params["attn.b_v"], params["attn.W_o"], params["attn.b_o"] = np.zeros(_WIDTH), np.eye(_WIDTH), np.zeros(_WIDTH)
    one_hot = np.broadcast_to(np.eye(_TOKENS), (2, _TOKENS, _TOKENS))
    u = np.concatenate([rng.standard_normal((2, _TOKENS, _TOKENS)), one_hot], axis=2)
    padding, support = _supports()
    kernel = _field(module, params, 1)(u, key_padding_mask=padding, causal=True)[:, :, _TOKENS:]
    nonempty = support.any(axis=2)
    sums = kernel.sum(axis=2)
    deviation = worst((float(np.abs(sums[nonempty] - 1).max()), float(np.abs(kernel[~support]).max()),
                       float(-kernel.min())))
    control = float(np.abs(sums[~nonempty] - 1).min())
    return Check(
        "attention/kernel-rows", None,
        "The attention kernel of the emitted code (read off with one-hot values, causal plus padding masks, "
        f"{_TOKENS} tokens, random queries and keys) is a Markov kernel on its support: entries ≥ 0, zero outside "
        "the support, each row with a non-empty support sums to 1 (Lean: attnWeights_sum, sum_maskedSoftmax). "
        "Control: the row of a query with an empty support sums to 0.",
        "numeric", bool(deviation < _TIGHT and control > _SEPARATED),
        f"max deviation (|row sum − 1|, entries outside the support, negative entries) {deviation:.1e}; "
        f"control: |row sum − 1| = {control:.2g} at the empty support")


def _convex_hull(module, rng: np.random.Generator) -> Check:
    heads = 2
    params = random_parameters(_scheme(), Sizes(_TOKENS, _WIDTH, heads, _WIDTH), 52)
    params["attn.W_o"], params["attn.b_o"] = np.eye(_WIDTH), np.zeros(_WIDTH)
    u = rng.standard_normal((2, _TOKENS, _WIDTH))
    padding, support = _supports()
    values = u @ params["attn.W_v"] + params["attn.b_v"]
    field = _field(module, params, heads)

    def excess(output: np.ndarray) -> float:
        gaps = [0.0]
        for b, i in zip(*np.nonzero(support.any(axis=2))):
            seen = values[b, support[b, i]]
            gaps += [float(np.max(output[b, i] - seen.max(axis=0))), float(np.max(seen.min(axis=0) - output[b, i]))]
        return worst(gaps)

    holds = excess(field(u, key_padding_mask=padding, causal=True))
    control = excess(field(u, key_padding_mask=padding))
    return Check(
        "attention/convex-hull", None,
        "Each output of the emitted attention mixing (W^O = I, b^O = 0; 2 heads, random kernels, causal plus "
        "padding masks) lies in the convex hull of the values u W^V + b^V over its support, entry by entry between "
        "the column's minimum and maximum (Lean: attention_le, le_attention). Control: the output computed "
        "without the causal mask, against the same bounds.",
        "numeric", bool(holds < _TIGHT and control > _SEPARATED),
        f"max excess over the bounds {max(holds, 0.0):.1e}; control (no causal mask) {control:.2e}")


def _constant_rows(module, rng: np.random.Generator) -> Check:
    heads = 2
    params = random_parameters(_scheme(), Sizes(_TOKENS, _WIDTH, heads, _WIDTH), 53)
    varying = params["attn.W_v"]
    params["attn.W_v"] = np.zeros_like(varying)
    u = rng.standard_normal((2, _TOKENS, _WIDTH))
    padding, support = _supports()
    nonempty = support.any(axis=2)
    expected = params["attn.b_v"] @ params["attn.W_o"] + params["attn.b_o"]

    def gap(p: dict) -> float:
        return float(np.abs(_field(module, p, heads)(u, key_padding_mask=padding, causal=True)[nonempty]
                            - expected).max())

    holds, control = gap(params), gap({**params, "attn.W_v": varying})
    return Check(
        "attention/constant-rows", None,
        "Values constant across tokens (W^V = 0, b^V = c) are a fixed point of attention mixing: the emitted A(u) "
        "is c W^O + b^O at every query with a non-empty support, for random u, queries and keys (2 heads, causal "
        "plus padding masks; Lean: attention_const). Control: W^V restored, the values vary across tokens.",
        "numeric", bool(holds < _TIGHT and control > _SEPARATED),
        f"max |A(u) − (c W^O + b^O)| {holds:.1e}; control {control:.2e}")


def _scheme() -> Scheme:
    return Scheme("attention-only", "one explicit attention substep", {"attn": "attention"},
                  Sequence((Substep("attn", "explicit"),)))


def attention_only():
    """The scheme ``u + A(u)`` (one explicit attention substep) and its emitted NumPy module."""
    scheme = _scheme()
    return scheme, emitted_modules(scheme, derive(scheme), ("numpy",))["numpy"]


def attention_kernel_checks() -> list[Check]:
    """Rows summing to one, the convex hull of the values, constant values fixed; each with its control."""
    _, module = attention_only()
    rng = np.random.default_rng(50)
    return [_kernel_rows(module, rng), _convex_hull(module, rng), _constant_rows(module, rng)]
