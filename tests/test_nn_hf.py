"""Whole transformers causal LMs read into ``splitformer.nn.LanguageModel``: logits and decoding."""

import types
from pathlib import Path

import pytest

import torch  # test dependencies: a broken install fails, never skips
import transformers

import splitformer.nn
from splitformer import SplitformerError  # noqa: E402
from splitformer.codegen.nn_hf import from_hf_lm  # noqa: E402

VOCAB = 31


def _random(model):
    """Every parameter random (biases and norm gains included), float64, eval mode."""
    model = model.double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    return model


def gpt2(**overrides):
    torch.manual_seed(0)
    settings = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0) | overrides
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=8, n_layer=2, n_head=2, n_inner=12,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0, **settings)
    return _random(transformers.GPT2LMHeadModel(config))


def llama(tie=False, **overrides):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                                      rope_theta=500.0, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0,
                                      pad_token_id=0, **overrides)
    return _random(transformers.LlamaForCausalLM(config))


def in_float64(model):
    """The reference after reading: LlamaRMSNorm rounds to float32 inside, so its norms become the
    same formula in float64 (``torch.nn.RMSNorm``, same gain and ε); GPT-2 stays as it is."""
    for name, norm in list(model.named_modules()):
        if type(norm).__name__ == "LlamaRMSNorm":
            exact = torch.nn.RMSNorm(norm.weight.shape[0], eps=norm.variance_epsilon, dtype=torch.float64)
            with torch.no_grad():
                exact.weight.copy_(norm.weight)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, exact)
    if hasattr(model, "model") and hasattr(model.model, "rotary_emb"):  # its cos/sin are float32 too
        model.model.rotary_emb = _Rotary64(model.config.head_dim, model.config.rope_parameters["rope_theta"])
    return model


class _Rotary64(torch.nn.Module):
    """transformers' (cos, sin) of RoPE, written here in float64: θ^(−2r/d_head) per pair, halves concatenated."""

    def __init__(self, d_head, theta):
        super().__init__()
        self.frequencies = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)

    def forward(self, u, position_ids):
        angles = position_ids.to(torch.float64)[..., None] * self.frequencies
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(u.dtype), angles.sin().to(u.dtype)


@pytest.mark.parametrize("make", [gpt2, llama, lambda: llama(tie=True)], ids=["gpt2", "llama", "llama-tied"])
def test_logits_equal_transformers(make):
    hf = make()
    model = from_hf_lm(hf)
    hf = in_float64(hf)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = hf(tokens).logits
    assert torch.allclose(model(tokens), expected, rtol=0, atol=1e-10)
    assert model.tie_weights == (hf.lm_head.weight is hf.get_input_embeddings().weight)
    with torch.no_grad():  # negative control: one changed parameter shows
        model.stack.layers[1].ffn.W_2[0, 0] += 1e-3  # (a uniform shift would vanish in the final norm)
    assert not torch.allclose(model(tokens), expected, atol=1e-8)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_model_that_ran_with_output_hidden_states_is_read(make):
    """transformers installs its output-capture hooks (they record a layer's output, return nothing) on the first call
    with ``output_hidden_states``: not a hook of the user's, read through; a hook of the user's is still refused."""
    hf = make()
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf(tokens, output_hidden_states=True)
    assert any(module._forward_hooks for module in hf.modules())  # transformers' own
    model = from_hf_lm(hf)
    assert torch.allclose(model(tokens), in_float64(hf)(tokens).logits, rtol=0, atol=1e-10)
    layer = next(module for module in hf.modules() if module._forward_hooks)
    hook = next(iter(layer._forward_hooks.values()))
    forged = types.FunctionType(hook.__code__, {}, hook.__name__, None, hook.__closure__)  # its code, other globals
    layer.register_forward_hook(forged)
    with pytest.raises(SplitformerError, match="has a forward hook"):
        from_hf_lm(hf)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_left_padded_logits_equal_transformers_given_positions_from_each_rows_first_token(make):
    """What llm.md says: a LanguageModel counts a left-padded row's positions from its first token; transformers'
    forward does with those position_ids (control: without them, GPT-2's learned positions differ)."""
    hf = make()
    model = from_hf_lm(hf)
    hf = in_float64(hf)
    tokens = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    attention = torch.ones(2, 6, dtype=torch.long)
    attention[1, :2] = 0
    ours = model(tokens, padding_mask=attention == 0)
    theirs = hf(tokens, attention_mask=attention, position_ids=(attention.cumsum(1) - 1).clamp(min=0)).logits
    assert torch.allclose(ours[:, 2:], theirs[:, 2:], rtol=0, atol=1e-10)
    assert torch.allclose(ours[0], theirs[0], rtol=0, atol=1e-10)
    if make is gpt2:
        counted_from_the_first_column = hf(tokens, attention_mask=attention).logits
        assert (ours[1, 2:] - counted_from_the_first_column[1, 2:]).abs().max() > 1e-3


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_greedy_decoding_equals_transformers_generate(make):
    hf = make()
    model = from_hf_lm(hf)
    hf = in_float64(hf)
    prompt = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    attention = torch.ones(2, 4, dtype=torch.long)
    attention[1, :2] = 0  # left padding
    expected = hf.generate(prompt, attention_mask=attention, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, 5, greedy=True, padding_mask=attention == 0), expected)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_from_hf_reads_a_whole_language_model(make):
    from splitformer.adapters import from_hf

    hf = make()
    model = from_hf(hf)
    assert isinstance(model, splitformer.nn.LanguageModel)
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    body = from_hf(hf.model if hasattr(hf, "model") else hf.transformer)  # the body: the same blocks, tied head
    expected = in_float64(hf)(tokens).logits
    assert torch.allclose(model(tokens), expected, rtol=0, atol=1e-10)
    assert body.tie_weights
    with pytest.raises(SplitformerError, match="whole language model; expectations"):
        from_hf(hf, n_heads=2)
    hf.register_forward_hook(lambda *args: None)  # a hook on the model itself is refused, as on a block
    with pytest.raises(SplitformerError, match="has a forward hook"):
        from_hf(hf)


