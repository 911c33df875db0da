"""Adapters read the module's computation, not its class name: a layout, dropout, hook, overridden
method, bias tensor or configuration the generated module would not reproduce is carried or refused
by name, in one line; each refusal has a control the adapters accept."""

from __future__ import annotations

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
    layer.dropout1.p = 0.5  # differing probabilities: not carried, and said
    adapted = from_torch(layer)
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
