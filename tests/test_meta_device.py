"""Every generated torch block and network runs forward and backward (autograd and derived) on the meta device.

A meta tensor has a shape, a dtype and a device but no values: a module that read a value on the host
(``.item()``, ``bool(t)``, ``torch.equal``, ``.tolist()``: on a GPU, a synchronization), or computed with a tensor it
made on the CPU, fails there — except with CPU tensors of zero dimensions and CPU index tensors, which meta takes as
CUDA does. What meta takes silently but a GPU would synchronize on, a CPU tensor copied to the device or indexing
one, ``HostCopies`` records during the forward. A partial stand-in, on the CPU, for the GPU target's "device and dtype
follow the inputs, no host syncs" while no GPU is at hand. Cached decoding without padding runs there too; with a
padding mask, each step compares it with the padding the cached tokens hold, a read of the device by design (the
control below)."""

import functools
import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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


class HostCopies(TorchDispatchMode):
    """Records what meta takes silently but a GPU would synchronize on: a copy from the CPU into a device tensor
    (``.to(device)`` of a CPU tensor, ``copy_`` from one; CUDA copies pageable memory blocking) and a CPU index tensor
    of one or more dimensions indexing a device tensor (CUDA copies it over)."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [value for value in tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)]
        packet = func._overloadpacket
        if packet is torch.ops.aten._to_copy and args[0].device.type == "cpu" and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type == "meta":
            self.found.append(f"{func} of a CPU {list(args[0].shape)}")
        if packet is torch.ops.aten.copy_ and args[0].is_meta and args[1].device.type == "cpu":
            self.found.append(f"{func} from a CPU {list(args[1].shape)}")
        if packet in (torch.ops.aten.index, torch.ops.aten.index_put_, torch.ops.aten.index_put,
                      torch.ops.aten.index_select) and any(t.is_meta for t in tensors) and \
                any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
            self.found.append(f"{func} with a CPU index")
        return func(*args, **kwargs)


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
    with HostCopies() as copies:
        out = block(u, **extra)
    assert copies.found == []
    out.sum().backward()
    meta, count = _all_meta(block, out, u.grad, *(value.grad for value in extra.values()))
    assert meta and count > 0 and out.shape == (2, 3, 16)


@pytest.mark.parametrize("backward", ["autograd", "derived"])
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_network_runs_forward_and_backward_on_the_meta_device(name, backward):
    build, shape = NETWORKS[name]
    model = build(_module(name), backward)
    pixels = _meta(*shape)
    with HostCopies() as copies:
        outs = list(model(pixels)) if name == "cvt" else [model(pixels)]  # CvT: the grid and the class token
    assert copies.found == []
    sum(out.sum() for out in outs).backward()
    meta, count = _all_meta(model, *outs, pixels.grad)
    assert meta and count > 0


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_cached_decoding_without_padding_runs_on_the_meta_device(name):
    """A prompt and then single tokens through a cached Stack, built and called under ``torch.device("meta")`` (the
    default device too): the records of the cached tokens' padding (none: one False seen as (batch, tokens)) and
    options are kept on the host, so no step reads the device."""
    with torch.device("meta"), torch.inference_mode():
        stack = _module(name).Stack(2, 16, 4, 24)
        cache = [{}, {}]
        with HostCopies() as copies:
            outs = [stack(torch.empty(3, n_tokens, 16), cache=cache) for n_tokens in (4, 1, 1)]
    assert all(out.is_meta for out in outs) and cache[1]["attn.v"].shape[1] == 6 and copies.found == []
    padding, options = cache[0]["key_padding_mask"], cache[0]["options"]
    assert padding.device.type == options.device.type == "cpu" and padding.shape == (3, 6)
    assert padding.untyped_storage().nbytes() == 1 and not padding.any()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_mask_after_steps_without_one_is_compared_on_its_device(name):
    """A prompt cached without a mask (its record on the host), then a step with a mask on the device: the record
    goes to the mask's device to be compared (on meta, the comparison itself is the read that fails)."""
    stack = _module(name).Stack(2, 16, 4, 24, device="meta")
    cache = [{}, {}]
    with torch.inference_mode():
        stack(torch.empty(1, 4, 16, device="meta"), cache=cache)
        with pytest.raises(RuntimeError, match="aten::equal.*Meta tensors"):
            stack(torch.empty(1, 1, 16, device="meta"), key_padding_mask=torch.zeros(1, 5, dtype=torch.bool,
                                                                                     device="meta"), cache=cache)


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


