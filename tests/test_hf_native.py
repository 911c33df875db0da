"""transformers-native models: ``to_hf`` (generate with transformers' cache, save/load, Trainer)
and ``replace_blocks`` (GPT-2's blocks swapped for a derived variant's). Float64, every
parameter random, tiny sizes."""

import copy
import re
import subprocess
import sys

from pathlib import Path

import pytest

import torch  # test dependencies: a broken install fails, never skips
import transformers

from conftest import ROOT
from test_nn_hf import gpt2, in_float64, llama

import splitformer
from splitformer import SplitformerError
from splitformer.nn import LanguageModel, SplitformerForCausalLM, replace_blocks, to_hf

VOCAB = 31


@pytest.fixture(scope="module")
def macaron_rms(tmp_path_factory):
    """A user scheme file: the pre-norm macaron with RMSNorm (not causal: the model makes it so)."""
    text = splitformer.derive("macaron-pre-ln").scheme.source
    path = tmp_path_factory.mktemp("schemes") / "macaron-rms.toml"
    path.write_text(text.replace('"layer-norm"', '"rms-norm"').replace('"macaron-pre-ln"', '"macaron-rms"'))
    return path


def _random(model, scale=0.5):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * scale)
    return model.eval()


def language_model(scheme, seed=0, **options):
    torch.manual_seed(seed)
    return _random(LanguageModel(scheme, VOCAB, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_tokens=32,
                                 dtype=torch.float64, **options))


PROMPT = torch.tensor([[5, 9, 2, 7, 30]])
PADDED = torch.tensor([[0, 0, 4, 11, 5], [2, 17, 1, 8, 22]])
PADDING = torch.tensor([[True, True, False, False, False], [False] * 5])


def test_importing_splitformer_nn_leaves_transformers_out():
    code = "import sys, splitformer.nn; print('transformers' in sys.modules, callable(splitformer.nn.to_hf), " \
           "'transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.stdout.split() == ["False", "True", "True"], result.stderr[-2000:]


@pytest.mark.parametrize("scheme", ["file", "rk2"])
def test_generate_equals_the_models_own_cached_generate(scheme, macaron_rms):
    model = language_model(macaron_rms if scheme == "file" else scheme)
    hf = to_hf(model)
    assert isinstance(hf, transformers.PreTrainedModel) and hf.model is model
    ours = model.generate(PROMPT, 8, greedy=True)
    assert len(set(ours[0, 5:].tolist())) > 1  # the check sees more than one repeated token
    assert torch.equal(hf.generate(PROMPT, max_new_tokens=8, do_sample=False), ours)
    ours = model.generate(PADDED, 8, greedy=True, padding_mask=PADDING)
    theirs = hf.generate(PADDED, attention_mask=(~PADDING).long(), max_new_tokens=8, do_sample=False)
    assert torch.equal(theirs, ours)
    unmasked = hf.generate(PADDED, max_new_tokens=8, do_sample=False)  # control: the padding matters
    assert not torch.equal(unmasked[0], ours[0]) and torch.equal(unmasked[1], ours[1])


def test_the_cache_is_transformers_and_each_step_equals_the_full_pass():
    model = language_model("rk2")  # two attention evaluations per step
    hf = to_hf(model)
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    full = hf(tokens, use_cache=False).logits
    out = hf(tokens[:, :4], use_cache=True)
    cache = out.cache
    assert isinstance(cache, transformers.DynamicCache) and cache.get_seq_length() == 4
    assert tuple(cache.layers[1].keys.shape) == (2, 2 * 2, 4, 4)  # (batch, heads × evaluations, tokens, d_head)
    for position in range(4, 7):
        step = hf(tokens[:, position:position + 1], cache=cache, use_cache=True).logits
        assert torch.allclose(step[:, 0], full[:, position], rtol=0, atol=1e-12)
    with torch.no_grad():  # negative control: one changed cached key shows
        cache.layers[0].keys[0, 1, 2, 0] += 1.0
    changed = hf(tokens[:, 6:], cache=cache, use_cache=True).logits
    assert not torch.allclose(changed[0, 0], full[0, 6], atol=1e-8)


def _lm(**options):
    torch.manual_seed(0)
    base = {"d_model": 16, "n_heads": 4, "n_layers": 2, "dtype": torch.float64}
    return to_hf(_random(LanguageModel("llama", VOCAB, **(base | options))))


