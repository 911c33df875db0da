"""The derived adjoint of the LLM blocks: llama (rotary attention), decoder, decoder-pre-ln
(cross-attention), gpt2.

Against independent references in float64: transformers' ``LlamaDecoderLayer`` (float64
RMSNorms, see test_llama.py) and ``GPT2Block``, ``torch.nn.TransformerDecoderLayer``/``TransformerDecoder``,
differentiated by torch.autograd: ``∂J/∂u``, ``∂J/∂memory`` and every parameter gradient,
from the NumPy ``vjp``/``vjp_stack`` and the torch ``Block(..., backward="derived")``.
"""

import copy
import functools

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters.hf_gpt2 import gpt2_block_config, gpt2_block_params
from splitformer.codegen.adapters.hf_llama import llama_layer_config, llama_layer_params
from splitformer.codegen.adapters.torch_decoder import decoder_layer_params
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.codegen.verification.statements.adjoint import finite_difference_gap, flip_sign

from conftest import GENERATED, import_path
from llama_reference import causal_mask, llama_config, rope
from reference import random_params
from test_adjoint import _assert_close, _relative
from test_decoder import random_decoder_layer
from test_gpt2 import gpt2_config, hf_mask, random_block, right_padding
from test_llama import float64_norms, random_layer

DECODERS = {False: "decoder", True: "decoder_pre_ln"}
LLAMA = {"d": 16, "d_ff": 24, "theta": 500.0}


def _modules(name):
    return import_path(GENERATED / "numpy" / f"{name}.py"), import_path(GENERATED / "torch" / f"{name}.py")


def _tensor(mask):
    return None if mask is None else torch.tensor(mask)


def _gradients(module, adapter):
    """``adapter`` (canonical names) applied to the gradients of ``module``'s parameters."""
    holder = copy.deepcopy(module)
    with torch.no_grad():
        for mine, theirs in zip(holder.parameters(), module.parameters()):
            mine.copy_(theirs.grad)
    return adapter(holder)


def _derived(module, block, params, inputs, options, grad_out):
    """``([∂J/∂input…], {name: ∂J/∂θ})`` of a ``Block`` of the generated torch ``module`` (``backward="derived"``)."""
    block.load_params(params)
    tensors = [torch.tensor(value, requires_grad=True) for value in inputs]
    block(*tensors, **options).backward(torch.tensor(grad_out))
    return [tensor.grad.numpy() for tensor in tensors], {name: module._tensor(block, name).grad.numpy()
                                                         for name in module.PARAMETERS}


def _decoder_masks(batch, n, n_memory):
    padding = np.zeros((batch, n), dtype=bool)
    padding[0, n - 2:] = True
    memory_padding = np.zeros((batch, n_memory), dtype=bool)
    memory_padding[1, n_memory - 2:] = True
    return padding, memory_padding


