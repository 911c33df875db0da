"""A torch cache grows into spare tokens: a decoding step writes its own keys and values after the cached ones
instead of concatenating the whole cache (``_spare_extended``), and copies of one cache never write over each
other. The reference is the NumPy stack's full pass over each sequence."""

import numpy as np
import pytest
import torch

from conftest import GENERATED, import_path
import reference


def _torch_module():
    return import_path(GENERATED / "torch" / "gpt2.py")


@pytest.fixture
def model(rng):
    numpy_module = import_path(GENERATED / "numpy" / "gpt2.py")
    layers = [reference.random_params(numpy_module.PARAMETERS, 8, 12, rng) for _ in range(2)]
    final_norm = {"gain": rng.standard_normal(8), "bias": rng.standard_normal(8)}

    def full(u):
        return numpy_module.forward_stack(u, layers, n_heads=2, final_norm=final_norm)

    def stack(module):
        return module.Stack(2, 8, 2, 12, dtype=torch.float64).load_params(layers, final_norm)
    return full, stack


def _decoded(stack, u, cache, start, stop, context=torch.no_grad):
    steps = []
    with context():
        for index in range(start, stop):
            steps.append(stack(torch.tensor(u[:, index:index + 1]), cache=cache).numpy())
    return np.concatenate(steps, axis=1)


def test_steps_write_into_spare_tokens_of_one_buffer(model, rng):
    full, build = model
    stack, u = build(_torch_module()), rng.standard_normal((2, 40, 8))
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        prompt = stack(torch.tensor(u[:, :4]), cache=cache).numpy()
    first = _decoded(stack, u, cache, 4, 5)
    buffer = cache[0]["attn.k"].untyped_storage().data_ptr()
    rest = _decoded(stack, u, cache, 5, 20)
    assert cache[0]["attn.k"].untyped_storage().data_ptr() == buffer  # 16 spare tokens after the first step
    assert cache[0]["attn.k"].shape == (2, 20, 2, 4)
    rest = np.concatenate([rest, _decoded(stack, u, cache, 20, 40)], axis=1)  # past the spare tokens: a new buffer
    assert cache[0]["attn.k"].untyped_storage().data_ptr() != buffer
    assert np.abs(np.concatenate([prompt, first, rest], axis=1) - full(u)).max() <= 1e-10


def _forked(stack, u, v):
    """Two copies of one cache after a prompt and a step, each then fed its own tokens (``u`` and ``v``)."""
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        stack(torch.tensor(u[:, :3]), cache=cache)
    _decoded(stack, u, cache, 3, 4)
    fork = [dict(entry) for entry in cache]
    ours, theirs = [], []
    for index in range(4, 8):  # alternating: each copy writes where the other would
        ours.append(_decoded(stack, u, cache, index, index + 1))
        theirs.append(_decoded(stack, v, fork, index, index + 1))
    return np.concatenate(ours, axis=1), np.concatenate(theirs, axis=1)


def test_copies_of_a_cache_never_write_over_each_other(model, rng):
    full, build = model
    u = rng.standard_normal((1, 8, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, theirs = _forked(build(_torch_module()), u, v)
    assert np.abs(ours - full(u)[:, 4:]).max() <= 1e-10
    assert np.abs(theirs - full(v)[:, 4:]).max() <= 1e-10


def test_without_the_record_of_tokens_written_copies_collide(model, rng, tmp_path):
    """Negative control: writing whenever the buffer has room lets one copy overwrite the other's tokens."""
    full, build = model
    source = (GENERATED / "torch" / "gpt2.py").read_text(encoding="utf-8")
    assert "record[0] == old.shape[1] and " in source
    (tmp_path / "ignoring.py").write_text(source.replace("record[0] == old.shape[1] and ", ""), encoding="utf-8")
    ignoring = import_path(tmp_path / "ignoring.py", "_spare_tokens_ignoring")
    u = rng.standard_normal((1, 8, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, theirs = _forked(build(ignoring), u, v)
    assert np.abs(ours - full(u)[:, 4:]).max() > 1e-3


def test_a_callers_tensor_with_room_is_never_written(model, rng):
    full, build = model
    stack, u = build(_torch_module()), rng.standard_normal((1, 6, 8))
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        stack(torch.tensor(u[:, :4]), cache=cache)
    held = {}
    for layer, entry in enumerate(cache):
        for key in ("attn.k", "attn.v"):
            room = torch.full((1, 10) + tuple(entry[key].shape[2:]), 7.0, dtype=torch.float64)
            room[:, :4] = entry[key]
            held[layer, key] = room
            entry[key] = room[:, :4]  # a view with room after it, not allocated by the stack
    steps = _decoded(stack, u, cache, 4, 6)
    assert all(bool((room[:, 4:] == 7.0).all()) for room in held.values())
    assert np.abs(steps - full(u)[:, 4:]).max() <= 1e-10


def test_a_cache_of_inference_mode_goes_on_outside_it_and_with_autograd(model, rng):
    full, build = model
    stack, u = build(_torch_module()), rng.standard_normal((1, 8, 8))
    cache = [{} for _ in range(2)]
    with torch.inference_mode():
        stack(torch.tensor(u[:, :3]), cache=cache)
    inside = _decoded(stack, u, cache, 3, 5, torch.inference_mode)
    outside = _decoded(stack, u, cache, 5, 7)  # torch refuses writes into inference tensors here: a new buffer
    step = torch.tensor(u[:, 7:8], requires_grad=True)
    last = stack(step, cache=cache)  # autograd: concatenated
    last.sum().backward()
    assert step.grad is not None and bool(torch.isfinite(step.grad).all())
    decoded = np.concatenate([inside, outside, last.detach().numpy()], axis=1)
    assert np.abs(decoded - full(u)[:, 3:]).max() <= 1e-10


def test_a_rolled_back_cache_decodes_its_own_continuation(model, rng):
    """A cache cut back to fewer tokens (a view of the same buffer) takes a new buffer rather than the spare tokens,
    which hold the tokens it dropped."""
    full, build = model
    stack, u = build(_torch_module()), rng.standard_normal((1, 9, 8))
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        stack(torch.tensor(u[:, :3]), cache=cache)
    _decoded(stack, u, cache, 3, 6)
    for entry in cache:
        for key in ("attn.k", "attn.v"):
            entry[key] = entry[key][:, :4]
        entry["key_padding_mask"] = entry["key_padding_mask"][:, :4]
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 5, 8))
    steps = _decoded(stack, v, cache, 4, 9)
    assert np.abs(steps - full(v)[:, 4:]).max() <= 1e-10
