"""Adapters read the module's computation, not its class name: a layout, dropout, hook, overridden
method, bias tensor or configuration the generated module would not reproduce is carried or refused
by name, in one line; each refusal has a control the adapters accept."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers  # a test dependency: a broken install fails, never skips
import transformers.pytorch_utils
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_torch, to_torch

from conftest import GENERATED, import_path
from llama_reference import llama_config, randomized
from test_adapters import D, D_FF, HEADS, encoder_layer, randomize

POST_LN = import_path(GENERATED / "torch" / "post_ln.py", "_refusals_post_ln")
PRE_LN = import_path(GENERATED / "torch" / "pre_ln.py", "_refusals_pre_ln")
LLAMA = import_path(GENERATED / "torch" / "llama.py", "_refusals_llama")


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# --- constructor options travel through build / load_into -------------------------------------------------

def test_batch_first_false_is_carried_into_the_built_block(rng):
    layer = randomize(torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=False,
                                                       dtype=torch.float64))
    block = from_torch(layer).build(POST_LN)
    assert block.batch_first is False
    assert repr(from_torch(layer)).endswith(", batch_first=False (the source's (tokens, batch, d); NumPy takes batch "
                                            "first))")  # the repr alone let a reader feed NumPy the source's layout
    u = torch.tensor(rng.standard_normal((5, 2, D)))  # (tokens, batch, d)
    with torch.no_grad():
        assert (block(u) - layer(u)).abs().max() <= 1e-10
    with pytest.raises(SplitformerError, match="the source has batch_first=False, the Block batch_first=True") as error:
        from_torch(layer).load_into(POST_LN.Block(D, HEADS, D_FF, dtype=torch.float64))
    one_line(error)


def test_dropout_is_carried_and_compared():
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.25, batch_first=True, dtype=torch.float64)
    assert from_torch(layer).build(POST_LN).dropout == 0.25
    with pytest.raises(SplitformerError, match="the source has dropout=0.25, the Block dropout=0.0"):
        from_torch(layer).load_into(POST_LN.Block(D, HEADS, D_FF, dtype=torch.float64))
    layer.dropout1.p = 0.5  # differing probabilities: not carried, and said (in training mode: random, refused)
    with pytest.raises(SplitformerError, match=r"^TransformerEncoderLayer\.self_attn \(MultiheadAttention\) is in "
                                               r"training mode with dropout=0\.25: .*call \.eval\(\)") as error:
        from_torch(layer)
    one_line(error)
    adapted = from_torch(layer.eval())
    assert adapted.dropout is None and any("dropout (p = 0.25, 0.5) is not carried" in note for note in adapted.notes)
    assert from_torch(layer).build(POST_LN).dropout == 0.0


def test_a_dropout_that_is_not_carried_is_stated():
    from test_adapters import bert

    assert any("dropout (p = 0.1) is not carried" in note for note in from_hf(bert(layers=1, hidden_dropout_prob=0.1)).notes)
    assert not any("dropout" in note for note in from_hf(bert(layers=1)).notes)  # control: no dropout, no note


def test_load_into_compares_rope_theta_and_key_value_heads():
    adapted = from_hf(randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24, theta=500.0), layer_idx=0)))
    adapted.load_into(LLAMA.Block(16, 4, 24, n_kv_heads=2, rope_theta=500.0, bias=False, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="the source has rope_theta=500.0, the Block rope_theta=10000.0"):
        adapted.load_into(LLAMA.Block(16, 4, 24, n_kv_heads=2, bias=False, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="n_kv_heads=2, the Block n_kv_heads=4"):
        adapted.load_into(LLAMA.Block(16, 4, 24, rope_theta=500.0, bias=False, dtype=torch.float64))


# --- to_torch(block, like=...) keeps the computation ------------------------------------------------------

def test_to_torch_refuses_a_block_of_another_scheme_or_configuration():
    post = from_torch(encoder_layer())
    same = post.build(POST_LN)
    assert set(to_torch(same, like=post)) == set(encoder_layer().state_dict())  # control: same computation
    cases = [(PRE_LN.Block(D, HEADS, D_FF, dtype=torch.float64), "the source computes post-ln with relu; the Block computes pre-ln"),
             (POST_LN.Block(D, HEADS, D_FF, eps=1e-6, dtype=torch.float64), "the source has eps=1e-05, the Block eps=1e-06"),
             (POST_LN.Block(D, HEADS, D_FF, batch_first=False, dtype=torch.float64), "batch_first=True, the Block batch_first=False"),
             (torch.nn.Linear(2, 2), "Linear is not a generated Block or Stack")]
    for block, message in cases:
        with pytest.raises(SplitformerError, match=message) as error:
            to_torch(block, like=post)
        one_line(error)


@pytest.mark.parametrize("variant, message", [
    ("causal", "computes causal post-ln \\(derived with causal=True\\); the source computes non-causal post-ln"),
    ("pre-ln named post-ln", "computes another scheme under the name post-ln"),
])
def test_a_module_computing_otherwise_under_the_sources_scheme_name_is_refused(variant, message):
    """The module's COMPUTES digest is compared, not its SCHEME name: a module derived with
    causal=True, or from a scheme file that reuses the name post-ln for pre-LN, keeps SCHEME
    'post-ln' and computes another forward."""
    from splitformer import derive, parse_scheme
    from splitformer.symbolic.builtins import builtin_text

    layer = encoder_layer()
    post = from_torch(layer)
    assert to_torch(post.build(POST_LN), like=post)  # control: the built-in post-ln module
    if variant == "causal":
        module = derive("post-ln", causal=True).torch_module()
    else:
        module = derive(parse_scheme(builtin_text("pre-ln").replace('name = "pre-ln"', 'name = "post-ln"'))).torch_module()
    assert module.SCHEME == "post-ln"
    block = module.Block(D, HEADS, D_FF, dtype=torch.float64)
    for attempt in (lambda: post.build(module), lambda: post.load_into(block), lambda: to_torch(block, like=post)):
        with pytest.raises(SplitformerError, match=message) as error:
            attempt()
        one_line(error)


# --- the module computes what its class says -------------------------------------------------------------

def _hooked(kind):
    layer = encoder_layer()
    target = layer.self_attn.out_proj
    {"forward": lambda: target.register_forward_hook(lambda module, args, out: out * 2),
     "forward pre-hook": lambda: target.register_forward_pre_hook(lambda module, args: None),
     "backward hook": lambda: target.register_full_backward_hook(lambda module, gin, gout: None),
     "backward pre-hook": lambda: target.register_full_backward_pre_hook(lambda module, gout: None)}[kind]()
    return layer


@pytest.mark.parametrize("kind", ["forward", "forward pre-hook", "backward hook", "backward pre-hook"])
def test_hooks_are_refused_naming_the_submodule(kind):
    with pytest.raises(SplitformerError, match=r"TransformerEncoderLayer\.self_attn\.out_proj has a (forward hook|"
                                               + kind + ")") as error:
        from_torch(_hooked(kind))
    one_line(error)


def test_a_global_module_hook_is_refused():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)
    try:
        with pytest.raises(SplitformerError, match="a global module forward hook is registered"):
            from_torch(encoder_layer())
    finally:
        handle.remove()
    from_torch(encoder_layer())  # control: gone with the hook


def _subclass(**methods):
    """A subclass of torch's layer under torch's class name (adapters dispatch on the name)."""
    cls = type("TransformerEncoderLayer", (torch.nn.TransformerEncoderLayer,), methods)
    return randomize(cls(D, HEADS, D_FF, dropout=0.0, batch_first=True, dtype=torch.float64))


class DoubledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("method", ["forward", "_ff_block", "_sa_block"])
def test_an_overridden_method_is_refused_naming_the_module_and_method(method):
    original = getattr(torch.nn.TransformerEncoderLayer, method)
    layer = _subclass(**{method: lambda self, *args, **kwargs: 2 * original(self, *args, **kwargs)})
    with pytest.raises(SplitformerError, match=rf"^TransformerEncoderLayer \(TransformerEncoderLayer\) overrides {method} "
                                               "of TransformerEncoderLayer") as error:
        from_torch(layer)
    one_line(error)


def test_an_overridden_submodule_or_instance_forward_is_refused():
    layer = encoder_layer()
    layer.linear1 = DoubledLinear(D, D_FF, dtype=torch.float64)
    with pytest.raises(SplitformerError, match=r"TransformerEncoderLayer\.linear1 \(DoubledLinear\) overrides forward"):
        from_torch(layer)
    layer = encoder_layer()
    layer.norm2.forward = lambda x: x
    with pytest.raises(SplitformerError, match=r"TransformerEncoderLayer\.norm2 has its forward replaced on the instance"):
        from_torch(layer)


def _instance_sa_block():
    layer = encoder_layer()
    original = layer._sa_block
    layer._sa_block = lambda *args, **kwargs: 2 * original(*args, **kwargs)
    return from_torch, layer, r"^TransformerEncoderLayer has its _sa_block replaced on the instance"


def _instance_feed_forward_chunk():
    layer = _bert_layer()
    layer.feed_forward_chunk = lambda attention_output: attention_output
    return from_hf, layer, r"^BertLayer has its feed_forward_chunk replaced on the instance"


@pytest.mark.parametrize("make", [_instance_sa_block, _instance_feed_forward_chunk])
def test_any_method_replaced_on_the_instance_is_refused(make):
    """Not only ``forward``: an instance attribute shadowing a helper the forward calls changes the result."""
    read, layer, message = make()
    with pytest.raises(SplitformerError, match=message) as error:
        read(layer)
    one_line(error)


def test_a_subclass_with_only_a_constructor_is_read(rng):
    def __init__(self):
        torch.nn.TransformerEncoderLayer.__init__(self, D, HEADS, D_FF, dropout=0.0, batch_first=True,
                                                  dtype=torch.float64)

    layer = randomize(type("TransformerEncoderLayer", (torch.nn.TransformerEncoderLayer,), {"__init__": __init__})())
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    with torch.no_grad():
        assert (from_torch(layer).build(POST_LN)(u) - layer(u)).abs().max() <= 1e-10


# --- tensors, not configuration ---------------------------------------------------------------------------

def test_a_llama_projection_bias_is_read_from_the_tensor():
    layer = randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24), layer_idx=0))
    from_hf(layer)  # control
    layer.self_attn.q_proj.bias = torch.nn.Parameter(torch.ones(16, dtype=torch.float64))
    assert not layer.self_attn.config.attention_bias
    with pytest.raises(SplitformerError, match=r"LlamaDecoderLayer\.self_attn\.q_proj has a bias; the llama scheme has none"):
        from_hf(layer)


@pytest.mark.parametrize("part, replacement, message", [
    ("linear1", torch.nn.Identity(), r"TransformerEncoderLayer\.linear1 is Identity, not Linear"),
    ("norm2", torch.nn.Identity(), r"TransformerEncoderLayer\.norm2 is Identity, not LayerNorm"),
])
def test_a_replaced_submodule_is_refused_by_name(part, replacement, message):
    layer = encoder_layer()
    setattr(layer, part, replacement)
    with pytest.raises(SplitformerError, match=message) as error:
        from_torch(layer)
    one_line(error)


def _gpt2_block():
    from test_gpt2 import gpt2_config, random_block

    return random_block(gpt2_config(D, HEADS, D_FF, 1e-5))


def _bert_layer():
    from test_adapters import bert

    return bert(layers=1).encoder.layer[0]


@pytest.mark.parametrize("make, part, replacement, message", [
    (_gpt2_block, "mlp.act", torch.nn.ReLU(), r"GPT2Block\.mlp\.act is ReLU; the gpt2 scheme implements gelu-tanh"),
    (_gpt2_block, "attn.c_proj", torch.nn.Linear(D, D, dtype=torch.float64), r"GPT2Block\.attn\.c_proj is Linear, not Conv1D"),
    (_gpt2_block, "mlp.dropout", torch.nn.Tanh(), r"GPT2Block\.mlp\.dropout is Tanh, not Dropout"),
    (_bert_layer, "attention.output.dense", transformers.pytorch_utils.Conv1D(D, D),
     r"BertLayer\.attention\.output\.dense is Conv1D, not Linear"),
    (_bert_layer, "output.LayerNorm", torch.nn.RMSNorm(D), r"BertLayer\.output\.LayerNorm is RMSNorm, not LayerNorm"),
])
def test_a_replaced_transformers_submodule_is_refused_by_name(make, part, replacement, message):
    """GPT-2 and BERT layers: every submodule's class is checked, the activation read from the module."""
    layer = make()
    from_hf(layer)  # control: the layer as built
    parent, _, name = part.rpartition(".")
    setattr(layer.get_submodule(parent), name, replacement)
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf(layer)
    one_line(error)


