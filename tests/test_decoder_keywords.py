"""The generated decoders take ``torch.nn.TransformerDecoderLayer``'s mask keywords: ``tgt_mask``,
``tgt_key_padding_mask``, ``tgt_is_causal``, ``memory_mask`` (bool or float), compared with torch's layer and stack."""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters.torch_decoder import decoder_layer_params

from test_decoder import _modules, random_decoder_layer

D, HEADS, D_FF, N, M = 8, 2, 12, 6, 5


def _memory_mask(rng, batch=None):
    """A bool memory mask (True excludes) that leaves every query at least one memory token (torch's layer gives NaN for
    a query that sees none)."""
    mask = rng.random((N, M) if batch is None else (batch, N, M)) < 0.4
    mask[..., 0] = False
    return mask


def _inputs(rng):
    u, memory = rng.standard_normal((2, N, D)), rng.standard_normal((2, M, D))
    padding = np.zeros((2, N), dtype=bool)
    padding[1, N - 2:] = True
    return u, memory, padding


def _per_head(mask):
    """torch's 3-D attention masks are per batch entry and head: (batch·heads, tokens, memory tokens)."""
    return mask if mask.dim() == 2 else mask.repeat_interleave(HEADS, dim=0)


def _torch_keywords(rng, memory_kind):
    memory_mask = {"none": None,
                   "bool": torch.tensor(_memory_mask(rng)),
                   "batched bool": torch.tensor(_memory_mask(rng, 2)),
                   "float": torch.tensor(rng.standard_normal((N, M)))}[memory_kind]
    return {"tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64),
            "tgt_is_causal": True, "memory_mask": memory_mask}


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("memory_kind", ["none", "bool", "batched bool", "float"])
def test_a_block_takes_the_decoder_layers_keywords(norm_first, memory_kind, rng):
    _, torch_module = _modules(norm_first)
    layer = random_decoder_layer(D, HEADS, D_FF, 1e-5, norm_first, seed=3)
    u, memory, padding = _inputs(rng)
    keywords = _torch_keywords(rng, memory_kind)
    keywords["tgt_key_padding_mask"] = torch.tensor(padding)
    reference = dict(keywords, memory_mask=None if keywords["memory_mask"] is None else _per_head(keywords["memory_mask"]))
    with torch.no_grad():
        expected = layer(torch.tensor(u), torch.tensor(memory), **reference).numpy()
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(decoder_layer_params(layer))
    with torch.no_grad():
        got = block(torch.tensor(u), torch.tensor(memory), **keywords).numpy()
    keep = ~padding
    assert np.abs(got - expected)[keep].max() <= 1e-10
    if keywords["memory_mask"] is not None:  # control: the memory mask is read
        with torch.no_grad():
            unmasked = block(torch.tensor(u), torch.tensor(memory), **dict(keywords, memory_mask=None)).numpy()
        assert np.abs(unmasked - expected)[keep].max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_a_stack_takes_the_decoder_layers_keywords(norm_first, rng):
    _, torch_module = _modules(norm_first)
    layer = random_decoder_layer(D, HEADS, D_FF, 1e-5, norm_first)
    decoder = torch.nn.TransformerDecoder(layer, 2).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    u, memory, padding = _inputs(rng)
    memory_padding = np.zeros((2, M), dtype=bool)
    memory_padding[0, M - 2:] = True
    keywords = dict(_torch_keywords(rng, "bool"), tgt_key_padding_mask=torch.tensor(padding),
                    memory_key_padding_mask=torch.tensor(memory_padding))
    with torch.no_grad():
        expected = decoder(torch.tensor(u), torch.tensor(memory), **keywords).numpy()
    stack = torch_module.Stack(2, D, HEADS, D_FF, final_norm=False, dtype=torch.float64).load_params(
        [decoder_layer_params(block) for block in decoder.layers])
    with torch.no_grad():
        got = stack(torch.tensor(u), torch.tensor(memory), **keywords).numpy()
    assert np.abs(got - expected)[~padding].max() <= 1e-10


