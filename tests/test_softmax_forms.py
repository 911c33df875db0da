"""Softmaxes in the forms of ``tests/plugins/softmax_forms.py``: NumPy and torch equal references written here from
their formulas (float64), and with float32 scores past 88 the masked softmaxes stay finite (the row maximum
subtracted). Each case's control: the reference without what the form adds (its mask, its scores' transform)."""

import numpy as np
import pytest
import torch


from splitformer.codegen import lowering

from conftest import derived_plugin, plugin_scheme

B, N, D, HEADS = 3, 9, 8, 2
KINDS = ["r-talk", "r-transposed", "r-weight", "r-qstep", "r-alibi-two", "r-alibi-nomask", "r-chunk"]


def _derived(tmp_path, kind):
    operators = {"op": kind} if kind in ("r-feature", "r-flat") else {"norm1": "layer-norm", "attn": kind}
    return derived_plugin(tmp_path, "softmax_forms.py", plugin_scheme(f"s-{kind}", **operators))


def _params(module, scale=1.0):
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal([{"d": D, "n_heads": HEADS}[axis] for axis in axes]) * 0.5
              for name, axes in module.PARAMETERS.items()}
    for name in params:
        if name.endswith("slopes"):
            params[name] = np.abs(params[name]) + 0.1
        if name.endswith(("W_q", "W_k")):
            params[name] *= scale
    return params


def _softmax(keep, scores):
    """Row softmax of ``scores`` over the kept keys; 0 on a row that keeps none."""
    scores = np.where(keep, scores, -np.inf)
    largest = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(largest), largest, 0))
    total = weights.sum(-1, keepdims=True)
    return weights / np.where(total > 0, total, 1)


def _reference(kind, u, p, padded, plain=False):
    """One explicit step ``u + A(LN(u))`` with the kind's weights; ``plain``: the built-in softmax's instead."""
    mean = u.mean(-1, keepdims=True)
    normed = (u - mean) / np.sqrt(((u - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p["norm1.gain"] + p["norm1.bias"]
    q, k, v = ((normed @ p[f"attn.W_{x}"] + p[f"attn.b_{x}"]).reshape(B, N, HEADS, -1) for x in "qkv")
    scores = np.einsum("bihe,bjhe->bhij", q, k) / np.sqrt(q.shape[-1])
    keep = np.broadcast_to(~padded[:, None, None, :], scores.shape)
    position = np.arange(N, dtype=float)
    distance = np.abs(position[:, None] - position[None])
    if plain:
        pass
    elif kind == "r-talk":
        scores = np.einsum("hf,bfij->bhij", p["attn.mix"], scores)
    elif kind == "r-transposed":
        scores = scores.transpose(0, 1, 3, 2)
    elif kind == "r-alibi-two":
        keep, scores = keep & (distance <= 2), scores - p["attn.slopes"][None, :, None, None] * distance
    elif kind == "r-alibi-nomask":
        keep, scores = np.ones_like(keep), scores - p["attn.slopes"][None, :, None, None] * distance
    elif kind == "r-chunk":
        keep = keep & (np.floor(position[:, None] / 3) == np.floor(position[None] / 3))
    elif kind == "r-weight":
        keep, scores = np.ones_like(keep), scores + np.log(1 / (1 + distance))
    elif kind == "r-qstep":
        keep = keep & (position[:, None] >= 3)
    mixed = np.einsum("bhij,bjhe->bihe", _softmax(keep, scores), v).reshape(B, N, D)
    return u + mixed @ p["attn.W_o"] + p["attn.b_o"]


def _inputs():
    rng = np.random.default_rng(1)
    padded = np.zeros((B, N), bool)
    padded[1, 4:] = True
    padded[2] = True  # a sequence all padding: its queries keep no key
    return rng.standard_normal((B, N, D)), padded


@pytest.mark.parametrize("kind", KINDS)
def test_the_softmax_form_equals_its_reference(tmp_path, kind):
    derived = _derived(tmp_path, kind)
    numpy_module = derived.numpy_module()
    u, padded = _inputs()
    params = _params(numpy_module)
    expected = _reference(kind, u, params, padded)
    got = numpy_module.forward(u, params, n_heads=HEADS, key_padding_mask=padded)
    assert np.abs(got - expected).max() < 1e-12
    block = derived.torch_module().Block(D, HEADS, D, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        got_torch = block(torch.from_numpy(u), key_padding_mask=torch.from_numpy(padded)).numpy()
    assert np.abs(got_torch - expected).max() < 1e-12
    assert np.abs(got - _reference(kind, u, params, padded, plain=True)).max() > 1e-3  # control


@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "r-weight"])  # a weight: as written
def test_float32_scores_past_88_stay_finite(tmp_path, monkeypatch, kind):
    """Finite, and 1e-4 of the largest output from float64; control: the softmax as written overflows."""
    numpy_module = _derived(tmp_path, kind).numpy_module()
    u, padded = _inputs()
    params = _params(numpy_module, scale=20.0)
    expected = _reference(kind, u, params, padded)
    got = numpy_module.forward(u.astype(np.float32), {k: v.astype(np.float32) for k, v in params.items()},
                               n_heads=HEADS, key_padding_mask=padded)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()
    monkeypatch.setattr(lowering.Lowering, "softmax", lambda self, out, labels, rhs: None)  # control: as written
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    with np.errstate(all="ignore"):
        written = _derived(tmp_path, kind).numpy_module().forward(
            u.astype(np.float32), {k: v.astype(np.float32) for k, v in params.items()}, n_heads=HEADS,
            key_padding_mask=padded)
    assert not np.isfinite(written).all()


def test_a_softmax_per_feature_with_its_key_between_equals_its_reference(tmp_path):
    """``g(x, y, x̃) ∝ χ e^{u(x̃, y)}``: normalized along its last axis, the scores read in another order."""
    u, padded = _inputs()
    keep = np.broadcast_to(~padded[:, None, None, :], (B, N, D, N))  # (b, i, l, j)
    scores = np.broadcast_to(u.transpose(0, 2, 1)[:, None], (B, N, D, N))
    expected = u + np.einsum("bilj,bjl->bil", _softmax(keep, scores), u)
    got = _derived(tmp_path, "r-feature").numpy_module().forward(u, {}, key_padding_mask=padded)
    assert np.abs(got - expected).max() < 1e-12
    assert np.abs(got - (u + np.einsum("bilj,bjl->bil", _softmax(keep, -scores), u))).max() > 1e-3  # control


def test_weights_per_feature_that_read_no_feature_equal_their_reference(tmp_path):
    """``g(x, x̃, y) ∝ χ e^{−|p(x) − p(x̃)|}``: normalized along its middle axis, it reads no feature index to be viewed
    back by (it crashed), and stays as written."""
    u, padded = _inputs()
    position = np.arange(N, dtype=float)
    keep = np.broadcast_to(~padded[:, None, :], (B, N, N))
    weights = _softmax(keep, np.broadcast_to(-np.abs(position[:, None] - position[None]), (B, N, N)))
    got = _derived(tmp_path, "r-flat").numpy_module().forward(u, {}, key_padding_mask=padded)
    assert np.abs(got - (u + weights @ u)).max() < 1e-12
    assert np.abs(got - (u + _softmax(keep, np.zeros((B, N, N))) @ u)).max() > 1e-3  # control: uniform weights