def _llama_layer():
    return randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24), layer_idx=0))


@pytest.mark.parametrize("make, attention, flag, value, message", [
    (_gpt2_block, "attn", "scaling", 2.0, r"^GPT2Block scales attention scores by 2\.0 \(attn\.scaling\), the gpt2 "
                                           r"scheme by 1/sqrt\(head_dim\)"),
    (_gpt2_block, "attn", "is_causal", False, r"^GPT2Block\.attn\.is_causal is False: it attends to later tokens"),
    (_llama_layer, "self_attn", "is_causal", False,
     r"^LlamaDecoderLayer\.self_attn\.is_causal is False: it attends to later tokens"),
])
def test_a_causal_attention_flag_the_forward_reads_is_compared(make, attention, flag, value, message):
    """The numbers transformers' forward uses (``scaling``, ``is_causal``), not the config's flags."""
    layer = make()
    from_hf(layer)  # control
    setattr(layer.get_submodule(attention), flag, value)
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf(layer)
    one_line(error)


def _hot_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=2 * scaling, **kwargs)


@pytest.mark.parametrize("implementation", ["hot_sdpa", "sdpa", "eager"])
def test_a_registered_attention_function_is_refused_by_name(implementation, monkeypatch):
    """transformers' dispatch (``config._attn_implementation``) reaches only its own eager and sdpa functions."""
    layer = _bert_layer()
    layer.attention.self.config._attn_implementation = implementation
    if implementation != "hot_sdpa":
        from_hf(layer)  # control: transformers' own function
    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, implementation, _hot_attention)
    with pytest.raises(SplitformerError, match=rf"^BertLayer\.attention\.self\.config\._attn_implementation is "
                                               rf"'{implementation}', which transformers' AttentionInterface "
                                               r"dispatches to _hot_attention") as error:
        from_hf(layer)
    one_line(error)