@pytest.mark.parametrize("writer, message", [
    ({"d_model": 32}, "cache layer 0 holds keys of shape (2, 2, 3, 8)"),
    ({"n_kv_heads": 4}, "cache layer 0 holds keys of shape (2, 4, 3, 4) (batch, heads, tokens, width); this model "
                        "keeps 2 heads of width 4"),
    ({"n_layers": 3}, "cache holds [3, 3, 3] tokens in its layers; this model has 2 layers"),
    ({"n_layers": 1}, "cache holds [3, 0] tokens"),
    ({"dtype": torch.float32}, "cache layer 0 holds keys in torch.float32; this model computes in torch.float64"),
    ({}, None),  # the control: the model's own cache
])
def test_a_cache_another_model_wrote_is_refused_before_it_is_read(writer, message):
    """Attack s33 M2: another model's DynamicCache failed inside torch or transformers (RuntimeError, IndexError), and
    one with more layers was read as if it were this model's. One ValueError, the cache unchanged."""
    model = _lm(n_kv_heads=2)
    prompt, step = PADDED[:, :3], PADDED[:, 3:4]
    cache = _lm(**({"n_kv_heads": 2} | writer))(prompt, use_cache=True).cache
    held = [cache.get_seq_length(index) for index in range(len(cache.layers))]
    if message is None:
        full = model(PADDED[:, :4], use_cache=False).logits[:, -1]
        assert torch.allclose(model(step, cache=cache, use_cache=True).logits[:, 0], full, rtol=0, atol=1e-12)
        return
    with pytest.raises(ValueError, match="^" + re.escape(message) + ".*another model's cache$"):
        model(step, cache=cache, use_cache=True)
    assert [cache.get_seq_length(index) for index in range(len(cache.layers))] == held


def test_position_ids_place_the_tokens():
    hf = to_hf(language_model("pre-ln"))  # learned positions
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    counted = torch.arange(6)[None]
    assert torch.equal(hf(tokens, position_ids=counted).logits, hf(tokens).logits)
    assert not torch.allclose(hf(tokens, position_ids=counted + 1).logits, hf(tokens).logits, atol=1e-6)
    with pytest.raises(ValueError, match=r"positions must be integer positions of shape \(2, 6\), \(1, 6\) or \(6,\)"):
        hf(tokens, position_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions must be integer positions of shape \(2, 6\)"):  # was expand's
        hf(tokens, position_ids=torch.zeros(3, 6, dtype=torch.long))                                # RuntimeError


def test_rotary_keys_are_cached_as_transformers_llama_caches_them():
    reference = llama()
    hf = to_hf(splitformer.nn.from_hf_lm(reference))
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    ours = hf(tokens, use_cache=True).cache
    theirs = in_float64(reference)(tokens, use_cache=True).cache
    for mine, expected in zip(ours.layers, theirs.layers, strict=True):
        assert torch.allclose(mine.keys, expected.keys, rtol=0, atol=1e-10)
        assert torch.allclose(mine.values, expected.values, rtol=0, atol=1e-10)
    assert not torch.allclose(ours.layers[0].keys, ours.layers[1].keys, atol=1e-3)  # control: layers differ


@pytest.mark.parametrize("scheme, tie", [("file", True), ("file", False), ("llama", True)])
def test_save_pretrained_and_from_pretrained_round_trip(scheme, tie, macaron_rms, tmp_path):
    options = {"n_kv_heads": 1, "rope_theta": 500.0} if scheme == "llama" else {}
    model = language_model(macaron_rms if scheme == "file" else scheme, tie_weights=tie, **options)
    to_hf(model).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(back, SplitformerForCausalLM) and back.dtype == torch.float64
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)).__name__ == "SplitformerConfig"
    assert back.model.scheme == model.scheme and back.model.tie_weights == tie
    assert (back.model.head.weight is back.model.embed.weight) == tie
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(back(tokens).logits, model(tokens))
    if scheme == "file":
        assert 'name = "macaron-rms"' in back.config.scheme and '"rms-norm"' in back.config.scheme
    fresh = SplitformerForCausalLM(back.config)  # control: the same config, other weights
    assert not torch.allclose(fresh.double()(tokens).logits, model(tokens), atol=1e-3)


