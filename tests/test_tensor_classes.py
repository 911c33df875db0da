"""Adapters read tensors whose class is exactly torch's (issue 25, finding F11).

A parameter that is a ``torch.Tensor`` subclass (``nn.Parameter(w.as_subclass(Doubling))``) runs the
source's forward through its own ``__torch_function__`` while adapters read the values it stores:
the built block was off by 13.2. Every reader (torch, transformers, timm, x-transformers, whole
language models) and every generated module written into refuses such a parameter or buffer in one
line naming it; the same modules with plain tensors are read (controls).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers  # a test dependency: a broken install fails, never skips
import x_transformers

import splitformer
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_timm, from_torch, from_xtransformers, to_torch, to_xtransformers

from conftest import GENERATED, import_path
from llama_reference import llama_config, randomized
from test_adapters import D, D_FF, HEADS, bert, encoder_layer
from timm_import import import_timm

POST_LN = import_path(GENERATED / "torch" / "post_ln.py", "_tensor_classes_post_ln")


class Doubling(torch.Tensor):
    """A tensor whose every ``F.linear`` returns twice the product its values give."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        return result * 2 if func is F.linear else result


class Marked(torch.Tensor):
    """A subclass that changes nothing: refused all the same (the rule is the exact class)."""


def subclassed(module: torch.nn.Module, path: str, cls: type = Marked) -> torch.nn.Module:
    """``module`` with its parameter or buffer at ``path`` replaced by the same values of class ``cls``."""
    owner_path, _, name = path.rpartition(".")
    owner = module.get_submodule(owner_path)
    tensor = getattr(owner, name).detach().as_subclass(cls)
    setattr(owner, name, torch.nn.Parameter(tensor) if name in owner._parameters else tensor)
    assert type(getattr(owner, name)) is cls
    return module


def _torch_layer():
    return encoder_layer(norm_first=True)


def _gpt2_block():
    config = transformers.GPT2Config(n_embd=D, n_head=HEADS, n_inner=D_FF, n_layer=1, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2Model(config).double().h[0]


def _timm_block():
    vision_transformer = import_timm("timm.models.vision_transformer")
    return vision_transformer.Block(D, HEADS, mlp_ratio=1.5, qkv_bias=True).double()


def _xtransformers_encoder():
    return x_transformers.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8, attn_flash=True).double()


READERS = [
    (from_torch, _torch_layer, "linear1.weight", "TransformerEncoderLayer.linear1.weight"),
    (from_torch, _torch_layer, "norm2.bias", "TransformerEncoderLayer.norm2.bias"),
    (from_hf, lambda: bert(layers=1).encoder.layer[0], "attention.self.query.weight", "BertLayer.attention.self.query.weight"),
    (from_hf, lambda: bert(layers=1), "embeddings.position_ids", "BertModel.embeddings.position_ids"),  # a buffer
    (from_hf, _gpt2_block, "attn.c_attn.weight", "GPT2Block.attn.c_attn.weight"),
    (from_timm, _timm_block, "attn.qkv.weight", "Block.attn.qkv.weight"),
    (from_xtransformers, _xtransformers_encoder, "layers.0.1.to_q.weight", "Encoder.layers.0.1.to_q.weight"),
]


@pytest.mark.parametrize("read, make, path, named", READERS, ids=[row[3] for row in READERS])
def test_every_reader_refuses_a_tensor_subclass_naming_it(read, make, path, named):
    read(make())  # control: the module as built is read
    with pytest.raises(SplitformerError, match=rf"^{named} is a Marked, not a torch.nn.Parameter or torch.Tensor") as error:
        read(subclassed(make(), path))
    assert "\n" not in str(error.value)


def test_a_subclass_that_changes_the_forward_is_what_is_refused(rng):
    """The attacker's case: the source computes with twice ``linear1``'s product, the stored values do not say so."""
    layer = _torch_layer().eval()
    block = from_torch(layer).build(splitformer.derive("pre-ln").torch_module())
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    with torch.no_grad():
        assert (block(u) - layer(u)).abs().max() <= 1e-10  # control: plain parameters, equal
        doubled = subclassed(layer, "linear1.weight", Doubling)(u).as_subclass(torch.Tensor)
        assert (block(u) - doubled).abs().max() > 0.1  # what reading the stored values would have missed
    with pytest.raises(SplitformerError, match="linear1.weight is a Doubling"):
        from_torch(layer)


def test_a_language_model_refuses_a_subclassed_buffer():
    """``from_hf_lm`` reads the whole model: the rotary table ``inv_freq`` is a buffer its forward reads."""
    def llama():
        torch.manual_seed(0)
        config = llama_config(vocab_size=40, num_hidden_layers=1)
        return randomized(transformers.LlamaForCausalLM(config).double().eval())

    splitformer.nn.from_hf_lm(llama())  # control
    with pytest.raises(SplitformerError, match=r"^LlamaForCausalLM.model.rotary_emb.inv_freq is a Marked"):
        splitformer.nn.from_hf_lm(subclassed(llama(), "model.rotary_emb.inv_freq"))


def test_a_generated_module_written_into_or_from_must_hold_plain_tensors():
    adapted = from_torch(encoder_layer())
    adapted.load_into(POST_LN.Block(D, HEADS, D_FF, dtype=torch.float64))  # control
    with pytest.raises(SplitformerError, match=r"^the Block.attn.W_q is a Marked"):
        adapted.load_into(subclassed(POST_LN.Block(D, HEADS, D_FF, dtype=torch.float64), "attn.W_q"))
    trained = subclassed(adapted.build(POST_LN), "ffn.W_1", Doubling)
    with pytest.raises(SplitformerError, match=r"^the Block.ffn.W_1 is a Doubling"):
        to_torch(trained, like=adapted)


def test_an_xtransformers_module_written_into_must_hold_plain_tensors():
    source = _xtransformers_encoder()
    adapted = from_xtransformers(source)
    to_xtransformers(adapted, _xtransformers_encoder())  # control
    with pytest.raises(SplitformerError, match=r"^Encoder.layers.0.1.to_out.weight is a Marked"):
        to_xtransformers(adapted, subclassed(_xtransformers_encoder(), "layers.0.1.to_out.weight"))