def test_an_activation_replaced_after_construction_is_refused():
    layer = encoder_layer(activation="relu")
    layer.activation = torch.nn.functional.gelu  # torch's fast path would still compute relu
    with pytest.raises(SplitformerError, match="activation \\(gelu\\) was replaced after construction"):
        from_torch(layer)


def test_an_encoder_layers_unknown_activation_lists_only_what_the_layer_reads():
    """A docs auditor (s46): the refusal listed "torch's GELU exact or approximate='tanh'", and the tanh GELU was then
    refused too (torch's layer computes it outside its fast path only). x-transformers' message keeps it (control)."""
    with pytest.raises(SplitformerError, match=r"supported: gelu, relu, silu, tanh, and torch's GELU exact\)$"):
        from_torch(encoder_layer(activation=torch.nn.functional.leaky_relu))
    from splitformer.codegen.adapters.common import activation_name

    with pytest.raises(SplitformerError, match="exact or approximate='tanh'"):
        activation_name("x-transformers ff", torch.nn.functional.leaky_relu)


def test_a_llama_activation_module_is_read():
    layer = randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24), layer_idx=0))
    layer.mlp.act_fn = torch.nn.ReLU()
    with pytest.raises(SplitformerError, match=r"mlp\.act_fn is not silu"):
        from_hf(layer)