def test_control_host_copies_are_seen():
    """What ``HostCopies`` records: a CPU tensor moved to the device, copied into a device tensor, or indexing one;
    a CPU scalar in an operation with a device tensor and a device index are not copies."""
    device = torch.empty(4, device="meta")
    with HostCopies() as copies:
        torch.arange(4).to("meta")
        device.copy_(torch.ones(4))
        device[torch.tensor([0, 2])]
        device * torch.tensor(2.0) + device[torch.tensor([1], device="meta")]
    assert [entry.split(".")[1] for entry in copies.found] == ["_to_copy", "copy_", "index"]


@pytest.mark.parametrize("name", ["llama", "gpt2", "decoder"])
def test_a_causal_block_takes_flash_attentions_is_causal_off_the_cpu(name, monkeypatch):
    """The support ``_support`` builds from causality alone is marked so: on the meta device (as on a GPU, where no
    value may be read) attention still asks SDPA for ``is_causal`` with no mask; control: with a key padding mask the
    support is a mask."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *arguments, is_causal=False, **options):
        calls.append((attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask, *arguments, is_causal=is_causal, **options)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    block = _module(name).Block(16, 4, 24, device="meta")
    extra = {"memory": torch.empty(2, 5, 16, device="meta")} if name == "decoder" else {}
    with torch.inference_mode():
        block(torch.empty(2, 3, 16, device="meta"), causal=True, **extra)
        assert calls and calls[0] == (True, True)
        calls.clear()
        block(torch.empty(2, 3, 16, device="meta"), causal=True,
              key_padding_mask=torch.zeros(2, 3, dtype=torch.bool, device="meta"), **extra)
        assert calls and calls[0] == (False, False)


def test_only_whole_views_of_a_marked_causal_support_count_as_marked():
    """``_marked_causal``: a view of the marked support over whole (n, n) matrices is (the support itself is one
    (n, n) matrix seen per batch entry); a principal block, its transpose, a causal mask the caller built and the
    support of tokens after cached ones are not, nor views of a marked storage of several matrices that straddle
    them."""
    module = _module("gpt2")
    support = module._support(None, None, True, 2, 5, torch.float32, torch.device("meta"))
    assert support.stride() == (0, 5, 1) and support.untyped_storage().nbytes() == 25
    assert module._marked_causal(support) and module._marked_causal(support[:, None]) and module._marked_causal(support[1])
    assert not module._marked_causal(support[:, 1:, 1:]) and not module._marked_causal(support.transpose(-1, -2))
    assert not module._marked_causal(torch.ones(5, 5, dtype=torch.bool, device="meta").tril())
    stacked = torch.ones(2, 5, 5, dtype=torch.bool, device="meta").tril()
    module._mark_causal(stacked)
    flat = stacked.view(-1)
    assert module._marked_causal(stacked) and module._marked_causal(flat[25:50].view(5, 5))
    assert not module._marked_causal(flat[1:26].view(5, 5)) and not module._marked_causal(flat[5:30].view(5, 5))
    assert not module._marked_causal(stacked.as_strided((2, 5, 5), (5, 5, 1)))  # matrices overlapping by a row
    after_cached = module._support(None, None, True, 2, 5, torch.float32, torch.device("meta"), 3)
    assert not hasattr(after_cached.untyped_storage(), "splitformer_causal")


def test_nothing_is_marked_while_torch_compile_records_the_call(monkeypatch):
    """A mark is no part of a graph: while torch.compile (or a trace, or an export) records the call, ``_support``
    marks nothing (``torch.compile(fullgraph=True)`` would fail on the attribute)."""
    module = _module("gpt2")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    support = module._support(None, None, True, 2, 5, torch.float32, torch.device("meta"))
    assert not hasattr(support.untyped_storage(), "splitformer_causal")


@pytest.mark.parametrize("name", ["decoder", "decoder_pre_ln"])
def test_a_decoder_stack_decodes_with_its_memory_unread_under_no_grad(name):
    """A decoder Stack decoding against one memory under ``torch.no_grad`` (as transformers' ``generate`` runs): each
    step knows the memory unchanged by its identity and version, so no step reads the device (each layer's memory
    keys and values, and the stack's record of its memory, kept once); controls: a layer's copy of the memory changed
    in place is compared again, and a memory made under ``torch.inference_mode`` keeps no version, so the next step
    compares its values."""
    stack = _module(name).Stack(2, 16, 4, 24, device="meta")
    cache = [{}, {}]
    memory = torch.empty(1, 5, 16, device="meta")
    records = []
    with torch.no_grad(), HostCopies() as copies:
        for n_tokens in (4, 1, 1):
            outs = stack(torch.empty(1, n_tokens, 16, device="meta"), memory, cache=cache)
            records.append(cache[0]["memory"])
    assert outs.is_meta and cache[1]["attn.v"].shape[1] == 6 and copies.found == []
    assert records[0] is records[1] is records[2]  # the stack's record of its memory, copied once
    with torch.no_grad():  # control: a layer's copy of the memory reordered in place, as beam search may, is compared
        cache[1]["cross.memory"].copy_(cache[1]["cross.memory"][[0]])
        with pytest.raises(RuntimeError, match="aten::equal.*Meta tensors"):
            stack(torch.empty(1, 1, 16, device="meta"), memory, cache=cache)
    with torch.inference_mode():
        memory, cache = torch.empty(1, 5, 16, device="meta"), [{}, {}]
        stack(torch.empty(1, 4, 16, device="meta"), memory, cache=cache)
        with pytest.raises(RuntimeError, match="aten::equal.*Meta tensors"):
            stack(torch.empty(1, 1, 16, device="meta"), memory, cache=cache)


@pytest.mark.parametrize("name", BLOCKS)
def test_an_input_on_another_device_than_the_parameters_is_refused_by_name(name):
    """New user, s32: a Block on the CPU given a tensor on another device (meta here, CUDA on a GPU machine) raised
    torch's RuntimeError from inside its first LayerNorm; now a ValueError naming ``u``, before any work (the Stack
    and the derived backward alike); control: the same call on the parameters' device runs."""
    module = _module(name)
    extra = {"memory": torch.empty(2, 3, 16)} if "memory" in inspect.signature(module.Block.forward).parameters else {}
    for make in (lambda: module.Block(16, 4, 24), lambda: module.Block(16, 4, 24, backward="derived"),
                 lambda: module.Stack(2, 16, 4, 24)):
        block = make()
        with pytest.raises(ValueError, match="^u is on meta, the block's parameters on cpu$"):
            block(torch.empty(2, 5, 16, device="meta"), **extra)
        assert block(torch.randn(2, 5, 16), **extra).shape == (2, 5, 16)
    if extra:
        with pytest.raises(ValueError, match="^memory is on meta, u on cpu$"):
            module.Block(16, 4, 24)(torch.randn(2, 5, 16), memory=torch.empty(2, 3, 16, device="meta"))


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_network_input_on_another_device_is_refused_by_name(name):
    make, shape = NETWORKS[name]
    model = make(_module(name), "autograd").to_empty(device="cpu")
    argument = next(iter(inspect.signature(model.forward).parameters))
    with pytest.raises(ValueError, match=f"^{argument} is on meta, the model's parameters on cpu$"):
        model(torch.empty(*shape, device="meta"))


def test_meta_values_are_refused_where_they_would_be_read():
    """Attack s33 M3: ``Block.load_params`` given a meta tensor, and ``to_torch`` of a Block built on meta, ended in
    torch's NotImplementedError ("Cannot copy out of meta tensor"); now one named error each. Controls: the same
    values on the CPU load and go back, and a meta Block takes meta values (nothing to copy)."""
    from splitformer import SplitformerError
    from splitformer.adapters import from_torch, to_torch

    module = _module("post_ln")
    layer = torch.nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True).eval()
    adapted = from_torch(layer)
    params = {name: torch.as_tensor(value) for name, value in adapted.items()}
    with pytest.raises(ValueError, match="^parameter 'attn.W_q' is on the meta device: it holds no values to load$"):
        module.Block(16, 4, 24).load_params({**params, "attn.W_q": torch.empty(16, 16, device="meta")})
    module.Block(16, 4, 24, device="meta").load_params({**params, "attn.W_q": torch.empty(16, 16, device="meta")})
    with pytest.raises(SplitformerError, match=r"^Block\.attn\.W_q is on the meta device \(no values to read\)"):
        to_torch(module.Block(16, 4, 24, device="meta"), like=adapted)
    layer.load_state_dict(to_torch(module.Block(16, 4, 24).load_params(params), like=adapted))