def test_the_memory_mask_in_cached_decoding_is_the_new_tokens_rows(rng):
    """Token by token, each step given its own row of the memory mask, equals the full pass given the whole mask."""
    _, torch_module = _modules(True)
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(
        decoder_layer_params(random_decoder_layer(D, HEADS, D_FF, 1e-5, True)))
    u, memory, _ = _inputs(rng)
    mask = torch.tensor(_memory_mask(rng, 2))
    with torch.no_grad():
        expected = block(torch.tensor(u), torch.tensor(memory), memory_mask=mask).numpy()
        cache = {}
        steps = [block(torch.tensor(u[:, i:i + 1]), torch.tensor(memory), memory_mask=mask[:, i:i + 1], cache=cache)
                 for i in range(N)]
    assert np.abs(torch.cat(steps, dim=1).numpy() - expected).max() <= 1e-10


def test_the_derived_backward_reads_the_memory_mask(rng):
    """backward='derived' with a float and a bool memory mask: the gradients autograd gives through the same Block."""
    _, torch_module = _modules(False)
    params = decoder_layer_params(random_decoder_layer(D, HEADS, D_FF, 1e-5, False))
    u, memory, padding = _inputs(rng)
    for mask in (torch.tensor(_memory_mask(rng, 2)), torch.tensor(rng.standard_normal((N, M)))):
        gradients = []
        for backward in ("autograd", "derived"):
            block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64, backward=backward).load_params(params)
            inputs = [torch.tensor(u, requires_grad=True), torch.tensor(memory, requires_grad=True)]
            out = block(*inputs, memory_mask=mask, tgt_key_padding_mask=torch.tensor(padding))
            (out[torch.tensor(~padding)] ** 2).sum().backward()
            gradients.append([x.grad for x in inputs] + [p.grad for p in block.parameters()])
        for autograd, derived in zip(*gradients):
            assert torch.allclose(autograd, derived, rtol=1e-9, atol=1e-11)


def test_a_scripted_block_takes_the_decoder_layers_keywords(rng):
    _, torch_module = _modules(False)
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(
        decoder_layer_params(random_decoder_layer(D, HEADS, D_FF, 1e-5, False)))
    u, memory, padding = _inputs(rng)
    keywords = dict(tgt_key_padding_mask=torch.tensor(padding), memory_mask=torch.tensor(_memory_mask(rng)),
                    tgt_is_causal=True)
    with torch.no_grad():
        expected = block(torch.tensor(u), torch.tensor(memory), **keywords)
        got = torch.jit.script(block)(torch.tensor(u), torch.tensor(memory), **keywords)
    assert (got - expected).abs().max() <= 1e-12


@pytest.mark.parametrize("keywords, message", [
    ({"key_padding_mask": np.zeros((2, N), bool), "tgt_key_padding_mask": np.zeros((2, N), bool)},
     "give key_padding_mask or tgt_key_padding_mask, not both"),
    ({"src_mask": np.zeros((N, N), bool), "tgt_mask": np.zeros((N, N), bool)}, "give src_mask or tgt_mask, not both"),
    ({"tgt_mask": np.zeros((N, N + 1), bool)}, r"tgt_mask must be bool or float of shape \[6, 6\]"),
    ({"memory_mask": np.zeros((N, M + 1), bool)}, r"memory_mask must be bool or float of shape \[6, 5\] or \[2, 6, 5\]"),
    ({"memory_mask": np.zeros((N, M), np.int64)}, "memory_mask must be bool or float"),
    ({"tgt_is_causal": 1}, "tgt_is_causal must be a bool"),
    # a reviewer: the alias's own name, not the argument it stands for
    ({"src_key_padding_mask": np.zeros((2, N), bool), "tgt_key_padding_mask": np.zeros((2, N), bool)},
     "give src_key_padding_mask or tgt_key_padding_mask, not both"),
    ({"tgt_key_padding_mask": np.zeros((2, N + 1), bool)}, r"^tgt_key_padding_mask must be bool or float of shape"),
])
def test_bad_decoder_keywords_are_named(keywords, message, rng):
    _, torch_module = _modules(False)
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64)
    u, memory, _ = _inputs(rng)
    keywords = {name: torch.tensor(value) if isinstance(value, np.ndarray) else value for name, value in keywords.items()}
    with pytest.raises((ValueError, TypeError), match=message):
        block(torch.tensor(u), torch.tensor(memory), **keywords)



