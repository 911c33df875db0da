"""A library method replaced on the library class itself (``timm.layers.Mlp.forward = …``) is refused by name
(``inspection.check_runs_its_classes``): every function of a library class in a part's MRO must be a library's own
(its code in the installed package its module names; a decorator's wrapper may be torch's or the standard
library's). Before, only user subclasses were inspected and the patched forward was read as the library's (tenth
attacker, F5: the vit network 0.549 off). Controls: the same modules, unpatched, adapt and equal their sources
within 1e-10 in float64."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from transformers.models.gpt2 import modeling_gpt2
from transformers.models.llama import modeling_llama

import splitformer.nn as splitformer_nn
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_timm, from_torch

from test_adapter_as_built import _encoder, _generated, _llama, _llama_forward, _torch_forward
from test_adapters import randomize
from test_whole_model_inputs import TOKENS, gpt2
from timm_import import import_timm

vision_transformer = import_timm("timm.models.vision_transformer")
timm_layers = import_timm("timm.layers")


def _timm_block():
    torch.manual_seed(0)
    return randomize(vision_transformer.Block(8, 2, qkv_bias=True).double())


def _timm_forward(block, u):
    with torch.no_grad():
        return block(torch.tensor(u)).numpy()


#: (source, its reader, its forward on an array, width, the library class, the owner and part named)
CASES = [(_timm_block, from_timm, _timm_forward, 8, timm_layers.Mlp, r"Block\.mlp \(Mlp\) runs Mlp\.forward"),
         (_llama, from_hf, _llama_forward, 16, modeling_llama.LlamaMLP,
          r"LlamaDecoderLayer\.mlp \(LlamaMLP\) runs LlamaMLP\.forward"),
         (_encoder, from_torch, _torch_forward, 8, torch.nn.Linear,
          r"TransformerEncoderLayer\.self_attn\.out_proj \(NonDynamicallyQuantizableLinear\) runs Linear\.forward")]
IDS = ["timm Mlp", "transformers LlamaMLP", "torch Linear"]


def _scaled(forward):
    return functools.wraps(forward)(lambda self, x, *rest, **options: 1.01 * forward(self, x, *rest, **options))


#: How the method is replaced: a lambda, a functools.wraps wrapper of the original, torch.no_grad of a lambda, a
#: builtin (no Python code, binds no self).
PATCHES = {"lambda": lambda forward: (lambda self, x, *rest, **options: 1.01 * forward(self, x, *rest, **options)),
           "wraps": _scaled, "no_grad": lambda forward: torch.no_grad()(_scaled(forward)),
           "builtin": lambda forward: torch.tanh}


@pytest.mark.parametrize("make, read, forward, d, klass, named", CASES, ids=IDS)
def test_unpatched_library_classes_are_read_and_equal(make, read, forward, d, klass, named, rng):
    source = make()
    u = rng.standard_normal((2, 5, d))
    assert np.abs(_generated(read(source), u) - forward(source, u)).max() <= 1e-10


@pytest.mark.parametrize("patch", list(PATCHES))
@pytest.mark.parametrize("make, read, forward, d, klass, named", CASES, ids=IDS)
def test_a_library_method_replaced_on_the_class_is_refused_by_name(make, read, forward, d, klass, named, patch,
                                                                    monkeypatch):
    source = make()
    monkeypatch.setattr(klass, "forward", PATCHES[patch](klass.forward))
    with pytest.raises(SplitformerError, match=rf"^{named}, which is not the installed library's own") as error:
        read(source)
    assert "\n" not in str(error.value)


def test_a_whole_model_reader_inspects_the_library_classes_too(monkeypatch):
    model = gpt2()
    with torch.no_grad():
        assert (splitformer_nn.from_hf_lm(model)(TOKENS) - model(TOKENS).logits).abs().max() <= 1e-10  # control
    monkeypatch.setattr(modeling_gpt2.GPT2MLP, "forward", PATCHES["lambda"](modeling_gpt2.GPT2MLP.forward))
    with pytest.raises(SplitformerError, match=r"^GPT2LMHeadModel\.transformer\.h\.0\.mlp \(GPT2MLP\) runs "
                                               r"GPT2MLP\.forward, which is not the installed library's own"):
        splitformer_nn.from_hf_lm(model)


def test_a_method_added_to_torch_by_another_library_is_its_own():
    """transformers adds ``smart_apply`` to ``torch.nn.Module`` when it initializes a model: a library's own function
    (its code in transformers, its module transformers'), accepted on every part."""
    model = gpt2()
    method = vars(torch.nn.Module)["smart_apply"]
    assert method.__module__.startswith("transformers.") and "transformers" in method.__code__.co_filename
    assert from_torch(_encoder()).scheme == "post-ln"
    assert isinstance(splitformer_nn.from_hf_lm(model), splitformer_nn.LanguageModel)