def test_trainer_runs_and_the_loss_falls(tmp_path):
    torch.manual_seed(0)
    hf = to_hf(LanguageModel("pre-ln", 16, d_model=16, n_heads=2, n_layers=1))
    data = [{"input_ids": torch.arange(start, start + 12) % 16, "labels": torch.arange(start, start + 12) % 16}
            for start in range(32)]
    arguments = transformers.TrainingArguments(str(tmp_path), max_steps=12, per_device_train_batch_size=8,
                                               learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                                               use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=hf, args=arguments, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 12 and losses[-1] < 0.85 * losses[0]  # measured 0.81 with the default initialization


def test_to_hf_refusals():
    with pytest.raises(SplitformerError, match="takes a splitformer.nn.LanguageModel, got Linear"):
        to_hf(torch.nn.Linear(2, 2))
    module = splitformer.derive("pre-ln", causal=True).torch_module()
    with pytest.raises(SplitformerError, match="emitted module"):
        to_hf(LanguageModel(module, VOCAB, d_model=8, n_heads=2))
    with pytest.raises(ValueError, match="input_ids is required"):
        to_hf(language_model("pre-ln"))(inputs_embeds=torch.zeros(1, 2, 8, dtype=torch.float64))


def _padded_mask():
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    return mask


@pytest.mark.parametrize("scheme, attention", [("pre-ln", "sdpa"), ("pre-ln", "eager"), ("gpt2", "sdpa")])
def test_replace_blocks_with_gpt2s_own_block_keeps_the_logits(scheme, attention):
    reference = gpt2(attn_implementation=attention)  # its 4-D mask: bool (sdpa) or added to the scores (eager)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = _padded_mask()
    replaced = replace_blocks(copy.deepcopy(reference), scheme)  # activation: GPT-2's own, gelu-tanh
    assert type(replaced.transformer.h[0]).__name__ == "SchemeBlock"
    assert torch.allclose(replaced(tokens).logits, reference(tokens).logits, rtol=0, atol=1e-10)
    padded, expected = replaced(tokens, attention_mask=mask).logits, reference(tokens, attention_mask=mask).logits
    assert torch.allclose(padded[0, 3:], expected[0, 3:], rtol=0, atol=1e-10)
    assert torch.allclose(padded[1], expected[1], rtol=0, atol=1e-10)
    generated = replaced.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(generated, reference.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False))
    relu = replace_blocks(copy.deepcopy(reference), scheme, activation="relu")  # control: the activation shows
    assert not torch.allclose(relu(tokens).logits, reference(tokens).logits, atol=1e-6)


def test_replace_blocks_with_llamas_own_block_keeps_the_logits():
    reference = llama()
    replaced = in_float64(replace_blocks(copy.deepcopy(reference), "llama"))  # its final norm in float64 too
    reference = in_float64(reference)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = _padded_mask()
    assert torch.allclose(replaced(tokens).logits, reference(tokens).logits, rtol=0, atol=1e-10)
    padded, expected = replaced(tokens, attention_mask=mask).logits, reference(tokens, attention_mask=mask).logits
    assert torch.allclose(padded[0, 3:], expected[0, 3:], rtol=0, atol=1e-10)
    generated = replaced.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(generated, reference.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False))


def test_replace_blocks_parallel_fine_tunes():
    reference = gpt2()
    model = replace_blocks(copy.deepcopy(reference), "parallel").train()
    first = model.transformer.h[0].block
    assert torch.equal(first.attn.W_q, reference.transformer.h[0].attn.c_attn.weight[:, :8])  # carried over
    tokens = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0] and losses[-1] == min(losses)
    assert model.eval().generate(tokens[:1, :4], max_new_tokens=4, do_sample=False).shape == (1, 8)


def test_replace_blocks_refuses_what_it_would_leave_uninitialized():
    reference = gpt2()
    with pytest.raises(SplitformerError, match=r"macaron has parameters GPT2Block lacks \(ffn_pre\.W_1, .*norm3\.bias\)"
                                                r"; pass initialize=True"):
        replace_blocks(copy.deepcopy(reference), "macaron")
    model = replace_blocks(copy.deepcopy(reference), "macaron", initialize=True)
    block, old = model.transformer.h[1].block, reference.transformer.h[1]
    assert torch.equal(block.attn.b_o, old.attn.c_proj.bias) and torch.equal(block.norm1.gain, old.ln_1.weight)
    with pytest.raises(SplitformerError, match="no whole-model reader for Linear"):
        replace_blocks(torch.nn.Linear(2, 2), "pre-ln")
    grouped = llama()  # Llama's keys are (d, d/2): a scheme without grouped heads cannot take them
    with pytest.raises(SplitformerError, match=r"attn\.W_k is \(8, 4\) in LlamaDecoderLayer, \(8, 8\) in pre-ln"):
        replace_blocks(grouped, "pre-ln", initialize=True)


