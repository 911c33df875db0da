"""Incremental decoding: a key/value cache makes token-by-token equal the full causal forward."""

import numpy as np
import pytest
import torch

from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

from conftest import GENERATED, ROOT, import_path
import reference


def _modules(name):
    return import_path(GENERATED / "numpy" / f"{name}.py"), import_path(GENERATED / "torch" / f"{name}.py")


@pytest.fixture(scope="module")
def rotary(tmp_path_factory):
    out = tmp_path_factory.mktemp("rotary")
    write_files(generate(load_scheme(str(ROOT / "tests" / "schemes" / "rotary-residual.toml")), ("numpy", "torch"), out))
    return import_path(out / "numpy" / "rotary_residual.py"), import_path(out / "torch" / "rotary_residual.py")


def _stack_params(module, n_layers, rng, d=8, d_ff=12, **sizes):
    return [reference.random_params(module.PARAMETERS, d, d_ff, rng, **sizes) for _ in range(n_layers)]


@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 1, 2]], ids=["token-by-token", "prefill-then-tokens"])
def test_gpt2_stack_decodes_incrementally(chunks, rng):
    numpy_module, torch_module = _modules("gpt2")
    layers = _stack_params(numpy_module, 2, rng)
    final_norm = {"gain": rng.standard_normal(8), "bias": rng.standard_normal(8)}
    u = rng.standard_normal((2, 7, 8))
    full = numpy_module.forward_stack(u, layers, n_heads=2, final_norm=final_norm)
    cache = [{} for _ in layers]
    steps, start = [], 0
    for length in chunks:
        steps.append(numpy_module.forward_stack(u[:, start:start + length], layers, n_heads=2, final_norm=final_norm,
                                                cache=cache))
        start += length
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10
    assert cache[0]["attn.k"].shape == (2, 7, 2, 4)
    stack = torch_module.Stack(2, 8, 2, 12, dtype=torch.float64).load_params(layers, final_norm)
    cache, steps, start = [{} for _ in layers], [], 0
    with torch.no_grad():
        for length in chunks:
            steps.append(stack(torch.tensor(u[:, start:start + length]), cache=cache).numpy())
            start += length
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10


def test_without_the_cache_tokens_forget_their_past(rng):
    """Negative control: one token at a time without a cache is not the causal forward."""
    numpy_module, _ = _modules("gpt2")
    params = _stack_params(numpy_module, 1, rng)[0]
    u = rng.standard_normal((1, 5, 8))
    full = numpy_module.forward(u, params, n_heads=2)
    alone = np.concatenate([numpy_module.forward(u[:, i:i + 1], params, n_heads=2) for i in range(5)], axis=1)
    assert np.abs(alone - full)[:, 1:].max() > 1e-3


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_rotary_attention_decodes_with_position_offsets(rotary, n_kv_heads, rng):
    """Positions continue from the cache length: token t is rotated by t, as in the full forward."""
    numpy_module, torch_module = rotary
    params = reference.random_params(numpy_module.PARAMETERS, 16, 1, rng, d_kv=4 * n_kv_heads)
    u = rng.standard_normal((2, 6, 16))
    options = {"n_heads": 4, "n_kv_heads": n_kv_heads, "rope_theta": 50.0}
    full = numpy_module.forward(u, params, **options)
    cache = {}
    steps = [numpy_module.forward(u[:, i:i + 1], params, cache=cache, **options) for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10
    block = torch_module.Block(16, 4, 1, n_kv_heads=n_kv_heads, rope_theta=50.0, dtype=torch.float64)
    block.load_params(params)
    cache = {}
    with torch.no_grad():
        steps = [block(torch.tensor(u[:, i:i + 1]), cache=cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10
    assert cache["attn.kr"].shape == (2, 6, n_kv_heads, 2, 2)


def test_grouped_heads_decode_with_a_padding_mask(rng):
    """Grouped llama, prefill then token by token, the prompt's first tokens of one sequence padded (left padding, as
    batched generation pads): each step's one query row, seen by each member of its group, keeps the keys the mask
    keeps, as in the full causal forward with the same mask (both backends)."""
    numpy_module, torch_module = _modules("llama")
    params = reference.random_params(numpy_module.PARAMETERS, 16, 12, rng, d_kv=8)
    u = rng.standard_normal((2, 7, 16))
    mask = np.zeros((2, 7), dtype=bool)
    mask[1, :2] = True
    options = {"n_heads": 4, "n_kv_heads": 2}
    full = numpy_module.forward(u, params, key_padding_mask=mask, **options)
    assert np.abs(full - numpy_module.forward(u, params, **options))[1, 2:].max() > 1e-3  # the mask matters
    cache = {}
    steps = [numpy_module.forward(u[:, :3], params, key_padding_mask=mask[:, :3], cache=cache, **options)]
    steps += [numpy_module.forward(u[:, i:i + 1], params, key_padding_mask=mask[:, :i + 1], cache=cache, **options)
              for i in range(3, 7)]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10
    block = torch_module.Block(16, 4, 12, n_kv_heads=2, dtype=torch.float64).load_params(params)
    cache, padding = {}, torch.tensor(mask)
    with torch.no_grad():
        steps = [block(torch.tensor(u[:, :3]), key_padding_mask=padding[:, :3], cache=cache).numpy()]
        steps += [block(torch.tensor(u[:, i:i + 1]), key_padding_mask=padding[:, :i + 1], cache=cache).numpy()
                  for i in range(3, 7)]
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-10


def test_cache_mismatch_is_named(rng):
    numpy_module, _ = _modules("gpt2")
    params = _stack_params(numpy_module, 1, rng)[0]
    cache = {}
    numpy_module.forward(rng.standard_normal((2, 3, 8)), params, n_heads=2, cache=cache)
    with pytest.raises(ValueError, match="cache\\['attn.k'\\]"):
        numpy_module.forward(rng.standard_normal((3, 1, 8)), params, n_heads=2, cache=cache)
    with pytest.raises(TypeError, match="cache must be a dict"):
        numpy_module.forward(rng.standard_normal((2, 1, 8)), params, n_heads=2, cache=[])