def test_a_missing_gpt2_bias_is_read_from_the_tensor():
    from test_gpt2 import gpt2_config, random_block

    block = random_block(gpt2_config(8, 2, 12, 1e-5))
    from_hf(block)  # control
    block.mlp.c_proj.bias = None
    with pytest.raises(SplitformerError, match=r"GPT2Block\.mlp\.c_proj has no bias"):
        from_hf(block)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, "not a dtype"])
def test_non_floating_conversions_are_refused(dtype):
    with pytest.raises(SplitformerError, match="dtype=") as error:
        from_torch(encoder_layer(), dtype=dtype)
    one_line(error)
    with pytest.raises(SplitformerError, match="dtype="):
        from_torch(encoder_layer()).astype(dtype)
    assert from_torch(encoder_layer(), dtype=np.float32).dtype == np.float32  # control


def test_writers_refuse_non_floating_dtypes_and_widen_a_bfloat16_block():
    """attack5 08/14: ``to_torch(dtype=torch.int64)`` is refused before any work; a generated Block cast to
    bfloat16 is widened as the readers widen (exactly) and written back bit-exact."""
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=True)
    layer = layer.to(torch.bfloat16).eval()
    adapted = from_torch(layer)
    with pytest.raises(SplitformerError, match=r"dtype=torch\.int64 is refused") as error:
        to_torch(adapted, dtype=torch.int64)
    one_line(error)
    block = adapted.build(adapted.derivation().torch_module()).to(torch.bfloat16)
    state = to_torch(block, like=adapted)
    assert all(torch.equal(state[key], value) for key, value in layer.state_dict().items())