def test_masks_on_the_meta_device_are_refused_by_name():
    """A tester's finding: a mask on the meta device ended in torch's "Cannot copy out of meta tensor", naming no
    argument. Each is refused by its name; control: the same masks on the CPU run."""
    _, torch_module = _modules(False)
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64)
    u, memory = torch.randn(2, N, D, dtype=torch.float64), torch.randn(2, M, D, dtype=torch.float64)
    masks = {"tgt_mask": (N, N), "memory_mask": (N, M), "tgt_key_padding_mask": (2, N),
             "memory_key_padding_mask": (2, M)}
    with torch.no_grad():
        for name, shape in masks.items():
            with pytest.raises(ValueError, match=rf"^{name} is on the meta device \(it holds no values\), u on cpu$"):
                block(u, memory, causal=False, **{name: torch.zeros(shape, dtype=torch.bool, device="meta")})
            assert block(u, memory, causal=False, **{name: torch.zeros(shape, dtype=torch.bool)}).shape == u.shape


def test_one_sequences_memory_padding_may_be_one_dimensional(rng):
    """A tester's finding: an unbatched memory's padding of shape (memory tokens,), which torch's layer takes, was
    refused while the target's (tokens,) was taken. Both backends take it; control: a (2, memory tokens) mask for one
    sequence is still refused."""
    numpy_module, torch_module = _modules(False)
    layer = random_decoder_layer(D, HEADS, D_FF, 1e-5, False, seed=5)
    u, memory = rng.standard_normal((N, D)), rng.standard_normal((M, D))
    padding = np.array([False, True, False, False, True])
    with torch.no_grad():
        expected = layer(torch.tensor(u), torch.tensor(memory), memory_key_padding_mask=torch.tensor(padding)).numpy()
    block = torch_module.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(decoder_layer_params(layer))
    with torch.no_grad():
        got = block(torch.tensor(u), torch.tensor(memory), causal=False, memory_key_padding_mask=torch.tensor(padding))
    assert np.abs(got.numpy() - expected).max() <= 1e-10
    got = numpy_module.forward(u, memory, decoder_layer_params(layer), n_heads=HEADS, causal=False,
                               memory_key_padding_mask=padding)
    assert np.abs(got - expected).max() <= 1e-10
    with pytest.raises(ValueError, match=r"memory_key_padding_mask must be bool of shape \(1, 5\) or \(5,\) for one"):
        numpy_module.forward(u, memory, decoder_layer_params(layer), n_heads=HEADS, memory_key_padding_mask=padding[None].repeat(2, 0))


def test_a_stack_replaces_the_decoder_of_torchs_transformer():
    """A tester's finding: ``nn.Transformer`` calls its decoder with ``memory_is_causal`` (and ``nn.TransformerDecoder``
    defaults ``tgt_is_causal`` to None), which the generated Stack refused as unknown keywords. Both are taken: the
    Stack as ``transformer.decoder`` computes the transformer's output (float64, every parameter random);
    ``memory_is_causal=True`` without a ``memory_mask`` is refused as torch's hint without its mask; control: a memory
    mask given through the transformer changes the output."""
    _, torch_module = _modules(False)
    torch.manual_seed(4)
    transformer = torch.nn.Transformer(D, HEADS, 1, 2, D_FF, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        for parameter in transformer.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    src, tgt = torch.randn(2, M, D, dtype=torch.float64), torch.randn(2, N, D, dtype=torch.float64)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64)
    stack = torch_module.Stack(2, D, HEADS, D_FF, final_norm=True, dtype=torch.float64)
    stack.load_params([decoder_layer_params(layer) for layer in transformer.decoder.layers],
                      {"gain": transformer.decoder.norm.weight, "bias": transformer.decoder.norm.bias})
    with torch.no_grad():
        expected = transformer(src, tgt, tgt_mask=tgt_mask, tgt_is_causal=True)
        transformer.decoder = stack
        assert (transformer(src, tgt, tgt_mask=tgt_mask, tgt_is_causal=True) - expected).abs().max() <= 1e-12
        memory_mask = torch.zeros(N, M, dtype=torch.bool)
        memory_mask[:, 0] = True
        assert (transformer(src, tgt, tgt_mask=tgt_mask, memory_mask=memory_mask) - expected).abs().max() > 1e-3
        memory = transformer.encoder(src)
        assert torch.equal(stack(tgt, memory, tgt_is_causal=None), stack(tgt, memory))
        with pytest.raises(ValueError, match=r"^memory_is_causal=True says that memory_mask is causal: give memory_mask$"):
            stack(tgt, memory, memory_is_causal=True)
        with pytest.raises(TypeError, match=r"^tgt_is_causal must be a bool or None, got str$"):
            stack(tgt, memory, tgt_is_causal="yes")
