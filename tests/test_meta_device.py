"""Every generated torch block and network runs forward and backward (autograd and derived) on the meta device.

A meta tensor has a shape, a dtype and a device but no values: a module that read a value on the host
(``.item()``, ``bool(t)``, ``torch.equal``, ``.tolist()``: on a GPU, a synchronization), or computed with a tensor it
made on the CPU, fails there — except with CPU tensors of zero dimensions and CPU index tensors, which meta takes as
CUDA does. A partial stand-in, on the CPU, for the GPU target's "device and dtype follow the inputs, no host syncs"
while no GPU is at hand. Cached decoding without padding runs there too; with a padding mask, each step compares it with
the padding the cached tokens hold, a read of the device by design (the control below)."""

import functools
import inspect

import pytest
import torch

from conftest import GENERATED, import_path

BLOCKS = sorted(path.stem for path in (GENERATED / "torch").glob("*.py")
                if path.stem != "__init__" and "class Block(" in path.read_text(encoding="utf-8"))
CVT_STAGE = dict(patch_size=3, patch_stride=2, patch_padding=1, n_heads=1, kernel_qkv=3, stride_q=1, padding_q=1,
                 stride_kv=2, padding_kv=1, cls=True)
NETWORKS = {
    "vit": (lambda module, backward: module.Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3,
                                                  patch_size=2, image_size=(4, 4), device="meta", backward=backward),
            (2, 3, 4, 4)),
    "cvt": (lambda module, backward: module.Model(3, [4], [2], [8], [CVT_STAGE], device="meta", backward=backward),
            (2, 3, 8, 8)),
    "resnet_block": (lambda module, backward: module.Model(3, 3, device="meta", backward=backward), (2, 3, 8, 8)),
    "unet_level": (lambda module, backward: module.Model(3, 4, device="meta", backward=backward), (2, 3, 8, 8)),
}


@functools.cache
def _module(name):
    return import_path(GENERATED / "torch" / f"{name}.py", f"_meta_{name}")


def _meta(*shape):
    return torch.empty(*shape, device="meta", requires_grad=True)


def _all_meta(module, *tensors):
    grads = [parameter.grad for parameter in module.parameters()]
    return all(t is not None and t.is_meta for t in (*tensors, *grads)), len(grads)


def test_every_block_and_network_is_here():
    assert len(BLOCKS) >= 15 and {"post_ln", "llama", "decoder", "gpt2", "rk4"} <= set(BLOCKS)
    assert set(NETWORKS) == {path.stem for path in (GENERATED / "torch").glob("*.py")} - set(BLOCKS) - {"__init__"}


@pytest.mark.parametrize("backward", ["autograd", "derived"])
@pytest.mark.parametrize("name", BLOCKS)
def test_a_block_runs_forward_and_backward_on_the_meta_device(name, backward):
    block = _module(name).Block(16, 4, 24, device="meta", backward=backward)
    u = _meta(2, 3, 16)
    extra = {"memory": _meta(2, 5, 16)} if "memory" in inspect.signature(block.forward).parameters else {}
    out = block(u, **extra)
    out.sum().backward()
    meta, count = _all_meta(block, out, u.grad, *(value.grad for value in extra.values()))
    assert meta and count > 0 and out.shape == (2, 3, 16)


@pytest.mark.parametrize("backward", ["autograd", "derived"])
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_network_runs_forward_and_backward_on_the_meta_device(name, backward):
    build, shape = NETWORKS[name]
    model = build(_module(name), backward)
    pixels = _meta(*shape)
    outs = list(model(pixels)) if name == "cvt" else [model(pixels)]  # CvT: the grid and the class token
    sum(out.sum() for out in outs).backward()
    meta, count = _all_meta(model, *outs, pixels.grad)
    assert meta and count > 0


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_cached_decoding_without_padding_runs_on_the_meta_device(name):
    """A prompt and then single tokens through a cached Stack: the records of the cached tokens' padding (none) and
    options are kept on the host, so no step reads the device."""
    stack = _module(name).Stack(2, 16, 4, 24, device="meta")
    cache = [{}, {}]
    with torch.inference_mode():
        outs = [stack(torch.empty(1, n_tokens, 16, device="meta"), cache=cache) for n_tokens in (4, 1, 1)]
    assert all(out.is_meta for out in outs) and cache[1]["attn.v"].shape[1] == 6
    assert not cache[0]["key_padding_mask"].is_meta and not cache[0]["options"].is_meta


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_control_a_cached_step_with_padding_reads_its_record_on_the_device(name):
    """With a padding mask, each step compares the mask of the cached tokens with the padding they were cached with
    (one read per layer and token, on a GPU a synchronization): on the meta device that read fails."""
    stack = _module(name).Stack(2, 16, 4, 24, device="meta")
    cache = [{}, {}]
    with torch.inference_mode():
        assert stack(torch.empty(1, 4, 16, device="meta"), key_padding_mask=torch.zeros(1, 4, dtype=torch.bool,
                                                                                       device="meta"), cache=cache).is_meta
        with pytest.raises(RuntimeError, match="aten::equal.*Meta tensors"):
            stack(torch.empty(1, 1, 16, device="meta"), key_padding_mask=torch.zeros(1, 5, dtype=torch.bool,
                                                                                     device="meta"), cache=cache)