def test_meta_tensors_are_refused_in_one_line():
    with torch.device("meta"):
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, batch_first=True)
    with pytest.raises(SplitformerError, match=r"TransformerEncoderLayer\.self_attn\.in_proj_weight is on the meta device") as error:
        from_torch(layer)
    one_line(error)


def test_a_cvt_batch_norm_without_running_statistics_is_refused():
    from test_cvt import CONFIGS, _cvt

    model = _cvt(False, CONFIGS["2-stages"])
    norm = model.encoder.stages[0].layers[0].attention.attention.convolution_projection_query.convolution_projection.normalization
    norm.track_running_stats, norm.running_mean, norm.running_var = False, None, None
    with pytest.raises(SplitformerError, match=r"stages\.0\.layers\.0\.qbn tracks no running statistics") as error:
        from_hf(model)
    one_line(error)


# --- hostile input (issue 25): what runs, not what it is called or declared ------------------------------

class Dropout(torch.nn.Tanh):  # a user class named like a library part, running another library class
    p = 0.0


class LayerNorm(torch.nn.RMSNorm):
    bias = None


class Identity(torch.nn.Tanh):
    pass


class TransformerEncoder(torch.nn.Sequential):  # Sequential.forward applies every child, an extra one included
    pass


#: A user class that claims to be torch's: torch.nn.modules.dropout holds another Dropout.
SpoofedDropout = type("Dropout", (torch.nn.Tanh,), {"__module__": "torch.nn.modules.dropout", "__qualname__": "Dropout"})


def _named_like_a_library_part(make, part, replacement):
    def build():
        module = make()
        parent, _, name = part.rpartition(".")
        setattr(module.get_submodule(parent), name, replacement())
        return module
    return build


def _timm_block():
    from test_adapters_timm import block

    return block()


def _sequential_named_encoder():
    encoder = TransformerEncoder()
    encoder.layers = torch.nn.Sequential(encoder_layer(norm_first=True), encoder_layer(norm_first=True, seed=1))
    encoder.extra = torch.nn.Tanh()
    return encoder.eval()


@pytest.mark.parametrize("make, read, message", [
    (_named_like_a_library_part(encoder_layer, "dropout1", Dropout), from_torch,
     r"TransformerEncoderLayer\.dropout1 is Dropout \(a user class running Tanh\), not Dropout"),
    (_named_like_a_library_part(encoder_layer, "dropout1", SpoofedDropout), from_torch,
     r"TransformerEncoderLayer\.dropout1 is Dropout \(a user class running Tanh\), not Dropout"),
    (_named_like_a_library_part(lambda: encoder_layer(bias=False), "norm1", lambda: LayerNorm(D)), from_torch,
     r"TransformerEncoderLayer\.norm1 is LayerNorm \(a user class running RMSNorm\), not LayerNorm"),
    (_named_like_a_library_part(_bert_layer, "output.dropout", Dropout), from_hf,
     r"BertLayer\.output\.dropout is Dropout \(a user class running Tanh\), not Dropout"),
    (_named_like_a_library_part(_timm_block, "ls1", Identity), lambda block: __import__("splitformer.adapters").adapters.from_timm(block),
     r"timm Block has LayerScale \(init_values\) \(Identity, a Tanh\)"),
    (_sequential_named_encoder, from_torch, r"no torch adapter for Sequential"),
])
def test_a_user_class_named_like_a_library_part_is_read_as_what_it_runs(make, read, message):
    """F1: a part is read as the library class it runs (the first in its MRO, found where its module says),
    never by its own name; each of these was accepted and computed otherwise (off by 1 to 2.3)."""
    with pytest.raises(SplitformerError, match=message) as error:
        read(make())
    one_line(error)