def _decoder_options(padding, memory_padding, torch_keywords=False):
    if torch_keywords:
        return {"tgt_mask": torch.ones(6, 6, dtype=torch.bool).triu(1), "tgt_is_causal": True,
                "tgt_key_padding_mask": _tensor(padding), "memory_key_padding_mask": _tensor(memory_padding)}
    return {"key_padding_mask": padding, "memory_key_padding_mask": memory_padding}


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("d, n_heads, d_ff, eps", [(8, 2, 12, 1e-5), (12, 3, 7, 1e-3)])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_decoder_vjp_equals_autograd_on_transformer_decoder_layer(norm_first, d, n_heads, d_ff, eps, masked, rng):
    numpy_module, torch_module = _modules(DECODERS[norm_first])
    layer = random_decoder_layer(d, n_heads, d_ff, eps, norm_first, seed=d)
    params = decoder_layer_params(layer)
    u, memory, grad_out = rng.standard_normal((2, 6, d)), rng.standard_normal((2, 5, d)), rng.standard_normal((2, 6, d))
    masks = _decoder_masks(2, 6, 5) if masked else (None, None)
    x, m = torch.tensor(u, requires_grad=True), torch.tensor(memory, requires_grad=True)
    layer(x, m, **_decoder_options(*masks, torch_keywords=True)).backward(torch.tensor(grad_out))
    expected = _gradients(layer, decoder_layer_params)
    grad_u, grad_memory, grads = numpy_module.vjp(u, memory, params, grad_out, n_heads=n_heads, eps=eps,
                                                  **_decoder_options(*masks))
    assert set(grads) == set(numpy_module.PARAMETERS)
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)
    assert _relative(grad_memory, m.grad.numpy()) <= 1e-10
    block = torch_module.Block(d, n_heads, d_ff, eps=eps, dtype=torch.float64, backward="derived")
    options = {name: _tensor(mask) for name, mask in _decoder_options(*masks).items()}
    (grad_u, grad_memory), grads = _derived(torch_module, block, params, (u, memory), options, grad_out)
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)
    assert _relative(grad_memory, m.grad.numpy()) <= 1e-10


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_llama_vjp_equals_autograd_on_llama_decoder_layer(n_heads, n_kv_heads, masked, rng):
    numpy_module, torch_module = _modules("llama")
    d, d_ff, theta = LLAMA["d"], LLAMA["d_ff"], LLAMA["theta"]
    layer = random_layer(llama_config(d, n_heads, n_kv_heads, d_ff=d_ff, eps=1e-5, theta=theta), seed=n_kv_heads)
    options, params = llama_layer_config(layer), llama_layer_params(layer)
    layer = float64_norms(layer)
    u, grad_out = rng.standard_normal((2, 7, d)), rng.standard_normal((2, 7, d))
    padding = np.array([[False] * 7, [False] * 4 + [True] * 3]) if masked else None
    positions = np.array([np.arange(7), np.arange(3, 10)])  # the second sequence continues at position 3
    x = torch.tensor(u, requires_grad=True)
    layer(x, attention_mask=causal_mask(2, 7, padding=padding),
          position_embeddings=rope(positions, d // n_heads, theta)).backward(torch.tensor(grad_out))
    expected = _gradients(layer, llama_layer_params)
    grad_u, grads = numpy_module.vjp(u, params, grad_out, key_padding_mask=padding, positions=positions, **options)
    assert set(grads) == set(numpy_module.PARAMETERS)
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)
    block = torch_module.Block(d, n_heads, d_ff, n_kv_heads=n_kv_heads, rope_theta=theta, dtype=torch.float64,
                               backward="derived")
    positions = torch.tensor(positions, dtype=torch.float64)
    (grad_u,), grads = _derived(torch_module, block, params, (u,),
                                {"key_padding_mask": _tensor(padding), "positions": positions}, grad_out)
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_gpt2_vjp_equals_autograd_on_gpt2_block(masked, rng):
    numpy_module, torch_module = _modules("gpt2")
    block = random_block(gpt2_config(12, 3, 7, 1e-3), seed=1)
    params, options = gpt2_block_params(block), gpt2_block_config(block)
    u, grad_out = rng.standard_normal((3, 6, 12)), rng.standard_normal((3, 6, 12))
    padding = right_padding(3, 6) if masked else None
    if padding is not None:
        grad_out[padding] = 0  # the loss reads the kept tokens only
    x = torch.tensor(u, requires_grad=True)
    block(x, attention_mask=hf_mask(3, 6, padding)).backward(torch.tensor(grad_out))
    expected = _gradients(block, gpt2_block_params)
    grad_u, grads = numpy_module.vjp(u, params, grad_out, key_padding_mask=padding, **options)  # causal by default
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)
    derived = torch_module.Block(12, 3, 7, eps=1e-3, dtype=torch.float64, backward="derived")
    (grad_u,), grads = _derived(torch_module, derived, params, (u,), {"key_padding_mask": _tensor(padding)},
                                grad_out)
    _assert_close(grad_u, grads, x.grad.numpy(), expected, 1e-10)


