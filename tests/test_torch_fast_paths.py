"""The generated torch module's fast paths compute what the plain paths compute.

The query, key and value kernels are views of one tensor (``_SIDE_BY_SIDE``), so the fused
product reads them without a concatenation; nothing is kept, so every way a parameter can
change (``.data.mul_`` and NumPy views too) reaches the next inference call. ``_layer_norm`` and ``_rms_norm``
take torch's fused kernels only where their statistics are representable and the overflow-safe
``_scaled_layer_norm``, ``_scaled_rms_norm`` elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import GENERATED, import_path

D, HEADS, D_FF = 8, 2, 12


@pytest.fixture(scope="module")
def module():
    return import_path(GENERATED / "torch" / "post_ln.py", "_fast_paths_post_ln")


def _block(module, seed=0):
    torch.manual_seed(seed)
    block = module.Block(D, HEADS, D_FF, dtype=torch.float64)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.uniform_(-0.5, 0.5)  # random biases and gains too
    return block


def _traced(block, u):
    """The output through a fresh concatenation (autograd on: nothing is kept)."""
    return block(u).detach()


def _mutations(module):
    """Ways a user changes the query kernel between two inference calls."""
    def optimizer_step(block):
        block(torch.ones(1, 3, D, dtype=torch.float64)).sum().backward()
        torch.optim.SGD(block.parameters(), lr=0.1).step()

    def load_state_dict(block):
        block.load_state_dict(_block(module, seed=1).state_dict())

    def assign_data(block):
        block.attn.W_k.data = torch.randn(D, D, dtype=torch.float64)

    def in_place(block):
        with torch.no_grad():
            block.attn.b_v.mul_(2.0)

    # edits that bypass the parameter's version counter (weight surgery, EMA, pruning)
    def data_in_place(block):
        block.attn.W_q.data.mul_(3.0)

    def data_clamp(block):
        block.attn.W_k.data.clamp_(-0.1, 0.1)

    def numpy_view(block):
        block.attn.W_v.detach().numpy()[...] *= 3.0

    return [optimizer_step, load_state_dict, assign_data, in_place, data_in_place, data_clamp, numpy_view]


@pytest.mark.parametrize("mutation", range(7), ids=["optimizer_step", "load_state_dict", "assign_data", "in_place",
                                                    "data_in_place", "data_clamp", "numpy_view"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_the_fused_kernel_follows_every_parameter_change(module, mutation, mode):
    block, u = _block(module), torch.randn(2, 5, D, dtype=torch.float64)
    with mode():
        before = block(u)
        assert torch.equal(block(u), before)  # deterministic
    _mutations(module)[mutation](block)
    with mode():
        after = block(u)
    # negative control: the change matters, so a stale kernel would fail the next assertion
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, _traced(block, u), rtol=0, atol=1e-12)


def test_the_fused_kernel_follows_a_dtype_change(module):
    block, u = _block(module), torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        block(u)
        block.float()
        assert block(u.float()).dtype == torch.float32
        torch.testing.assert_close(block(u.float()), _traced(block, u.float()), rtol=0, atol=1e-6)


def _fused_without_copy(module, block):
    """Whether the fused kernel and bias are views of the canonical parameters' storage."""
    with torch.no_grad():
        kernels, biases = ([block.attn.get_parameter(f"{kind}_{c}") for c in "qkv"]
                           for kind in "Wb")
        return all(module._cat(parts, axis).untyped_storage().data_ptr() == parts[0].untyped_storage().data_ptr()
                   for parts, axis in ((kernels, 1), (biases, 0)))


def _conversions():
    """What gives each parameter its own storage, which the block undoes."""
    def to_float(block):
        return block.float()

    def load_assigned(block):
        block.load_state_dict({name: value.clone() for name, value in block.state_dict().items()}, assign=True)
        return block

    def deep_copy(block):
        import copy
        return copy.deepcopy(block)

    return {"to_float": to_float, "load_assigned": load_assigned, "deep_copy": deep_copy}


@pytest.mark.parametrize("conversion", _conversions())
def test_the_fused_kernel_is_read_without_a_copy_after_a_conversion(module, conversion):
    block = _block(module)
    assert _fused_without_copy(module, block)
    assert list(block.state_dict()) == list(module.PARAMETERS)  # canonical names only, no fused one
    u = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        before = block(u)
    converted = _conversions()[conversion](block)
    assert _fused_without_copy(module, converted)
    with torch.no_grad():
        after = converted(u.to(converted.attn.W_q.dtype))
    torch.testing.assert_close(after.double(), before, rtol=0, atol=1e-5 if conversion == "to_float" else 0)
    # negative control: a kernel given its own storage is read through a copy
    converted.attn.W_k.data = converted.attn.W_k.detach().clone()
    assert not _fused_without_copy(module, converted)