def test_an_activation_named_like_a_library_class_is_read_as_what_it_runs():
    from splitformer.codegen.adapters.common import activation_name

    class GELU(torch.nn.Tanh):  # runs Tanh: read as tanh, which is what it computes
        pass

    assert activation_name("layer", GELU()) == "tanh" and activation_name("layer", torch.nn.GELU()) == "gelu"


def test_a_compiled_call_replacing_forward_is_refused():
    layer = encoder_layer()
    layer.linear1._compiled_call_impl = lambda *args, **kwargs: args[0]  # what calling linear1 runs
    with pytest.raises(SplitformerError, match=r"TransformerEncoderLayer\.linear1 has _compiled_call_impl set") as error:
        from_torch(layer)
    one_line(error)


def _vit_attention():
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=D, num_attention_heads=HEADS,
                                    num_hidden_layers=1, intermediate_size=D_FF, attn_implementation="eager")
    model = randomize(transformers.ViTModel(config).double())
    attention = model.layers[0].attention if hasattr(model, "layers") else model.encoder.layer[0].attention.attention
    return model, attention, "head_dim" if hasattr(attention, "head_dim") else "attention_head_size"


def _edited(make, *edits):
    def build():
        module, *rest = make()
        for path, value in edits:
            owner, _, name = path.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, name, value)
        return module
    return build