def test_a_source_dropout_left_out_is_warned_of_with_its_rates():
    """A GPT-2 drops at 0.1 and 0.2 where a LanguageModel does not: the reading warns with both rates and the model
    drops nothing in training; a Llama's functional attention dropout is named too (its block reading notes it);
    the control: sources without dropout read silently."""
    import warnings

    from splitformer.adapters import from_hf

    with pytest.warns(UserWarning, match=r"GPT2LMHeadModel's dropout \(p = 0\.1, 0\.2\) is not carried"):
        model = from_hf_lm(gpt2(resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.1))
    tokens = torch.randint(0, VOCAB, (2, 5))
    model.train()
    torch.testing.assert_close(model(tokens), model(tokens), rtol=0, atol=0)
    source = llama(attention_dropout=0.3)
    with pytest.warns(UserWarning, match=r"LlamaForCausalLM's dropout \(p = 0\.3\) is not carried"):
        from_hf_lm(source)
    assert any("dropout (p = 0.3) is not carried" in note for note in from_hf(source.model.layers[0]).notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_hf_lm(gpt2())
        from_hf_lm(llama())


def test_unsupported_models_are_refused_by_name():
    with pytest.raises(SplitformerError, match="no whole-model reader for BertModel"):
        from_hf_lm(transformers.BertModel(transformers.BertConfig(hidden_size=8, num_hidden_layers=1,
                                                                 num_attention_heads=2, intermediate_size=8)))
    with pytest.raises(SplitformerError, match="^no whole-model reader for Linear; read GPT2LMHeadModel"):
        from_hf_lm(torch.nn.Linear(2, 2))
    for name in ("gpt2", Path("models/gpt2")):  # a newcomer's hub name or folder (it said "for None")
        with pytest.raises(SplitformerError, match=rf"^no whole-model reader for the \w+ '{name}': a model is read "
                                                   r"once loaded \(transformers' AutoModelForCausalLM"):
            from_hf_lm(name)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_half_precision_sources_are_read_widened_exactly(make):
    """bfloat16 weights become the same numbers in float32 (NumPy has no bfloat16); the Llama reader
    once called ``.numpy()`` on them and ended in a TypeError. Llama's ``inv_freq`` stays in float32, as
    ``from_pretrained(dtype=torch.bfloat16)`` keeps it (``.to()`` rounds it, which is refused:
    ``tests/test_rope_base.py``)."""
    source, reference = make().to(torch.bfloat16), make()
    if hasattr(source, "model"):
        source.model.rotary_emb.inv_freq = reference.model.rotary_emb.inv_freq.float()
    with torch.no_grad():  # the same rounded parameters in float64 (buffers such as inv_freq stay exact)
        for rounded, exact in zip(source.parameters(), reference.parameters()):
            exact.copy_(rounded.double())
    read = from_hf_lm(source).state_dict()
    widened = from_hf_lm(reference).state_dict()
    assert read.keys() == widened.keys()
    for name, value in read.items():
        assert torch.equal(value.double(), widened[name].double()), name


class _DoubledLayerNorm(torch.nn.LayerNorm):
    def forward(self, u):
        return 2 * super().forward(u)


def _final_layer_norm(model):
    norm = torch.nn.LayerNorm(8, eps=model.config.rms_norm_eps, bias=False, dtype=torch.float64)
    model.model.norm = norm  # same gain and ε as the LlamaRMSNorm: only the class differs


@pytest.mark.parametrize("make, edit, message", [
    (gpt2, lambda m: m.transformer.ln_f.register_forward_hook(lambda module, args, out: 3 * out),
     r"^GPT2LMHeadModel\.transformer\.ln_f has a forward hook"),
    (gpt2, lambda m: m.lm_head.register_forward_hook(lambda module, args, out: out + 1),
     r"^GPT2LMHeadModel\.lm_head has a forward hook"),
    (gpt2, lambda m: setattr(m.transformer.wte, "forward", lambda ids: 2 * m.transformer.wte.weight[ids]),
     r"^GPT2LMHeadModel\.transformer\.wte has its forward replaced on the instance"),
    (gpt2, lambda m: setattr(m.transformer, "ln_f", _DoubledLayerNorm(8, dtype=torch.float64)),
     r"^GPT2LMHeadModel\.transformer\.ln_f \(_DoubledLayerNorm\) overrides forward of LayerNorm"),
    (gpt2, lambda m: setattr(m.transformer, "wpe", torch.nn.Identity()),
     r"^GPT2LMHeadModel\.transformer\.wpe is Identity, not Embedding"),
    (llama, _final_layer_norm, r"^LlamaForCausalLM\.model\.norm is LayerNorm, not LlamaRMSNorm"),
    (llama, lambda m: setattr(m.lm_head, "forward", lambda u: 2 * u @ m.lm_head.weight.T),
     r"^LlamaForCausalLM\.lm_head has its forward replaced on the instance"),
])
def test_every_part_of_a_whole_language_model_is_checked(make, edit, message):
    """Not only the blocks: hooks, overrides and classes of the embeddings, final norm and head."""
    model = make()
    from_hf_lm(model)  # control: the model as built
    edit(model)
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf_lm(model)
    assert "\n" not in str(error.value)
