"""Stacks and masks: ``forward_stack`` and ``Stack`` against ``torch.nn.TransformerEncoder``."""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters import from_torch

import reference
from conftest import GENERATED, import_path

D, HEADS, FF, EPS, LAYERS = 8, 2, 12, 1e-5, 3


def _encoder(norm_first, seed=0):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             layer_norm_eps=EPS, dtype=torch.float64)
    final = torch.nn.LayerNorm(D, eps=EPS, dtype=torch.float64) if norm_first else None
    encoder = torch.nn.TransformerEncoder(layer, LAYERS, norm=final, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for parameter in encoder.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    layers = [from_torch(layer) for layer in encoder.layers]
    final_norm = {"gain": final.weight.detach().numpy(), "bias": final.bias.detach().numpy()} if final else None
    return encoder, layers, final_norm


def _padding(batch=3, tokens=6):
    mask = np.zeros((batch, tokens), dtype=bool)
    mask[0, 4:] = True
    mask[2, 1:] = True
    return mask


@pytest.mark.parametrize("name, norm_first", [("post_ln", False), ("pre_ln", True)])
@pytest.mark.parametrize("masking", ["padding", "causal", "both"])
def test_stack_matches_torch_encoder(name, norm_first, masking, rng):
    numpy_module = import_path(GENERATED / "numpy" / f"{name}.py")
    torch_module = import_path(GENERATED / "torch" / f"{name}.py")
    encoder, layers, final_norm = _encoder(norm_first)
    u = rng.standard_normal((3, 6, D))
    padding = _padding() if masking in ("padding", "both") else None
    causal = masking in ("causal", "both")
    causal_mask = torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else None  # True = not allowed
    with torch.no_grad():
        expected = encoder(torch.tensor(u), mask=causal_mask, is_causal=causal,
                           src_key_padding_mask=None if padding is None else torch.tensor(padding)).numpy()
    keep = ~padding if padding is not None else np.ones((3, 6), dtype=bool)  # torch's fast path zeroes padded rows
    out = numpy_module.forward_stack(u, layers, n_heads=HEADS, eps=EPS, final_norm=final_norm,
                                     key_padding_mask=padding, causal=causal)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    stack = torch_module.Stack(LAYERS, D, HEADS, FF, eps=EPS, final_norm=norm_first, dtype=torch.float64)
    stack.load_params(layers, final_norm)
    result = stack(torch.tensor(u), key_padding_mask=None if padding is None else torch.tensor(padding),
                   causal=causal).detach().numpy()
    assert np.abs(result - expected)[keep].max() <= 1e-10


def test_stack_defaults_follow_the_scheme():
    pre = import_path(GENERATED / "torch" / "pre_ln.py")
    post = import_path(GENERATED / "torch" / "post_ln.py")
    assert pre.Stack(2, D, HEADS, FF).has_final_norm and "final_norm.gain" in pre.Stack(2, D, HEADS, FF).state_dict()
    assert not post.Stack(2, D, HEADS, FF).has_final_norm


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fully_masked_row_has_zero_attention_and_no_nan(backend, rng):
    """A query whose support is empty: the token integral vanishes, the attention term is b^O."""
    numpy_module = import_path(GENERATED / "numpy" / "pre_ln.py")
    params = reference.random_params(numpy_module.PARAMETERS, D, FF, rng)
    u = rng.standard_normal((2, 4, D))
    padding = np.zeros((2, 4), dtype=bool)
    padding[1, :] = True  # every key of sequence 1 is padding
    if backend == "numpy":
        out = numpy_module.forward(u, params, n_heads=HEADS, key_padding_mask=padding)
    else:
        torch_module = import_path(GENERATED / "torch" / "pre_ln.py")
        block = torch_module.Block(D, HEADS, FF, dtype=torch.float64).load_params(params)
        out = block(torch.tensor(u), key_padding_mask=torch.tensor(padding)).detach().numpy()
    assert np.isfinite(out).all()
    # sequence 1: ∫ γ V = 0, so the attention substep adds only the output bias
    x = u[1:] + params["attn.b_o"]
    expected = x + reference.feed_forward(reference.norm(x, params, "norm2", 1e-5), params)
    assert np.abs(out[1:] - expected).max() <= 1e-12


def test_bad_mask_is_rejected(rng):
    numpy_module = import_path(GENERATED / "numpy" / "post_ln.py")
    params = reference.random_params(numpy_module.PARAMETERS, D, FF, rng)
    with pytest.raises(ValueError, match=r"key_padding_mask must be bool of shape \(2, 4\)"):
        numpy_module.forward(np.zeros((2, 4, D)), params, n_heads=HEADS, key_padding_mask=np.zeros((2, 4)))


@pytest.mark.parametrize("name, norm_first", [("post_ln", False), ("pre_ln", True)])
def test_one_unbatched_sequence_takes_a_tokens_mask_as_torch_does(name, norm_first, rng):
    """New user, s32: ``nn.TransformerEncoder`` takes a (tokens,) padding mask with a (tokens, d) input; the generated
    code asked for (1, tokens). Both backends take it now, against the encoder; a (tokens,) mask for a batch of 3 is
    still refused (control)."""
    numpy_module = import_path(GENERATED / "numpy" / f"{name}.py")
    torch_module = import_path(GENERATED / "torch" / f"{name}.py")
    encoder, layers, final_norm = _encoder(norm_first)
    u, padding = rng.standard_normal((6, D)), np.array([False] * 4 + [True] * 2)
    with torch.no_grad():
        expected = encoder(torch.tensor(u), src_key_padding_mask=torch.tensor(padding)).numpy()[:4]
    out = numpy_module.forward_stack(u, layers, n_heads=HEADS, eps=EPS, final_norm=final_norm, key_padding_mask=padding)
    assert out.shape == (6, D) and np.abs(out[:4] - expected).max() <= 1e-10
    stack = torch_module.Stack(LAYERS, D, HEADS, FF, eps=EPS, final_norm=norm_first, dtype=torch.float64)
    stack.load_params(layers, final_norm)
    with torch.no_grad():
        result = stack(torch.tensor(u), src_key_padding_mask=torch.tensor(padding)).numpy()
    assert np.abs(result[:4] - expected).max() <= 1e-10
    with pytest.raises(ValueError, match=r"key_padding_mask must be bool of shape \(3, 6\)"):
        numpy_module.forward_stack(np.stack([u] * 3), layers, n_heads=HEADS, key_padding_mask=padding)
    with pytest.raises(ValueError, match=r"key_padding_mask must be bool or float of shape \[3, 6\]"):
        stack(torch.tensor(np.stack([u] * 3)), key_padding_mask=torch.tensor(padding))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_one_sequences_mask_is_cached_as_its_batch_of_one(backend, rng):
    """Review of s32: the first cached step took a (tokens,) mask and stored it as given, and the next step refused
    the cache's record ((5,) where (1, 5) is kept). Cached decoding with (tokens,) masks equals the full pass."""
    from splitformer.adapters import canonical

    torch_module = import_path(GENERATED / "torch" / "llama.py")
    block = torch_module.Block(16, 4, 24, dtype=torch.float64)
    u, mask = rng.standard_normal((6, 16)), np.array([True] + [False] * 5)
    if backend == "numpy":
        module, params = import_path(GENERATED / "numpy" / "llama.py"), canonical(block)[0][0]

        def run(v, m, **cache):
            return module.forward(v, params, n_heads=4, n_kv_heads=4, key_padding_mask=m, **cache)
    else:
        def run(v, m, **cache):
            with torch.no_grad():
                return block(torch.tensor(v), key_padding_mask=torch.tensor(m), **cache).numpy()
    full, cache = run(u, mask), {}
    run(u[:5], mask[:5], cache=cache)
    assert np.abs(run(u[5:], mask, cache=cache) - full[5:]).max() <= 1e-12
