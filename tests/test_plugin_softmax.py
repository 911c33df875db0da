"""A softmax a plug-in writes itself, ``χ H(w − |p(x) − p(x̃)|) e^{a} / ∫ χ H(…) e^{a} dη`` (a window of keys,
``tests/plugins/key_reads.py``), is lowered as the built-in's: its steps and support one bool mask, the row maximum
subtracted, one attention call. Its values are a reference's written here from the formula; in float32, scores past
88 stay finite (``e^a`` overflowed before: the softmax as written)."""

import inspect

import numpy as np
import torch

from splitformer.codegen import lowering

from conftest import derived_plugin, plugin_scheme

D, HEADS, WINDOW = 8, 2, 2


def _derived(tmp_path):
    return derived_plugin(tmp_path, "key_reads.py", plugin_scheme("window-pre-ln", norm1="layer-norm",
                                                                  attn="window-attention"))


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


def _decay(tmp_path):
    return derived_plugin(tmp_path, "decay_mixer.py", plugin_scheme("decay-pre-ln", norm1="layer-norm",
                                                                    mix="decay-mixer"))


def _decay_reference(u, p):
    """``u + W·m + b``, ``m(x, y) = Σ_x̃ w u`` over the earlier keys, ``w ∝ e^{−λ(y)² (p(x) − p(x̃))}`` normalized over
    them (no padding), in float64."""
    mean = u.mean(-1, keepdims=True)
    normed = (u - mean) / np.sqrt(((u - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p["norm1.gain"] + p["norm1.bias"]
    position = np.arange(u.shape[1], dtype=float)
    distance = position[:, None] - position[None, :]
    exponent = np.where(distance[..., None] >= 0, -p["mix.lam"] ** 2 * distance[..., None], -np.inf)  # (i, j, l)
    weights = np.exp(exponent - exponent.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    return u + np.einsum("ijl,bjl->bil", weights, normed) @ p["mix.W"] + p["mix.b"]


def test_weights_normalized_per_feature_are_a_softmax_along_the_keys(tmp_path, monkeypatch):
    """``w(x, x̃, y)`` normalized along ``x̃``, not its last axis: a softmax over a copy with ``x̃`` last, viewed back.
    Written out, ``e^{λ² |p(x) − p(x̃)|}`` of the later keys overflowed in float32 past 88 and the sum was 0·∞."""
    rng = np.random.default_rng(1)
    params = {name: rng.standard_normal([D] * len(axes)) * 0.5 for name, axes in
              (("norm1.gain", "d"), ("norm1.bias", "d"), ("mix.W", "dd"), ("mix.b", "d"))}
    params["mix.lam"] = 1 + rng.random(D)  # λ² (p(x) − p(x̃)) up to 4 · 159
    u = rng.standard_normal((2, 160, D))
    expected = _decay_reference(u, params)
    module = _decay(tmp_path).numpy_module()
    assert "_softmax(" in inspect.getsource(module.forward)
    assert np.abs(module.forward(u, params) - expected).max() < 1e-12
    got = module.forward(u.astype(np.float32), {k: v.astype(np.float32) for k, v in params.items()})
    assert got.dtype == np.float32 and np.abs(got - expected).max() < 1e-4
    monkeypatch.setattr(lowering, "_keeps", lambda factor: False)  # control: the weights as written
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    with np.errstate(all="ignore"):
        written = _decay(tmp_path).numpy_module().forward(u.astype(np.float32),
                                                          {k: v.astype(np.float32) for k, v in params.items()})
    assert not np.isfinite(written).all()


def test_torch_drops_entries_of_an_attention_kernel_only(tmp_path):
    """Dropout in training: on the window attention's kernel γ (as on every built-in attention's), not on the decay
    mixer's weights ``w`` (that kind's outputs only)."""
    window = inspect.getsource(_derived(tmp_path).torch_module())
    decay = inspect.getsource(_decay(tmp_path).torch_module())
    assert any("_attention(attn_q" in line and line.rstrip().endswith("dropout_p)") for line in window.splitlines())
    kernel = [line for line in decay.splitlines() if "= _softmax(" in line]
    assert kernel and not any("dropout_p" in line for line in kernel)