def test_decoder_vjp_stack_sums_the_memory_gradient_over_the_layers(rng):
    """vjp_stack against torch.autograd through ``nn.TransformerDecoder`` (pre-LN, final LayerNorm)."""
    numpy_module, _ = _modules("decoder_pre_ln")
    layer = random_decoder_layer(8, 2, 12, 1e-5, True)
    decoder = torch.nn.TransformerDecoder(layer, 2, norm=torch.nn.LayerNorm(8, dtype=torch.float64))
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    u, memory, grad_out = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 6, 8))
    masks = _decoder_masks(2, 6, 5)
    x, m = torch.tensor(u, requires_grad=True), torch.tensor(memory, requires_grad=True)
    decoder(x, m, **_decoder_options(*masks, torch_keywords=True)).backward(torch.tensor(grad_out))
    final = {"gain": decoder.norm.weight.detach().numpy(), "bias": decoder.norm.bias.detach().numpy()}
    grad_u, grad_memory, grad_layers, grad_final = numpy_module.vjp_stack(
        u, memory, [decoder_layer_params(block) for block in decoder.layers], grad_out, n_heads=2, final_norm=final,
        **_decoder_options(*masks))
    assert _relative(grad_u, x.grad.numpy()) <= 1e-10
    assert _relative(grad_memory, m.grad.numpy()) <= 1e-10
    for grads, block in zip(grad_layers, decoder.layers):
        _assert_close(grad_u, grads, x.grad.numpy(), _gradients(block, decoder_layer_params), 1e-10)
    assert _relative(grad_final["gain"], decoder.norm.weight.grad.numpy()) <= 1e-10
    assert _relative(grad_final["bias"], decoder.norm.bias.grad.numpy()) <= 1e-10