def _set_theta(model):
    model.config.rope_parameters["rope_theta"] = 5e5  # after construction: the rotary buffer keeps 500


def _double_frequencies(model):
    model.model.rotary_emb.inv_freq.mul_(2.0)


def _scale_rotary(model):
    model.model.rotary_emb.attention_scaling = 0.5


def _bidirectional(model):
    model.config.is_causal = False  # transformers then builds a bidirectional mask


@pytest.mark.parametrize("edit, refusal", [
    (_set_theta, r"model\.rotary_emb\.inv_freq differs from the default RoPE frequencies of rope_theta=500000"),
    (_double_frequencies, r"model\.rotary_emb\.inv_freq differs from the default RoPE frequencies of rope_theta=500 "),
    (_scale_rotary, r"model\.rotary_emb\.attention_scaling is 0\.5"),
    (_bidirectional, r"LlamaForCausalLM\.config\.is_causal is False"),
])
def test_replace_blocks_checks_what_the_model_hands_its_blocks(edit, refusal):
    """The rotary embedding and the mask come from outside the blocks: ``replace_blocks`` checks the whole model
    as ``from_hf_lm`` does (found by an attacker: accepted, logits off by 2e-3 to 0.75)."""
    model = llama()
    edit(model)
    with pytest.raises(SplitformerError, match=refusal):
        replace_blocks(model, "llama")
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"  # nothing replaced
    control = replace_blocks(llama(), "llama")  # unedited: accepted
    assert type(control.model.layers[0]).__name__ == "SchemeBlock"


def test_replace_blocks_takes_the_dropout_rate_it_is_given():
    """GPT-2 drops at three sites, the generated Block at torch's four: no rate is carried silently (found by an
    attacker: the new blocks dropped nothing, the trained GPT-2 did)."""
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    reference = gpt2(attn_pdrop=0.1, resid_pdrop=0.1)
    with pytest.raises(SplitformerError, match=r"GPT2Block 0's attn\.attn_dropout\.p is 0\.1: .*pass dropout="):
        replace_blocks(copy.deepcopy(reference).train(), "gpt2")
    replaced = replace_blocks(copy.deepcopy(reference).train(), "gpt2", dropout=0.1)
    assert [layer.block.dropout for layer in replaced.transformer.h] == [0.1, 0.1]
    with torch.no_grad():
        assert not torch.equal(replaced(tokens).logits, replaced(tokens).logits)  # it drops in training
        assert torch.allclose(replaced.eval()(tokens).logits, reference(tokens).logits, rtol=0, atol=1e-10)
    assert replace_blocks(copy.deepcopy(reference), "gpt2", dropout=0.0).transformer.h[0].block.dropout == 0.0
    assert replace_blocks(gpt2(), "gpt2").transformer.h[0].block.dropout == 0.0  # control: no dropout, none asked
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.2)
    with pytest.raises(SplitformerError, match=r"LlamaDecoderLayer 0's self_attn\.attention_dropout is 0\.2"):
        replace_blocks(transformers.LlamaForCausalLM(config).eval(), "llama")


def test_the_config_holds_the_scheme_the_model_was_built_from_not_the_file_as_it_is_later(tmp_path):
    """A scheme file is read once, when the model is built: editing it before ``to_hf`` changes nothing
    (found by an attacker: the rebuilt model computed the edited file, logits off by 0.26)."""
    import splitformer.nn

    path = tmp_path / "mine.toml"
    builtin = (Path(splitformer.__file__).parent.parent / "symbolic" / "schemes" / "pre-ln.toml")
    path.write_text(builtin.read_text().replace('name = "pre-ln"', 'name = "mine"'), encoding="utf-8")
    model = splitformer.nn.LanguageModel(str(path), 11, d_model=8, n_heads=2, d_ff=12, n_layers=1, max_tokens=8)
    original = path.read_text()
    path.write_text(original.replace("pre-ln", "post-ln-like").replace('on = "norm1"', ""), encoding="utf-8")
    assert splitformer.nn.to_hf(model).config.scheme == original