def test_concatenation_under_autograd_reaches_each_kernel(module):
    block, u = _block(module), torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        block(u)  # an inference call first; autograd must still reach each kernel
    block(u).square().sum().backward()
    assert all(block.attn.get_parameter(name).grad.abs().max() > 0 for name in ("W_q", "W_k", "W_v"))


def _rows(scale, d=16, seed=5):
    return torch.tensor(np.random.default_rng(seed).standard_normal((3, d)) * scale, dtype=torch.float32)


def test_fused_layer_norm_is_taken_where_representable_and_matches_the_scaled_one(module, monkeypatch):
    gain, bias = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    x = torch.tensor(np.random.default_rng(3).standard_normal((2, 5, 16)) * 10 + 3)
    scaled = module._scaled_layer_norm(x, gain, bias, 1e-5)
    calls = []
    monkeypatch.setattr(module, "_scaled_layer_norm", lambda *arguments: calls.append(arguments) or scaled)
    torch.testing.assert_close(module._layer_norm(x, gain, bias, 1e-5), scaled, rtol=0, atol=1e-13)
    assert not calls  # the fused path answered


@pytest.mark.parametrize("scale, eps", [(1e19, 1e-5), (1e-21, 0.0), (float("inf"), 1e-5)],
                         ids=["variance-overflows", "variance-below-normal", "infinite"])
def test_fused_layer_norm_falls_back_where_its_statistics_are_not_representable(module, monkeypatch, scale, eps):
    x, gain, bias = _rows(scale), torch.ones(16), torch.zeros(16)
    calls = []
    monkeypatch.setattr(module, "_scaled_layer_norm", lambda *arguments: calls.append(arguments) or x)
    module._layer_norm(x, gain, bias, eps)
    assert len(calls) == 1
    # negative control: on the same rows torch's own LayerNorm misses the float64 answer
    fused = torch.nn.functional.layer_norm(x, (16,), gain, bias, eps)
    exact = torch.nn.functional.layer_norm(x.double(), (16,), gain.double(), bias.double(), eps)
    assert not torch.allclose(fused.double(), exact, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def llama():
    return import_path(GENERATED / "torch" / "llama.py", "_fast_paths_llama")


def test_fused_rms_norm_is_taken_where_representable_and_matches_the_scaled_one(llama, monkeypatch):
    gain = torch.randn(16, dtype=torch.float64)
    x = torch.tensor(np.random.default_rng(3).standard_normal((2, 5, 16)) * 10 + 3)
    scaled = llama._scaled_rms_norm(x, gain, 1e-5)
    calls = []
    monkeypatch.setattr(llama, "_scaled_rms_norm", lambda *arguments: calls.append(arguments) or scaled)
    torch.testing.assert_close(llama._rms_norm(x, gain, 1e-5), scaled, rtol=0, atol=1e-13)
    assert not calls  # the fused path answered
    exact = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5) * gain
    torch.testing.assert_close(scaled, exact, rtol=0, atol=1e-13)


@pytest.mark.parametrize("scale, eps", [(1e20, 1e-5), (1e-23, 0.0), (float("inf"), 1e-5)],
                         ids=["mean-square-overflows", "mean-square-below-normal", "infinite"])
