"""A softmax a plug-in writes itself, ``χ H(w − |p(x) − p(x̃)|) e^{a} / ∫ χ H(…) e^{a} dη`` (a window of keys,
``tests/plugins/key_reads.py``), is lowered as the built-in's: its steps and support one bool mask, the row maximum
subtracted, one attention call. Its values are a reference's written here from the formula; in float32, scores past
88 stay finite (``e^a`` overflowed before: the softmax as written)."""

import inspect

import numpy as np
import pytest
import torch

import splitformer
from splitformer.codegen import lowering

from conftest import ROOT

SCHEME = '''name = "window-pre-ln"
summary = "pre-LN with attention over a window of keys"
[operators]
norm1 = "layer-norm"
attn = "window-attention"
[[steps]]
operator = "attn"
solver = "explicit"
on = "norm1"
'''
D, HEADS, WINDOW = 8, 2, 2


def _derived(tmp_path):
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "key_reads.py")
    (tmp_path / "s.toml").write_text(SCHEME, encoding="utf-8")
    return splitformer.derive(str(tmp_path / "s.toml"))


def _reference(u, p, padded, causal):
    """One explicit step of ``u + A(LN(u))``, A attention whose softmax keeps the keys at most ``WINDOW`` positions
    from the query, not padded (and not later, if ``causal``); a query keeping none gets the output bias alone."""
    batch, n, _ = u.shape
    mean = u.mean(-1, keepdims=True)
    normed = (u - mean) / np.sqrt(((u - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p["norm1.gain"] + p["norm1.bias"]
    q, k, v = ((normed @ p[f"attn.W_{x}"] + p[f"attn.b_{x}"]).reshape(batch, n, HEADS, -1) for x in "qkv")
    scores = np.einsum("bihe,bjhe->bhij", q, k) / np.sqrt(D // HEADS)
    position = np.arange(n)
    kept = (np.abs(position[:, None] - position[None, :]) <= WINDOW)[None] & ~padded[:, None, :]
    if causal:
        kept = kept & (position[None, :] <= position[:, None])[None]
    kept = kept[:, None]
    largest = np.where(kept, scores, -np.inf).max(-1, keepdims=True, initial=-1e300)
    weights = np.exp(np.where(kept, scores - largest, -np.inf))
    total = weights.sum(-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    mixed = np.einsum("bhij,bjhe->bihe", weights, v).reshape(batch, n, D)
    return u + mixed @ p["attn.W_o"] + p["attn.b_o"]


def _inputs(dtype, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    params = {name: rng.standard_normal([D] * len(axes)) * 0.5 for name, axes in
              (("norm1.gain", "d"), ("norm1.bias", "d"), *((f"attn.{w}_{x}", ax) for x in "qkvo"
                                                          for w, ax in (("W", "dd"), ("b", "d"))))}
    params["attn.W_q"] *= scale
    params["attn.W_k"] *= scale
    padded = np.zeros((3, 9), bool)
    padded[1, 4:] = True
    padded[2, :] = True  # every key padded: the queries of this sequence keep none
    u = rng.standard_normal((3, 9, D))
    return {k: v.astype(dtype) for k, v in params.items()}, u.astype(dtype), padded


def test_the_window_softmax_is_one_attention_call_with_the_reference_values(tmp_path):
    derived = _derived(tmp_path)
    numpy_module, torch_module = derived.numpy_module(), derived.torch_module()
    for module in (numpy_module, torch_module):
        code = [line for line in inspect.getsource(module).splitlines() if not line.strip().startswith("#")]
        assert any("_attention(attn_q" in line for line in code)  # before: exp(attn_a) computed, summed, divided
        assert not any("exp(attn_a" in line for line in code)
    params, u, padded = _inputs(np.float64)
    for causal in (False, True):
        expected = _reference(u, params, padded, causal)
        got = numpy_module.forward(u, params, n_heads=HEADS, key_padding_mask=padded, causal=causal)
        assert np.abs(got - expected).max() < 1e-12
        block = torch_module.Block(D, HEADS, D, dtype=torch.float64).load_params(params)
        with torch.no_grad():
            got = block(torch.from_numpy(u), key_padding_mask=torch.from_numpy(padded), is_causal=causal).numpy()
        assert np.abs(got - expected).max() < 1e-12
    control = _reference(u, params, padded | True, False)  # another mask: the comparison sees the window
    assert np.abs(numpy_module.forward(u, params, n_heads=HEADS, key_padding_mask=padded) - control).max() > 1e-3


def test_float32_scores_past_the_exponential_range_stay_finite(tmp_path, monkeypatch):
    params, u, padded = _inputs(np.float32, scale=12.0)
    expected = _reference(u.astype(np.float64), {k: v.astype(np.float64) for k, v in params.items()}, padded, False)
    got = _derived(tmp_path).numpy_module().forward(u, params, n_heads=HEADS, key_padding_mask=padded)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()
    # control: the softmax as written (its steps not taken as a mask) overflows
    monkeypatch.setattr(lowering, "_keeps", lambda factor: False)
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    with np.errstate(all="ignore"):
        written = _derived(tmp_path).numpy_module().forward(u, params, n_heads=HEADS, key_padding_mask=padded)
    assert not np.isfinite(written).all()


def test_every_check_holds(tmp_path):
    report = _derived(tmp_path).check(only=("semantics", "adjoint-test", "causality"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