def test_a_scheme_whose_source_text_says_otherwise_is_refused():
    """``dataclasses.replace`` keeps the text of the scheme it copies: the config would rebuild that one
    (found by an attacker: the reloaded model's logits off by 0.095, no error)."""
    import dataclasses

    mine = splitformer.scheme("mine", "pre-LN with a final norm",
                              operators={"attn": "attention", "norm": "layer-norm", "ffn": "feed-forward"},
                              steps=[splitformer.substep("attn", on="norm"), splitformer.substep("ffn", on="norm")],
                              final_norm=True)
    assert to_hf(language_model(mine.as_causal().with_activation("gelu"))).config.scheme == mine.source  # control
    edited = dataclasses.replace(mine, final_norm=False)
    with pytest.raises(SplitformerError, match=r"^to_hf: the scheme 'mine' has final_norm=False but its source "
                                               r"text \(what the config stores\) says True") as error:
        to_hf(language_model(edited))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("edit", ["every layer and the Stack", "one layer"])
def test_a_stack_edited_after_construction_is_refused(edit, tmp_path):
    """The config stores the constructor's arguments: an ``eps`` set afterwards would be lost on reload (found by an
    attacker: the reloaded model's logits off by 0.272, no error). Control: the unedited model round-trips."""
    model = language_model("pre-ln")
    tokens = torch.tensor([[5, 9, 2, 7, 30]])
    to_hf(model).save_pretrained(tmp_path)  # control: unedited, it is written and reads back exactly
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    with torch.no_grad():
        assert torch.equal(back(tokens).logits, model.eval()(tokens))
    edited = model.stack.layers if edit == "one layer" else [*model.stack.layers, model.stack]
    for module in edited[-1:] if edit == "one layer" else edited:
        module.eps = 0.5
    where = r"model\.stack\.layers\.1" if edit == "one layer" else r"model\.stack"
    with pytest.raises(SplitformerError, match=rf"^to_hf: {where} has eps=0.5 but the model's arguments \(what the "
                                               r"config stores\) build eps=1e-05") as error:
        to_hf(model)
    assert "\n" not in str(error.value)


def _untie_head(model):
    model.head.weight = torch.nn.Parameter(torch.randn_like(model.head.weight))


def _tie_head(model):
    model.head.weight = model.embed.weight


def _biased_head(model):
    model.head = torch.nn.Linear(8, VOCAB, dtype=torch.float64)


def _add_layer(model):
    model.stack.layers.append(copy.deepcopy(model.stack.layers[0]))


#: Edits of a LanguageModel's own parts after construction, whether its head is tied, what to_hf names.
LANGUAGE_MODEL_EDITS = {
    "untied head": (_untie_head, True, r"model\.embed\.weight is not model\.head\.weight but the model's arguments "
                                       r"\(what the config stores\) build them as one parameter \(tie_weights=True\)"),
    "tied head": (_tie_head, False, r"model\.embed\.weight is model\.head\.weight but the model's arguments \(what "
                                    r"the config stores\) build them as separate parameters"),
    "biased head": (_biased_head, False, r"model\.head\.bias is \[31\] torch\.float64 but the model's arguments \(what "
                                         r"the config stores\) build none"),
    "positions max_norm": (lambda model: setattr(model.positions, "max_norm", 0.5), False,
                           r"model\.positions has max_norm=0\.5 but .* build max_norm=None"),
    "dropout": (lambda model: setattr(model.dropout, "p", 0.25), True, r"model\.dropout has p=0\.25 but .* build p=0\.0"),
    "added layer": (_add_layer, True, r"model\.stack\.layers\.2 is a Block but .* build nothing there"),
    "forward hook": (lambda model: model.stack.layers[1].register_forward_hook(lambda module, args, out: 2 * out), True,
                     r"model\.stack\.layers\.1 has a forward hook but .* build none"),
    "buffer": (lambda model: model.embed.register_buffer("scale", torch.ones(())), True,
               r"model\.embed\.scale is \[\] torch\.float32 but .* build none"),
}


