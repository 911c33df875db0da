"""``from_hf_lm`` refuses a configuration that makes transformers build another mask than the causal one
(issue 25, finding F12), or run fewer blocks than the model holds.

transformers builds a causal LM's mask from its configuration at call time: ``config.is_causal = False``
gives a bidirectional mask (GPT-2 logits off by 0.567, Llama by 2.27 in the attacker's run), a
``config._attn_implementation`` of None gives none at all, and a mask function registered for the
implementation replaces transformers' own; Llama's forward runs ``layers[:config.num_hidden_layers]``.
Each edit changes transformers' logits (the first assertion of each case: the edit matters) and is
refused in one line naming the attribute; the unedited model is read and equal (control).
"""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function

from splitformer import SplitformerError
from splitformer.codegen.nn_hf import from_hf_lm

from test_nn_hf import VOCAB, gpt2, in_float64, llama

TOKENS = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))


def _eager(make):
    def made():
        model = make()
        model.set_attn_implementation("eager")
        return model
    return made


def _is_causal_false(model):
    model.config.is_causal = False


def _no_attention_implementation(model):
    model.config._attn_implementation = None


def _fewer_layers_run(model):
    model.config.num_hidden_layers = 1


#: (model, edit, refusal, tolerance of the control: Llama's eager attention takes its softmax in float32).
CASES = [
    ("gpt2-eager", _eager(gpt2), _is_causal_false,
     r"^GPT2LMHeadModel.config.is_causal is False: transformers then builds a bidirectional", 1e-10),
    ("llama-eager", _eager(llama), _is_causal_false, r"^LlamaForCausalLM.config.is_causal is False", 1e-6),
    ("gpt2", gpt2, _no_attention_implementation,
     r"^GPT2LMHeadModel.config._attn_implementation is None: transformers builds no mask", 1e-10),
    ("llama", llama, _no_attention_implementation, r"^LlamaForCausalLM.config._attn_implementation is None", 1e-10),
    ("llama", llama, _fewer_layers_run,
     r"^LlamaForCausalLM.model.config.num_hidden_layers is 1: the forward runs that many of the 2", 1e-10),
]


@pytest.mark.parametrize("make, edit, message, tolerance", [case[1:] for case in CASES],
                         ids=[f"{case[0]}{case[2].__name__}" for case in CASES])
def test_a_configuration_the_forward_reads_for_its_mask_is_refused_by_name(make, edit, message, tolerance):
    model = make()
    read = from_hf_lm(model)  # control: the model as built is read, and equal
    reference = in_float64(make())
    with torch.no_grad():
        assert torch.allclose(read(TOKENS), reference(TOKENS).logits, rtol=0, atol=tolerance)
        edit(reference)
        assert (read(TOKENS) - reference(TOKENS).logits).abs().max() > 1e-2  # the edit changes what transformers computes
    edit(model)
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf_lm(model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_registered_mask_function_is_refused_by_name(implementation, monkeypatch):
    builtin = AttentionMaskInterface._global_mapping[implementation]

    def bidirectional(*args, **kwargs):  # transformers' own mask function, made to attend to later tokens
        return builtin(*args, **kwargs | {"mask_function": bidirectional_mask_function, "allow_is_causal_skip": False})

    model = _eager(gpt2)() if implementation == "eager" else gpt2()
    read = from_hf_lm(model)  # control
    with torch.no_grad():
        assert torch.allclose(read(TOKENS), model(TOKENS).logits, rtol=0, atol=1e-10)
        monkeypatch.setitem(AttentionMaskInterface._global_mapping, implementation, bidirectional)
        assert (read(TOKENS) - model(TOKENS).logits).abs().max() > 1e-2  # the registered function changes the logits
    with pytest.raises(SplitformerError, match=rf"_attn_implementation is '{implementation}': transformers builds its mask "
                                               r"with test_a_registered_mask_function_is_refused_by_name.<locals>.bidirectional"):
        from_hf_lm(model)
