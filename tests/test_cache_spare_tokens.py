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


def _spare_tokens(view):
    """The buffer a cache entry begins, past its tokens."""
    capacity = view.untyped_storage().splitformer_spare[2]
    return view.as_strided([view.shape[0], capacity] + list(view.shape[2:]), view.stride())[:, view.shape[1]:]


def test_steps_write_into_spare_tokens_of_one_buffer(model, rng):
    full, build = model
    stack, u = build(_torch_module()), rng.standard_normal((2, 40, 8))
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        prompt = stack(torch.tensor(u[:, :4]), cache=cache).numpy()
    first = _decoded(stack, u, cache, 4, 6)  # the prompt's copy, then its exact extension: no spare tokens yet
    buffer = cache[0]["attn.k"].untyped_storage().data_ptr()
    assert bool((_spare_tokens(cache[0]["attn.k"]) == 0).all())  # zeroed: a saved cache holds no stray memory
    rest = _decoded(stack, u, cache, 6, 22)
    assert cache[0]["attn.k"].untyped_storage().data_ptr() == buffer  # 16 spare tokens after the second step
    assert cache[0]["attn.k"].shape == (2, 22, 2, 4)
    rest = np.concatenate([rest, _decoded(stack, u, cache, 22, 40)], axis=1)  # past the spare tokens: a new buffer
    assert cache[0]["attn.k"].untyped_storage().data_ptr() != buffer
    assert np.abs(np.concatenate([prompt, first, rest], axis=1) - full(u)).max() <= 1e-10


def _forked(call, u, v):
    """Two copies of one cache after a prompt and two steps, each then fed its own tokens (``u`` and ``v``);
    ``call(sequence, cache, start, stop)`` feeds ``sequence[:, start:stop]``."""
    cache = [{} for _ in range(2)]
    for start, stop in ((0, 2), (2, 3), (3, 4)):  # now a buffer with spare tokens
        call(u, cache, start, stop)
    fork = [dict(entry) for entry in cache]
    ours, theirs = [], []
    for index in range(4, 8):  # alternating: each copy writes where the other would
        ours.append(call(u, cache, index, index + 1))
        theirs.append(call(v, fork, index, index + 1))
    return np.concatenate(ours, axis=1), np.concatenate(theirs, axis=1)


def _torch_call(stack):
    def call(sequence, cache, start, stop):
        with torch.no_grad():
            return stack(torch.tensor(sequence[:, start:stop]), cache=cache).numpy()
    return call