@pytest.mark.parametrize("edit", LANGUAGE_MODEL_EDITS)
def test_a_language_model_edited_after_construction_is_refused_and_left_as_it_was(edit):
    """The config rebuilds what ``model.arguments`` build: a part of the LanguageModel edited afterwards would be lost,
    and a head untied afterwards was re-tied in the caller's model by ``post_init`` (found by an attacker: the trained
    head gone, the user's own logits off by 4.21; a biased head's bias dropped on reload, 5.0; ``positions.max_norm``
    lost on reload, 0.99). Controls: the unedited model converts; the caller's parameters are left untouched."""
    change, tie, message = LANGUAGE_MODEL_EDITS[edit]
    model = language_model("pre-ln", tie_weights=tie)
    assert to_hf(model).model is model  # control: unedited, it converts
    model = language_model("pre-ln", tie_weights=tie)
    change(model)
    _random(model)
    with torch.no_grad():  # first: an Embedding with max_norm renormalizes its rows in place when it runs
        before = model(PROMPT)
    parameters = {name: (parameter, parameter.detach().clone())
                  for name, parameter in model.named_parameters(remove_duplicate=False)}
    with pytest.raises(SplitformerError, match=rf"^to_hf: {message}; build the LanguageModel that way") as error:
        to_hf(model)
    assert "\n" not in str(error.value)
    now = dict(model.named_parameters(remove_duplicate=False))
    assert now.keys() == parameters.keys()
    assert all(now[name] is parameter and torch.equal(parameter, kept) for name, (parameter, kept) in parameters.items())
    with torch.no_grad():
        assert torch.equal(model(PROMPT), before)


@pytest.mark.parametrize("tie", [True, False])
def test_to_hf_leaves_the_callers_model_as_it_was(tie):
    model = language_model("llama", tie_weights=tie)  # rotary: no learned positions
    parameters = {name: (parameter, parameter.detach().clone())
                  for name, parameter in model.named_parameters(remove_duplicate=False)}
    with torch.no_grad():
        before = model(PROMPT)
    hf = to_hf(model)
    now = dict(model.named_parameters(remove_duplicate=False))
    assert now.keys() == parameters.keys() and (now["head.weight"] is now["embed.weight"]) == tie
    assert all(now[name] is parameter and torch.equal(parameter, kept) for name, (parameter, kept) in parameters.items())
    with torch.no_grad():
        assert torch.equal(model(PROMPT), before) and torch.equal(hf(PROMPT).logits, before)


def test_past_key_values_is_the_cache():
    """transformers' older name of the cache (its own models still take it) was swallowed by ``**kwargs``: the new
    tokens ran as a fresh sequence (found by an attacker: 0.476 off, no warning). Control: without the cache they
    do differ."""
    hf = to_hf(language_model("pre-ln"))
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = hf(tokens).logits
        for name in ("cache", "past_key_values"):
            first = hf(tokens[:, :5], use_cache=True).cache
            rest = hf(tokens[:, 5:], **{name: first}).logits
            assert torch.allclose(rest, full[:, 5:], rtol=0, atol=1e-12)
            assert first.get_seq_length() == 8
        assert not torch.allclose(hf(tokens[:, 5:]).logits, full[:, 5:], atol=1e-3)  # control: the cache matters
        cache = hf(tokens[:, :5], use_cache=True).cache
        with pytest.raises(ValueError, match=r"^give the cache once: as cache= or as past_key_values="):
            hf(tokens[:, 5:], cache=cache, past_key_values=cache)
        with pytest.raises(TypeError, match=r"^cache \(past_key_values\) must be a transformers DynamicCache "
                                            r"\(every earlier token's keys and values, in order\), got tuple$"):
            hf(tokens[:, 5:], past_key_values=((torch.zeros(2, 2, 5, 4),) * 2,) * 2)


@pytest.mark.parametrize("keyword, value", [("token_type_ids", torch.zeros(1, 5, dtype=torch.long)),
                                            ("cache_position", torch.arange(5)), ("logits_to_keep", 1),
                                            ("output_hidden_states", True), ("output_attentions", True),
                                            ("atention_mask", torch.ones(1, 5))])