def test_fused_rms_norm_falls_back_where_its_statistic_is_not_representable(llama, monkeypatch, scale, eps):
    x, gain = _rows(scale), torch.ones(16)
    calls = []
    monkeypatch.setattr(llama, "_scaled_rms_norm", lambda *arguments: calls.append(arguments) or x)
    llama._rms_norm(x, gain, eps)
    assert len(calls) == 1
    if scale < float("inf"):  # negative control: on the same rows torch's own fused RMSNorm misses the float64 answer
        fused = torch.ops.aten._fused_rms_norm(x, [16], gain, eps)[0]
        exact = torch.ops.aten._fused_rms_norm(x.double(), [16], gain.double(), eps)[0]
        assert not torch.allclose(fused.double(), exact, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch has no vmap rule for CPU flash attention
def test_an_ensemble_under_vmap_takes_the_plain_paths(module):
    """torch.func: stacked parameters have no storage to key on, and vmap lets no value choose a path."""
    from torch.func import functional_call, stack_module_state, vmap

    blocks = [_block(module, seed) for seed in range(3)]
    params, buffers = stack_module_state(blocks)
    skeleton = _block(module).to("meta")
    u = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        out = vmap(lambda p, b: functional_call(skeleton, (p, b), (u,)))(params, buffers)
        for member, block in zip(out, blocks):
            torch.testing.assert_close(member, block(u), rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("name, causal", [("pre_ln", True), ("post_ln", False), ("llama", True)])
def test_per_example_masks_under_vmap_equal_the_loop(name, causal):
    """vmap over examples with their own key padding: no value may choose a path (the causal check steps aside)."""
    generated = import_path(GENERATED / "torch" / f"{name}.py", f"_vmapped_{name}")
    torch.manual_seed(0)
    block = generated.Block(8, 2, 12, dtype=torch.float64)
    u = torch.randn(3, 2, 6, 8, dtype=torch.float64)
    masks = torch.zeros(3, 2, 6, dtype=torch.bool)
    masks[1, 0, 4:] = True
    loop = torch.stack([block(x, causal=causal, key_padding_mask=m) for x, m in zip(u, masks)])
    vmapped = torch.func.vmap(lambda x, m: block(x, causal=causal, key_padding_mask=m))(u, masks)
    torch.testing.assert_close(vmapped, loop, rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_per_example_gradients_of_a_causal_block_under_torch_func_equal_autograd(name):
    """torch.func's grad and vmap(grad) through a causal block without masks: its support, a wrapped tensor without
    storage, is not marked causal (``_mark_causal``), and each example's gradient is autograd's (the review of
    session 28: marking it raised ``NotImplementedError`` there)."""
    generated = import_path(GENERATED / "torch" / f"{name}.py", f"_func_{name}")
    torch.manual_seed(0)
    block = generated.Block(8, 2, 12, dtype=torch.float64)
    u = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    loss = lambda x: block(x[None], causal=True).square().sum()  # noqa: E731
    per_example = torch.func.vmap(torch.func.grad(loss))(u.detach())
    sum(loss(x) for x in u).backward()
    torch.testing.assert_close(per_example, u.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.func.grad(loss)(u[0].detach()), u.grad[0], rtol=0, atol=1e-12)


def test_grouped_heads_fuse_kernels_of_unequal_widths_and_follow_their_edits():
    """llama's keys and values are narrower than its queries (2 key/value heads under 4): still one tensor."""
    llama = import_path(GENERATED / "torch" / "llama.py", "_fast_paths_llama")
    torch.manual_seed(0)
    block, u = llama.Block(D, 4, D_FF, n_kv_heads=2, dtype=torch.float64), torch.randn(2, 5, D, dtype=torch.float64)
    kernels = [block.attn.get_parameter(f"W_{c}") for c in "qkv"]
    assert [kernel.shape[1] for kernel in kernels] == [D, D // 2, D // 2]
    with torch.no_grad():
        assert llama._cat(kernels, 1).untyped_storage().data_ptr() == kernels[0].untyped_storage().data_ptr()
        before = block(u)
        block.attn.W_k.data.mul_(3.0)  # bypasses the version counter: only a view sees it
        after = block(u)
    assert (after - before).abs().max() > 1e-3  # control: the edit matters
    torch.testing.assert_close(after, _traced(block, u), rtol=0, atol=1e-12)


def test_an_assigning_load_of_several_dtypes_is_refused_before_anything_is_loaded(module):
    """A tester's finding: ``load_state_dict(assign=True)`` with one float32 ``attn.W_k`` turned ``W_q`` and ``W_v``
    float32 too (rebuilt side by side as views of one promoted tensor), the rest staying float64, and the next call
    failed in torch's matmul. Refused, naming both dtypes, with the block unchanged; controls: the same state dict
    copied (no assign) loads in the block's dtype, and a whole state dict of another dtype assigns."""
    block = _block(module)
    state = {name: value.clone() for name, value in block.state_dict().items()}
    state["attn.W_k"] = state["attn.W_k"].float()
    with pytest.raises(ValueError, match=r"^assign=True would leave 'attn.W_k' in torch.float32 and 'attn.W_q' in "
                                         r"torch.float64: a block computes in one dtype .* nothing was loaded$"):
        block.load_state_dict(state, assign=True)
    assert {parameter.dtype for parameter in block.parameters()} == {torch.float64}
    block.load_state_dict(state)
    assert block.attn.W_k.dtype == torch.float64 and torch.equal(block.attn.W_k, state["attn.W_k"].double())
    block.load_state_dict({name: value.float() for name, value in state.items()}, assign=True)
    assert {parameter.dtype for parameter in block.parameters()} == {torch.float32} and _fused_without_copy(module, block)