def test_llama_vjp_stack_with_final_rms_norm(rng):
    numpy_module, _ = _modules("llama")
    d, d_ff, theta = LLAMA["d"], LLAMA["d_ff"], LLAMA["theta"]
    config = llama_config(d, 4, 2, d_ff=d_ff, theta=theta)
    layers = [random_layer(config, seed) for seed in (1, 2)]
    params = [llama_layer_params(layer) for layer in layers]
    layers = [float64_norms(layer) for layer in layers]
    final = torch.nn.RMSNorm(d, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        final.weight.copy_(torch.randn(d))
    u, grad_out = rng.standard_normal((2, 6, d)), rng.standard_normal((2, 6, d))
    x = torch.tensor(u, requires_grad=True)
    y = x
    for layer in layers:
        y = layer(y, attention_mask=causal_mask(2, 6), position_embeddings=rope(np.arange(6), d // 4, theta))
    final(y).backward(torch.tensor(grad_out))
    grad_u, grad_layers, grad_final = numpy_module.vjp_stack(
        u, params, grad_out, n_heads=4, n_kv_heads=2, rope_theta=theta, final_norm={"gain": final.weight.detach().numpy()})
    assert _relative(grad_u, x.grad.numpy()) <= 1e-10
    for grads, layer in zip(grad_layers, layers):
        _assert_close(grad_u, grads, x.grad.numpy(), _gradients(layer, llama_layer_params), 1e-10)
    assert _relative(grad_final["gain"], final.weight.grad.numpy()) <= 1e-10


def test_unbatched_memory_and_float32(rng):
    numpy_module, _ = _modules("decoder")
    params = decoder_layer_params(random_decoder_layer(8, 2, 12, 1e-5, False))
    u, memory, grad_out = rng.standard_normal((6, 8)), rng.standard_normal((4, 8)), rng.standard_normal((6, 8))
    grad_u, grad_memory, grads = numpy_module.vjp(u, memory, params, grad_out, n_heads=2)
    assert grad_u.shape == (6, 8) and grad_memory.shape == (4, 8)
    single = {name: value.astype(np.float32) for name, value in params.items()}
    grad_u32, grad_memory32, _ = numpy_module.vjp(u.astype(np.float32), memory.astype(np.float32), single,
                                                  grad_out.astype(np.float32), n_heads=2)
    assert grad_memory32.dtype == np.float32
    assert _relative(grad_u32, grad_u) <= 1e-4 and _relative(grad_memory32, grad_memory) <= 1e-4


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch 2.13; still works
def test_derived_backward_refuses_a_cache_and_scripts(rng):
    """The KV cache is for inference; the derived path is TorchScript-unused, so the blocks still script."""
    _, torch_module = _modules("llama")
    block = torch_module.Block(16, 4, 24, n_kv_heads=2, dtype=torch.float64, backward="derived")
    u = torch.tensor(rng.standard_normal((1, 3, 16)), requires_grad=True)
    with pytest.raises(ValueError, match="cache"):
        block(u, cache={})
    scripted = torch.jit.script(block)
    torch.jit.script(_modules("decoder")[1].Block(8, 2, 12, backward="derived"))
    with pytest.raises(torch.jit.Error, match="backward='derived' runs in Python"):  # named, not TorchScript's
        scripted(u)  # "annotated to be ignored" (a tester's finding)
    with torch.no_grad():
        assert scripted(u).shape == u.shape


@functools.cache
def _adjoint(name):
    return derive_adjoint(derive(load_scheme(name)))


@pytest.mark.parametrize("name, target", [("llama", "attn_q_bar"), ("decoder", "mem_bar")])
def test_a_sign_flipped_in_the_rotation_or_memory_adjoint_fails_the_finite_difference_check(name, target):
    """The negative control, aimed at the new substeps: the rotary pairs' adjoint, the memory's gradient."""
    assert finite_difference_gap(flip_sign(_adjoint(name), target), name) > 1e-3


@pytest.mark.parametrize("name, data, gradient", [("llama", ("pos", "attn_phi", "chi"), None),
                                                  ("decoder", ("chi", "chi_m"), "mem")])
def test_masks_positions_and_angles_are_data_and_the_memory_gets_a_gradient(name, data, gradient):
    adjoint = _adjoint(name)
    written = {assignment.target for assignment in adjoint.assignments}
    assert not {f"{array}_bar" for array in data} & written
    assert set(adjoint.gradients) - {"u0"} == ({gradient} if gradient else set()) | {
        tensor.name for tensor in adjoint.forward.parameters()}


@pytest.mark.parametrize("name", ["llama", "decoder_pre_ln"])
def test_torch_stack_with_derived_backward_equals_autograd(name, rng):
    """Stack(…, backward="derived"): every layer's derived step; the memory's gradient accumulates over layers."""
    numpy_module, torch_module = _modules(name)
    options = {"n_kv_heads": 1} if name == "llama" else {}
    layers = [random_params(numpy_module.PARAMETERS, 8, 12, rng, d_kv=4 if name == "llama" else 8) for _ in range(2)]
    final = {"gain": rng.standard_normal(8)} | ({} if name == "llama" else {"bias": rng.standard_normal(8)})
    inputs = [rng.standard_normal((2, 5, 8))] + ([] if name == "llama" else [rng.standard_normal((2, 3, 8))])
    grad_out = rng.standard_normal((2, 5, 8))
    results = {}
    for backward in ("autograd", "derived"):
        stack = torch_module.Stack(2, 8, 2, 12, dtype=torch.float64, final_norm=True, backward=backward, **options)
        stack.load_params(layers, final)
        tensors = [torch.tensor(value, requires_grad=True) for value in inputs]
        stack(*tensors, key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2])).backward(
            torch.tensor(grad_out))
        results[backward] = [tensor.grad for tensor in tensors] + [p.grad for n, p in stack.named_parameters()
                                                                   if not n.endswith("b_k")]
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-10


def test_bad_arguments_are_named_before_any_work(rng):
    decoder, _ = _modules("decoder")
    llama, _ = _modules("llama")
    params = random_params(decoder.PARAMETERS, 8, 12, rng)
    u, grad_out = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    with pytest.raises(ValueError, match="memory"):
        decoder.vjp(u, rng.standard_normal((2, 3, 7)), params, grad_out, n_heads=2)
    with pytest.raises(ValueError, match="memory_key_padding_mask"):
        decoder.vjp(u, rng.standard_normal((2, 3, 8)), params, grad_out, n_heads=2,
                    memory_key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="n_kv_heads"):
        llama.vjp(u, random_params(llama.PARAMETERS, 8, 12, rng, d_kv=8), grad_out, n_heads=2, n_kv_heads=3)
    with pytest.raises(ValueError, match="positions"):
        llama.vjp(u, random_params(llama.PARAMETERS, 8, 12, rng, d_kv=8), grad_out, n_heads=2, positions=np.arange(4))


def test_llama_vjp_in_float32(rng):
    numpy_module, _ = _modules("llama")
    params = random_params(numpy_module.PARAMETERS, 16, 24, rng, d_kv=8)
    u, grad_out = rng.standard_normal((2, 6, 16)), rng.standard_normal((2, 6, 16))
    grad_u, grads = numpy_module.vjp(u, params, grad_out, n_heads=4, n_kv_heads=2)
    grad_u32, grads32 = numpy_module.vjp(u.astype(np.float32), {k: v.astype(np.float32) for k, v in params.items()},
                                         grad_out.astype(np.float32), n_heads=4, n_kv_heads=2)
    assert grad_u32.dtype == np.float32 and all(value.dtype == np.float32 for value in grads32.values())
    assert _relative(grad_u32, grad_u) <= 1e-4
    assert all(_relative(grads32[name], grads[name]) <= 1e-4 for name in grads)