def test_a_keyword_the_forward_does_not_read_is_refused(keyword, value):
    """Any keyword left in ``**kwargs`` was ignored; it is refused by name. Controls: what ``generate`` and
    ``Trainer`` pass (``return_dict``, ``output_attentions=False``) is taken; ``return_dict=False`` gives a tuple."""
    hf = to_hf(language_model("pre-ln"))
    with torch.no_grad():
        logits = hf(PROMPT, return_dict=True, output_attentions=False, output_hidden_states=None).logits
        assert torch.equal(hf(PROMPT, return_dict=False)[0], logits)
        shown = f"{keyword}={value!r}" if keyword.startswith("output_") else keyword
        with pytest.raises(TypeError, match=rf"^SplitformerForCausalLM\.forward does not take {shown} \("):
            hf(PROMPT, **{keyword: value})


def test_a_config_naming_a_builtin_takes_its_activation():
    """Attack 16: ``SplitformerConfig(scheme="pre-ln", activation="gelu")`` built a ReLU model (the activation was
    read only with a scheme file's text): GELU-trained weights would load into ReLU blocks."""
    import sys

    from splitformer.codegen.hf_native import SplitformerConfig

    for activation, expected in (("gelu", "gelu"), (None, "relu")):
        model = SplitformerConfig(scheme="pre-ln", activation=activation, vocab_size=30, d_model=16,
                                  n_heads=2).language_model()
        assert sys.modules[type(model.stack).__module__].ACTIVATION == expected


def test_a_checkpoint_lacking_what_the_configuration_asks_for_is_refused(tmp_path):
    """Attack 17: ``from_pretrained(folder, final_norm=True)`` (a config field overridden) left the parameters the
    checkpoint lacks as uninitialized memory (gains of 4e11, NaN heads), different on every run. Refused, naming them;
    control: the same folder loads as saved."""
    from splitformer.codegen.hf_native import SplitformerForCausalLM, to_hf
    from splitformer.nn import LanguageModel

    lm = LanguageModel(splitformer.load_scheme("post-ln"), 30, d_model=16, n_heads=2).eval()
    to_hf(lm).save_pretrained(tmp_path)
    SplitformerForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"the checkpoint lacks 2 parameter\(s\) the configuration asks for "
                                         r"\(model\.stack\.final_norm\.bias, model\.stack\.final_norm\.gain\)"):
        SplitformerForCausalLM.from_pretrained(tmp_path, final_norm=True)


def test_a_cache_other_than_a_dynamic_cache_is_refused():
    """Attack 17: a ``StaticCache`` (pre-allocated slots written by position) was read whole: decoding with it was
    0.13 off the full pass. Refused by name; control: a ``DynamicCache`` decodes as the full pass."""
    from transformers import DynamicCache, StaticCache

    from splitformer.codegen.hf_native import to_hf
    from splitformer.nn import LanguageModel

    torch.manual_seed(0)
    hf = to_hf(LanguageModel(splitformer.load_scheme("pre-ln"), 30, d_model=16, n_heads=2).eval())
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        full = hf(ids).logits
        cache = DynamicCache(config=hf.config)
        hf(ids[:, :5], past_key_values=cache)
        assert (hf(ids[:, 5:], past_key_values=cache).logits - full[:, 5:]).abs().max() <= 1e-5
        with pytest.raises(TypeError, match="must be a transformers DynamicCache .*, got StaticCache"):
            hf(ids[:, :5], past_key_values=StaticCache(config=hf.config, max_cache_len=16))


def test_input_ids_must_be_a_batch_of_token_rows():
    """Attack 24: 1-D ``input_ids`` ran the model, then failed in the cache write with an IndexError. Refused by name;
    control: the same tokens as one row."""
    hf = to_hf(language_model("pre-ln"))
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^input_ids must be \(batch, tokens\) token ids, got \[5\]$"):
            hf(PROMPT[0])
        with pytest.raises(TypeError, match="^input_ids must be a torch.Tensor, got list$"):
            hf(PROMPT[0].tolist())
        assert hf(PROMPT[0][None]).logits.shape[:2] == (1, 5)


def test_replacing_the_blocks_twice_says_so():
    """Attack s33 L11b: a second replace_blocks on the same model said "SchemeBlock overrides forward of Module;
    adapters read the library class's computation only"; now it says the blocks were already replaced. Control: the
    first replacement runs."""
    model = replace_blocks(gpt2(), "gpt2")
    assert model(PROMPT).logits.shape == (1, 5, VOCAB)
    with pytest.raises(SplitformerError, match="^GPT2LMHeadModel's blocks were already replaced by replace_blocks"):
        replace_blocks(model, "pre-ln")
