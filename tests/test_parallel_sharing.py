"""Parallel steps whose branches share an operator evaluation, in any order of the branches.

A one-substep branch listed before a branch that evaluates the same operator on the same state
once emitted code reading ``ffn_out`` before computing it. The emitted NumPy and PyTorch modules
are compared here with a plain NumPy reference written in this file (float64).
"""

import numpy as np
import pytest
import torch

from splitformer.codegen.verification.emitted import emitted_modules
from splitformer.codegen.verification.parameters import random_parameters
from splitformer.codegen.verification.semantics import Sizes
from splitformer.symbolic import derive, load_scheme

from conftest import ROOT

SCHEMES = ROOT / "tests" / "schemes"
D, HEADS, D_FF, TOKENS, EPS = 8, 2, 12, 5, 1e-5


def layer_norm(p, key, u):
    mean = u.mean(-1, keepdims=True)
    variance = ((u - mean) ** 2).mean(-1, keepdims=True)
    return (u - mean) / np.sqrt(variance + EPS) * p[f"{key}.gain"] + p[f"{key}.bias"]


def feed_forward(p, u):
    return np.maximum(u @ p["ffn.W_1"] + p["ffn.b_1"], 0) @ p["ffn.W_2"] + p["ffn.b_2"]


def attention(p, u, allowed):
    """Multi-head softmax attention; a query with no allowed key gets a zero kernel."""
    q, k, v = (u @ p[f"attn.W_{c}"] + p[f"attn.b_{c}"] for c in "qkv")
    width, heads = D // HEADS, []
    for h in range(HEADS):
        cut = slice(h * width, (h + 1) * width)
        scores = q[:, cut] @ k[:, cut].T / np.sqrt(width)
        weights = np.where(allowed, np.exp(scores - scores.max(-1, keepdims=True)), 0.0)
        totals = weights.sum(-1, keepdims=True)
        heads.append(np.divide(weights, totals, out=np.zeros_like(weights), where=totals > 0) @ v[:, cut])
    return np.concatenate(heads, -1) @ p["attn.W_o"] + p["attn.b_o"]


def shared_first(p, u, allowed):
    """``−(u + F(LN u)) + 2 (two half steps)``."""
    def half(state):
        return state + feed_forward(p, layer_norm(p, "norm", state)) / 2
    return -(u + feed_forward(p, layer_norm(p, "norm", u))) + 2 * half(half(u))


def shared_nested(p, u, allowed):
    def ffn(state, fraction):
        return state + fraction * feed_forward(p, layer_norm(p, "norm", state))

    def attn(state, fraction):
        return state + fraction * attention(p, layer_norm(p, "norm", state), allowed)

    inner = 1.5 * attn(u, 1) - 0.5 * ffn(attn(u, 0.5), 0.5)
    return -2 * ffn(u, 1 / 3) + 2.5 * ffn(inner, 1 / 3) + 0.5 * u


@pytest.mark.parametrize("file, reference", [("shared-first.toml", shared_first),
                                             ("shared-nested.toml", shared_nested)])
def test_branches_sharing_an_evaluation_match_a_numpy_reference(file, reference):
    scheme = load_scheme(str(SCHEMES / file))
    modules = emitted_modules(scheme, derive(scheme))
    params = random_parameters(scheme, Sizes(TOKENS, D, HEADS, D_FF), seed=11)
    assert all(np.abs(value).min() > 0 for value in params.values())  # no zero bias hides a term
    u = np.random.default_rng(12).standard_normal((2, TOKENS, D))
    padded = np.zeros((2, TOKENS), dtype=bool)
    padded[1, [0, 3]] = True  # with the causal mask, query 0 of sequence 1 sees no key
    block = modules["torch"].Block(D, HEADS, D_FF, eps=EPS, dtype=torch.float64)
    block.load_params(params)
    for mask, causal in ((None, False), (padded, True)):
        allowed = [np.array([[(mask is None or not mask[b, j]) and (not causal or j <= i) for j in range(TOKENS)]
                             for i in range(TOKENS)]) for b in range(2)]
        expected = np.stack([reference(params, u[b], allowed[b]) for b in range(2)])
        got = modules["numpy"].forward(u, params, n_heads=HEADS, eps=EPS, key_padding_mask=mask, causal=causal)
        assert np.abs(got - expected).max() < 1e-12
        with torch.no_grad():
            got = block(torch.tensor(u), key_padding_mask=None if mask is None else torch.tensor(mask),
                        causal=causal).numpy()
        assert np.abs(got - expected).max() < 1e-12