def _wide_vit_head():
    model, attention, name = _vit_attention()
    setattr(attention, name, 2 * D // HEADS)  # the forward splits d into HEADS / 2 heads
    return model


@pytest.mark.parametrize("make, message", [
    (_edited(lambda: (_bert_layer(),), ("attention.self.attention_head_size", 2 * D // HEADS),
             ("attention.self.scaling", (2 * D // HEADS) ** -0.5)),
     r"BertLayer\.attention\.self\.attention_head_size is 8, but attention\.self\.num_attention_heads = 2 heads of d = 8 make it 4"),
    (_edited(lambda: (_bert_layer(),), ("attention.self.num_attention_heads", 1)),
     r"BertLayer\.attention\.self\.attention_head_size is 4, but attention\.self\.num_attention_heads = 1 heads"),
    (_edited(lambda: (_bert_layer(),), ("attention.self.all_head_size", D // 2)), r"BertLayer\.attention\.self\.all_head_size is 4"),
    (_edited(lambda: (_gpt2_block(),), ("attn.head_dim", 2 * D // HEADS), ("attn.scaling", (2 * D // HEADS) ** -0.5)),
     r"GPT2Block\.attn\.head_dim is 8, but attn\.num_heads = 2 heads of d = 8 make it 4"),
    (_edited(lambda: (_gpt2_block(),), ("attn.split_size", D // 2)), r"GPT2Block\.attn\.split_size is 4"),
    (_wide_vit_head, r"ViTModel layer 0 attention\.(head_dim|attention_head_size) is 8, but num_attention_heads = 2"),
])
def test_the_head_split_the_forward_reads_is_compared_with_n_heads(make, message):
    """F2: the forwards split heads by a module attribute (BERT's ``attention_head_size``, GPT-2's ``head_dim``,
    ViT's ``head_dim``), the adapters read ``n_heads``: edited apart they computed otherwise (off by 0.53 to 2.2)."""
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf(make())
    one_line(error)


def test_the_head_split_controls_are_read():
    for module in (_bert_layer(), _gpt2_block(), _vit_attention()[0]):
        from_hf(module)


@pytest.mark.parametrize("flag", ["is_decoder", "add_cross_attention"])
def test_a_bert_model_whose_config_makes_its_forward_a_decoders_is_refused(flag):
    """F6: ``BertModel.forward`` masks causally when ``config.is_decoder`` (read at call time): edited after
    construction it was read as the encoder (off by 0.27), by ``from_hf`` and ``from_hf_encoder`` alike."""
    from test_adapters import bert
    from splitformer.nn import from_hf_encoder

    model = bert(layers=1)
    from_hf(model)  # control
    setattr(model.config, flag, True)
    for read in (from_hf, from_hf_encoder):
        with pytest.raises(SplitformerError, match=rf"BertModel\.config\.{flag} is True: its forward is a decoder's") as error:
            read(model)
        one_line(error)


# --- generated modules: exactly their own classes, every attribute their forward reads --------------------

def _pre_ln_encoder(final_norm=True):
    norm = torch.nn.LayerNorm(D, dtype=torch.float64) if final_norm else None
    encoder = torch.nn.TransformerEncoder(encoder_layer(norm_first=True), 2, norm=norm, enable_nested_tensor=False)
    return randomize(encoder)


def test_a_stack_holding_blocks_of_another_module_or_subclasses_is_refused():
    """F3: a Stack's ``COMPUTES`` describes what runs only when its layers are its own module's ``Block``:
    post-ln Blocks in a pre-ln Stack (off by 12.7) and a subclass doubling ``forward`` (27.6) were accepted."""
    adapted = from_torch(_pre_ln_encoder(final_norm=False))
    stack = adapted.build(PRE_LN)  # control

    class Scaled(PRE_LN.Block):
        def forward(self, *args, **kwargs):
            return 2 * super().forward(*args, **kwargs)

    for block, name in ((POST_LN.Block, r"_refusals_post_ln\.Block"), (Scaled, r"Scaled")):
        stack.layers = torch.nn.ModuleList([block(D, HEADS, D_FF, dtype=torch.float64) for _ in range(2)])
        for call in (adapted.load_into, lambda module: to_torch(module, like=adapted)):
            with pytest.raises(SplitformerError, match=rf"the Stack\.layers\[0\] is \S*{name}, not a class of the "
                                                       r"generated module _refusals_pre_ln") as error:
                call(stack)
            one_line(error)


def test_a_stacks_own_attributes_are_compared():
    """F8: the Stack's final norm reads the Stack's own ``eps`` (set to 10 it was accepted, off by 0.27);
    ``load_params`` reads its ``tied``."""
    adapted = from_torch(_pre_ln_encoder())
    stack = adapted.build(PRE_LN)
    to_torch(stack, like=adapted)  # control
    stack.eps = 10.0
    for call in (adapted.load_into, lambda module: to_torch(module, like=adapted)):
        with pytest.raises(SplitformerError, match=r"the source has eps=1e-05, the Stack eps=10.0 \(its final norm reads it\)"):
            call(stack)
    stack = adapted.build(PRE_LN)
    stack.tied = True  # load_params would load layers[0] only
    with pytest.raises(SplitformerError, match=r"the Stack has tied=True but its layers are distinct modules") as error:
        adapted.load_into(stack)
    one_line(error)


def test_a_shared_layer_module_is_read_as_tied_and_differing_copies_are_not_written(rng):
    """F7: ``layers`` holding one module object at every step is a tied stack; writing two different layers
    into it kept the last (off by 0.45): refused, as ``to_xtransformers`` refuses copies of tied layers."""
    encoder = _pre_ln_encoder()
    encoder.layers = torch.nn.ModuleList([encoder.layers[0]] * 2)
    adapted = from_torch(encoder)
    assert adapted.tied
    stack = adapted.build(PRE_LN)
    assert stack.tied and stack.layers[0] is stack.layers[1]
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    with torch.no_grad():
        assert (stack(u) - encoder(u)).abs().max() <= 1e-10
    encoder.load_state_dict(to_torch(stack, like=adapted), strict=True)  # control: one layer, written once
    trained = [dict(adapted.layers[0]), dict(adapted.layers[1])]
    trained[1]["attn.W_q"] = 1.5 * trained[1]["attn.W_q"]
    with pytest.raises(SplitformerError, match=r"layers\[1\]\.attn\.W_q differs from layers\[0\]\.attn\.W_q, but the "
                                               r"source's steps run one shared layer module \(tied\)") as error:
        to_torch(adapted.with_params(trained, adapted.final_norm))
    one_line(error)
    untied = from_torch(_pre_ln_encoder()).build(PRE_LN)  # a Stack trained untied from a tied source
    with pytest.raises(SplitformerError, match=r"layers\[1\]\.\S+ differs from layers\[0\]"):
        to_torch(untied, like=adapted)
    encoder.layers = torch.nn.ModuleList([encoder.layers[0], encoder.layers[0], encoder_layer(norm_first=True)])
    with pytest.raises(SplitformerError, match=r"TransformerEncoder\.layers shares some layer modules between steps "
                                               r"but not all \(2 distinct of 3\)"):
        from_torch(encoder)


def test_an_attribute_a_timm_forward_reads_is_compared_as_built():
    """F9: timm's ``Attention.forward`` calls ``self.gate(x)`` when it is not None: a plain callable there (no
    Module, no parameter) was accepted (off by 2.65). Every plain attribute of a part must be one its class has,
    holding what a fresh ``Block`` built with the same parts holds (``as_built``)."""
    from splitformer.adapters import from_timm

    block = _timm_block()
    from_timm(block)  # control
    block.attn.gate = lambda x: torch.full_like(x, -3.0)
    with pytest.raises(SplitformerError, match=r"^Block\.attn\.gate is a function, but Attention is built with None") as error:
        from_timm(block)
    one_line(error)
    block = _timm_block()
    block.mlp.scale = 2.0
    with pytest.raises(SplitformerError, match=r"^Block\.mlp\.scale is an attribute Mlp does not have as built") as error:
        from_timm(block)
    one_line(error)


# --- a stack's layers carry the reading ----------------------------------------------------------------------------

def test_a_stacks_layers_refuse_a_call_that_would_not_compute_the_source(rng):
    """A tester's finding: ``adapted.layers`` of a stack were plain dicts, so ``forward_stack(u, adapted.layers)``
    without ``**forward_kwargs`` ran one head (30.5 off a trained-scale BERT), and a Stack of another head count or
    another scheme's module took them. Each layer now refuses as a block's ``Adapted`` does; control: the documented
    call, and a plain dict of the layer, which nothing refuses."""
    post_ln = import_path(GENERATED / "numpy" / "post_ln.py", "_refusals_numpy_post_ln")
    pre_ln = import_path(GENERATED / "numpy" / "pre_ln.py", "_refusals_numpy_pre_ln")
    encoder = torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False)
    randomize(encoder)
    adapted = from_torch(encoder)
    u = rng.standard_normal((2, 5, D))
    with torch.no_grad():
        expected = encoder(torch.from_numpy(u)).numpy()
    assert np.abs(post_ln.forward_stack(u, adapted.layers, **adapted.forward_kwargs) - expected).max() < 1e-12
    refusals = {  # a stack names the layer (the reviewer, s45: it said "params", an argument forward_stack lacks)
        "layers[0]: the source was read with n_heads=": lambda: post_ln.forward_stack(u, adapted.layers),
        "layers[0]: the source computes post-ln with relu; the module": lambda: pre_ln.forward_stack(
            u, adapted.layers, **adapted.forward_kwargs),
        "layers[0]: the source has n_heads=": lambda: POST_LN.Stack(2, D, 1, D_FF, dtype=torch.float64).load_params(
            adapted.layers),
        "params: the source was read with eps=": lambda: post_ln.forward(u, adapted.layers[1], n_heads=HEADS,
                                                                          eps=1e-3),
        "layers: the source is a stack of 2 layers: give forward_stack its .layers": lambda: post_ln.forward_stack(
            u, adapted, **adapted.forward_kwargs),
    }
    for message, call in refusals.items():
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            call()
    plain = [dict(layer) for layer in adapted.layers]
    assert np.abs(post_ln.forward_stack(u, plain) - expected).max() > 1e-3  # nothing refuses plain dicts


def test_a_reading_dropped_is_freed_without_the_cycle_collector():
    """A reviewer's finding (s42): each layer held its ``Adapted``, which held the layers, a cycle that kept a
    reading's weights alive until the collector ran. A layer holds the reading without its weights; control: the
    layer still refuses a call that would not compute it."""
    import gc
    import weakref

    encoder = torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False)
    adapted = from_torch(encoder)
    layer = adapted.layers[1]
    with pytest.raises(ValueError, match="^params: the source has n_heads="):
        POST_LN.Block(D, 1, D_FF, dtype=torch.float64).load_params(layer)
    weights = weakref.ref(adapted.layers[0])
    collecting = gc.isenabled()
    gc.disable()
    try:
        del adapted
        assert weights() is None
    finally:
        if collecting:
            gc.enable()