def test_copies_of_a_cache_never_write_over_each_other(model, rng):
    full, build = model
    u = rng.standard_normal((1, 8, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, theirs = _forked(_torch_call(build(_torch_module())), u, v)
    assert np.abs(ours - full(u)[:, 4:]).max() <= 1e-10
    assert np.abs(theirs - full(v)[:, 4:]).max() <= 1e-10


def test_without_the_record_of_tokens_written_copies_collide(model, rng, tmp_path):
    """Negative control: writing whenever the buffer has room lets one copy overwrite the other's tokens."""
    full, build = model
    source = (GENERATED / "torch" / "gpt2.py").read_text(encoding="utf-8")
    assert "writes = record[1] == old.shape[1]" in source
    (tmp_path / "ignoring.py").write_text(source.replace("writes = record[1] == old.shape[1]", "writes = True"),
                                          encoding="utf-8")
    ignoring = import_path(tmp_path / "ignoring.py", "_spare_tokens_ignoring")
    u = rng.standard_normal((1, 8, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, theirs = _forked(_torch_call(build(ignoring)), u, v)
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


def _prefix(stack, u, steps=2):
    """A cache after a prompt and ``steps`` single-token steps (from two on, a buffer with spare tokens)."""
    cache = [{} for _ in range(2)]
    with torch.no_grad():
        stack(torch.tensor(u[:, :2]), cache=cache)
    _decoded(stack, u, cache, 2, 2 + steps)
    return cache


def test_threads_extending_copies_of_one_cache_keep_their_own_tokens(model, rng):
    """Each step moves the record past its tokens (under a lock) before writing them: two threads never both write
    the spare tokens of a shared buffer (before the lock, 39 of 200 such races gave a wrong result)."""
    import threading
    full, build = model
    stack = build(_torch_module())
    u = rng.standard_normal((2, 5, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((2, 1, 8))
    expected = [full(u)[:, 4:], full(v)[:, 4:]]
    for _ in range(40):
        prefix = _prefix(stack, u)
        results, barrier = [None, None], threading.Barrier(2)

        def work(index, sequence):
            fork = [dict(entry) for entry in prefix]
            barrier.wait()
            results[index] = _decoded(stack, sequence, fork, 4, 5)
        threads = [threading.Thread(target=work, args=(index, sequence)) for index, sequence in enumerate((u, v))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert max(np.abs(result - want).max() for result, want in zip(results, expected)) <= 1e-10


def _version_after_a_step(module, stack, u):
    """Backward through a graph that saved a cache entry, after a later step wrote into that entry's buffer."""
    cache = _prefix(stack, u)
    weight = torch.ones(1, dtype=torch.float64, requires_grad=True)
    keys = cache[0]["attn.k"]
    loss = (keys * weight).square().sum()  # saves ``keys`` for its backward
    _decoded(stack, u, cache, 4, 5)
    loss.backward()
    return weight.grad


def test_a_step_leaves_the_version_of_views_it_extends(model, rng, tmp_path):
    _, build = model
    u = rng.standard_normal((1, 5, 8))
    assert _version_after_a_step(_torch_module(), build(_torch_module()), u) is not None
    source = (GENERATED / "torch" / "gpt2.py").read_text(encoding="utf-8")
    counted = "grown.data[:, old.shape[1]:].copy_(new)"
    assert counted in source
    (tmp_path / "counted.py").write_text(source.replace(counted, "grown[:, old.shape[1]:].copy_(new)"), encoding="utf-8")
    module = import_path(tmp_path / "counted.py", "_spare_tokens_counted")  # negative control: a versioned write
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _version_after_a_step(module, build(module), u)


def _vmapped(stack, prefix, candidates):
    with torch.no_grad():
        return torch.func.vmap(lambda x: stack(x, cache=[dict(entry) for entry in prefix]))(candidates)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap's fallback for flash attention
def test_vmap_over_next_tokens_sharing_a_cache_equals_the_loop(model, rng, tmp_path):
    _, build = model
    stack = build(_torch_module())
    u = rng.standard_normal((2, 4, 8))
    candidates = torch.tensor(rng.standard_normal((3, 2, 1, 8)))
    prefix = _prefix(stack, u)
    with torch.no_grad():
        loop = torch.stack([stack(x, cache=[dict(entry) for entry in prefix]) for x in candidates])
    assert (_vmapped(stack, prefix, candidates) - loop).abs().max() <= 1e-12
    source = (GENERATED / "torch" / "gpt2.py").read_text(encoding="utf-8")
    checked = "storage, _ = old.untyped_storage(), new.untyped_storage()"
    assert checked in source
    (tmp_path / "unchecked.py").write_text(source.replace(checked, "storage = old.untyped_storage()"), encoding="utf-8")
    unchecked = build(import_path(tmp_path / "unchecked.py", "_spare_tokens_unchecked"))
    with pytest.raises(RuntimeError, match="vmap"):  # negative control: a batched step written into the buffer
        _vmapped(unchecked, _prefix(unchecked, u), candidates)


def _tangent_error(stack, rng):
    """The largest difference of token-by-token forward-mode tangents from the full causal pass's, under no_grad (the
    math kernel: CPU flash attention has no forward-mode AD)."""
    import torch.autograd.forward_ad as forward_ad
    from torch.nn.attention import SDPBackend, sdpa_kernel
    x, tangent = torch.tensor(rng.standard_normal((2, 6, 8))), torch.tensor(rng.standard_normal((2, 6, 8)))
    with torch.no_grad(), forward_ad.dual_level(), sdpa_kernel(SDPBackend.MATH):
        full = forward_ad.unpack_dual(stack(forward_ad.make_dual(x, tangent), causal=True)).tangent
        cache, steps = [{} for _ in range(2)], []
        for index in range(6):
            step = forward_ad.make_dual(x[:, index:index + 1], tangent[:, index:index + 1])
            steps.append(forward_ad.unpack_dual(stack(step, cache=cache)).tangent)
    return float((torch.cat(steps, dim=1) - full).abs().max())


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch.nn.attention's import
def test_forward_mode_tangents_of_cached_steps_are_the_full_passs(model, rng, tmp_path):
    """Forward-mode AD runs under no_grad, where a step writes into spare tokens through ``.data``, which drops the new
    tokens' tangents: with a tangent, the step concatenates."""
    _, build = model
    assert _tangent_error(build(_torch_module()), rng) <= 1e-12
    source = (GENERATED / "torch" / "gpt2.py").read_text(encoding="utf-8")
    checked = ("if torch.autograd.forward_ad.unpack_dual(new).tangent is not None or \\\n"
               "            torch.autograd.forward_ad.unpack_dual(old).tangent is not None:")
    assert checked in source
    (tmp_path / "tangentless.py").write_text(source.replace(checked, "if False:"), encoding="utf-8")
    tangentless = import_path(tmp_path / "tangentless.py", "_spare_tokens_tangentless")
    assert _tangent_error(build(tangentless), rng) > 1e-3  # negative control: the tangents dropped


# --- NumPy: the same growth, its buffers recorded by the module (``_SPARE``) -------------------------------------------

@pytest.fixture
def numpy_model(rng):
    module = import_path(GENERATED / "numpy" / "gpt2.py")
    layers = [reference.random_params(module.PARAMETERS, 8, 12, rng) for _ in range(2)]
    final_norm = {"gain": rng.standard_normal(8), "bias": rng.standard_normal(8)}

    def run(module, u, cache=None):
        return module.forward_stack(u, layers, n_heads=2, final_norm=final_norm, cache=cache)
    return module, run


def _numpy_steps(module, run, u, cache, start, stop):
    return np.concatenate([run(module, u[:, index:index + 1], cache) for index in range(start, stop)], axis=1)


def _numpy_call(module, run):
    return lambda sequence, cache, start, stop: run(module, sequence[:, start:stop], cache)


def test_numpy_steps_write_into_spare_tokens_and_copies_keep_their_own(numpy_model, rng):
    module, run = numpy_model
    u = rng.standard_normal((2, 40, 8))
    cache = [{} for _ in range(2)]
    prompt = run(module, u[:, :4], cache)
    first = _numpy_steps(module, run, u, cache, 4, 6)
    buffer = cache[0]["attn.k"].base
    assert (buffer[:, 6:] == 0).all()
    rest = _numpy_steps(module, run, u, cache, 6, 22)
    assert cache[0]["attn.k"].base is buffer and cache[0]["attn.k"].shape == (2, 22, 2, 4)
    rest = np.concatenate([rest, _numpy_steps(module, run, u, cache, 22, 40)], axis=1)
    assert cache[0]["attn.k"].base is not buffer
    assert np.abs(np.concatenate([prompt, first, rest], axis=1) - run(module, u)).max() <= 1e-12
    v = u[:1, :8].copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, theirs = _forked(_numpy_call(module, run), u[:1, :8], v)
    assert np.abs(ours - run(module, u[:1, :8])[:, 4:]).max() <= 1e-12
    assert np.abs(theirs - run(module, v)[:, 4:]).max() <= 1e-12


def test_numpy_without_the_record_of_tokens_written_copies_collide(numpy_model, rng, tmp_path):
    """Negative control: writing whenever the buffer has room lets one copy overwrite the other's tokens."""
    _, run = numpy_model
    source = (GENERATED / "numpy" / "gpt2.py").read_text(encoding="utf-8")
    assert "entry[1] == old.shape[1] and " in source
    (tmp_path / "ignoring.py").write_text(source.replace("entry[1] == old.shape[1] and ", ""), encoding="utf-8")
    ignoring = import_path(tmp_path / "ignoring.py", "_numpy_spare_tokens_ignoring")
    u = rng.standard_normal((1, 8, 8))
    v = u.copy()
    v[:, 4:] = rng.standard_normal((1, 4, 8))
    ours, _ = _forked(_numpy_call(ignoring, run), u, v)
    assert np.abs(ours - run(ignoring, u)[:, 4:]).max() > 1e-3


def test_numpy_callers_arrays_and_rolled_back_caches_are_never_written(numpy_model, rng):
    module, run = numpy_model
    u = rng.standard_normal((1, 9, 8))
    cache = [{} for _ in range(2)]
    run(module, u[:, :4], cache)
    held = []
    for entry in cache:
        for key in ("attn.k", "attn.v"):
            room = np.full((1, 10) + entry[key].shape[2:], 7.0)
            room[:, :4] = entry[key]
            held.append(room)
            entry[key] = room[:, :4]  # a view with room after it, not allocated by the module
    steps = _numpy_steps(module, run, u, cache, 4, 7)
    assert all((room[:, 4:] == 7.0).all() for room in held)
    assert np.abs(steps - run(module, u)[:, 4:7]).max() <= 1e-12
    for entry in cache:  # cut back to 5 tokens: a view of the buffer whose spare tokens hold the two dropped
        for key in ("attn.k", "attn.v", "key_padding_mask"):
            entry[key] = entry[key][:, :5]
    v = u.copy()
    v[:, 5:] = rng.standard_normal((1, 4, 8))
    assert np.abs(_numpy_steps(module, run, v, cache, 5, 9) - run(module, v)[:, 5:]).max() <= 1e-12


def test_numpy_rows_of_a_cache_take_their_own_buffer(numpy_model, rng):
    """A cache of some of the batch's sequences (rows of each entry) is not the buffer's batch: a new buffer."""
    module, run = numpy_model
    u = rng.standard_normal((3, 7, 8))
    cache = [{} for _ in range(2)]
    run(module, u[:, :3], cache)
    _numpy_steps(module, run, u, cache, 3, 5)  # a buffer with spare tokens
    rows = [{key: value[:2] if key != "options" else value for key, value in entry.items()} for entry in cache]
    steps = _numpy_steps(module, run, u[:2], rows, 5, 7)
    assert np.abs(steps - run(module, u[:2])[:, 5:]).max() <= 1e-12
    assert rows[0]["attn.k"].shape == (2, 7, 2, 4)


def test_numpy_forgets_the_buffers_of_a_dropped_cache(numpy_model, rng, tmp_path):
    _, run = numpy_model
    (tmp_path / "own.py").write_text((GENERATED / "numpy" / "gpt2.py").read_text(encoding="utf-8"), encoding="utf-8")
    module = import_path(tmp_path / "own.py", "_numpy_spare_tokens_own")  # its own record
    u = rng.standard_normal((1, 6, 8))
    cache = [{} for _ in range(2)]
    run(module, u[:, :3], cache)
    _numpy_steps(module, run, u, cache, 3, 6)
    assert len(module._SPARE) == 4  # keys and values of two layers
    del cache
    assert module._SPARE == {}
