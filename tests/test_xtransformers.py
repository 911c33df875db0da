"""``from_xtransformers``: x-transformers' ``Encoder``/``Decoder`` equal the generated NumPy and torch code.

Each mapped flag: x-transformers' module at depth 1 and 2, every parameter perturbed (no unit
gains, no zero biases), float64 through its ``scaled_dot_product_attention`` path
(``attn_flash=True``), read by ``from_xtransformers`` and run through the code generated from
the composed scheme file. Negative controls: the gain without x-transformers' unit offset, and
another layout's scheme, are far off. Unsupported flags are refused by name.
"""

import re

import numpy as np
import pytest
import torch

from splitformer.adapters import from_xtransformers
from splitformer.codegen.verification.runner import order_check
from splitformer.codegen.verification.statements.order import splitting_order
from splitformer.symbolic import parse_scheme
from splitformer.symbolic.errors import SplitformerError

import x_transformers  # a test dependency: a broken install fails, never skips

DIM, HEADS = 16, 2
#: flag → the keyword arguments of ``Encoder``/``Decoder`` that set it.
FLAGS = {
    "pre-norm": {}, "post-norm": {"pre_norm": False}, "macaron": {"macaron": True},
    "macaron-post-norm": {"macaron": True, "pre_norm": False}, "use_rmsnorm": {"use_rmsnorm": True},
    "use_simple_rmsnorm": {"use_simple_rmsnorm": True}, "use_scalenorm": {"use_scalenorm": True},
    "ff_glu (GEGLU)": {"ff_glu": True}, "ff_glu + ff_swish (SwiGLU)": {"ff_glu": True, "ff_swish": True},
    "ff_swish": {"ff_swish": True}, "ff_relu_squared": {"ff_relu_squared": True}, "ff_no_bias": {"ff_no_bias": True},
    "pre_and_post_norm": {"pre_and_post_norm": True}, "weight_tie_layers": {"weight_tie_layers": True},
    "ff_custom_activation (ReLU)": {"ff_custom_activation": torch.nn.ReLU()},
    "ff_custom_activation (tanh GELU) + ff_glu": {"ff_custom_activation": torch.nn.GELU(approximate="tanh"), "ff_glu": True},
    # a fuzzer's finding (s45): refused, though SwiGLU without bias is common; the GLU projection keeps its bias
    "ff_glu + ff_swish + ff_no_bias": {"ff_glu": True, "ff_swish": True, "ff_no_bias": True},
}
_DERIVED: dict[str, object] = {}


def _module(cls=x_transformers.Encoder, depth=2, seed=0, **flags):
    torch.manual_seed(seed)
    flags = {"attn_flash": True} | flags
    module = cls(dim=DIM, depth=depth, heads=HEADS, attn_dim_head=DIM // HEADS, **flags).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module.eval()


def _derived(adapted):
    """The derivation of an adapted scheme file, shared by the tests of one session."""
    if adapted.scheme_file not in _DERIVED:
        _DERIVED[adapted.scheme_file] = adapted.derivation()
    return _DERIVED[adapted.scheme_file]


def _numpy(adapted, u, layers=None):
    return _derived(adapted).numpy_module().forward_stack(u, list(layers or adapted.layers), **adapted.forward_kwargs)


#: Every flag on the Encoder; causal attention (the Decoder) on four layouts.
_LAYOUTS = [(flag, "Encoder") for flag in FLAGS] + [
    (flag, "Decoder") for flag in ("pre-norm", "use_rmsnorm", "ff_glu + ff_swish (SwiGLU)", "macaron")]


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("flag, cls", _LAYOUTS)
def test_every_mapped_flag_equals_numpy_and_torch(flag, cls, depth):
    source = _module(getattr(x_transformers, cls), depth, **FLAGS[flag])
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    assert len(adapted.layers) == depth and adapted.options.get("causal", False) == (cls == "Decoder")
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10


def test_decoder_kv_cache_decodes_token_by_token():
    """The generated Stack with its KV cache, one token at a time, equals x-transformers' full causal pass."""
    source = _module(x_transformers.Decoder, 2, ff_glu=True, ff_swish=True, use_rmsnorm=True)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    cache = [{} for _ in adapted.layers]
    with torch.no_grad():
        steps = [stack(u[:, i:i + 1], cache=cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    with torch.no_grad():  # negative control: without the cache each token sees only itself
        forgetful = np.concatenate([stack(u[:, i:i + 1]).numpy() for i in range(6)], axis=1)
    assert np.abs(forgetful - expected).max() > 1e-3


def test_wrapper_reads_its_attention_layers():
    torch.manual_seed(0)
    wrapper = x_transformers.TransformerWrapper(num_tokens=11, max_seq_len=8, attn_layers=_module(depth=1)).double()
    adapted = from_xtransformers(wrapper)
    assert adapted.source == ("xtransformers", "TransformerWrapper") and any("embeddings" in note for note in adapted.notes)
    assert adapted.scheme == from_xtransformers(wrapper.attn_layers).scheme


@pytest.mark.parametrize("extra", [{"num_memory_tokens": 3}, {"num_memory_tokens": 2, "memory_tokens_interspersed_every": 4}])
def test_a_wrapper_with_memory_tokens_is_refused_by_name(extra):
    """Memory tokens join every sequence the attention layers see (an attacker measured 0.868 on the
    real tokens when they were read as absent); the plain wrapper above is the control."""
    torch.manual_seed(0)
    wrapper = x_transformers.TransformerWrapper(num_tokens=11, max_seq_len=8, attn_layers=_module(depth=1), **extra)
    with pytest.raises(SplitformerError, match=r"^TransformerWrapper uses num_memory_tokens=\d+; [^\n]*$"):
        from_xtransformers(wrapper.double())


@pytest.mark.parametrize("extra, flag", [({"use_cls_token": True}, "use_cls_token=True"),
                                         ({"recycling": True}, "recycling=True"), ({"looped": True}, "looped=True"),
                                         ({"ff_deep_embed": True}, "ff_deep_embed=True")])
def test_a_wrapper_that_changes_what_its_layers_see_or_how_often_they_run_is_refused_by_name(extra, flag):
    """Class tokens join the sequence; recycling and looping run attn_layers more than once (a new user measured 2.0
    between a recycling wrapper and the stack read from it, when it was read); a deep embedding multiplies each
    feed-forward output by a learned vector of its token (read, it differed by 0.47 from the wrapper: a tester)."""
    torch.manual_seed(0)
    layers = _module(depth=1, pre_and_post_norm="looped" in extra)  # x-transformers loops only such layers
    wrapper = x_transformers.TransformerWrapper(num_tokens=11, max_seq_len=8, attn_layers=layers, **extra)
    with pytest.raises(SplitformerError, match=rf"^TransformerWrapper uses {flag}; [^\n]*$"):
        from_xtransformers(wrapper.double())


@pytest.mark.parametrize("cls", [x_transformers.Encoder, x_transformers.Decoder])
def test_one_head_of_the_models_width_has_no_output_projection(cls):
    """heads = 1 with attn_dim_head = dim: x-transformers' to_out is the identity (it was refused as 'an attention
    with parameter to_out'): read as W_o = I, left out of training by build; one head narrower than the model is
    refused by name (x-transformers' own forward cannot add its output to the residual)."""
    torch.manual_seed(0)
    source = cls(dim=DIM, depth=2, heads=1, attn_dim_head=DIM, attn_flash=True).double()
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    adapted = from_xtransformers(source.eval())
    assert adapted.n_heads == 1 and np.array_equal(adapted.layers[1]["attn.W_o"], np.eye(DIM))
    assert adapted.frozen == ("layers.0.attn.W_o", "layers.1.attn.W_o", "final_norm.bias")
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    assert not stack.layers[1].attn.W_o.requires_grad
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert float((stack(u) - source(u)).abs().max()) < 1e-12
    assert np.abs(_numpy(adapted, u.numpy(), adapted.layers) - source(u).detach().numpy()).max() < 1e-12
    with pytest.raises(SplitformerError, match="^Encoder uses an attention without to_out whose 8 output features"):
        from_xtransformers(x_transformers.Encoder(dim=DIM, depth=1, heads=1, attn_dim_head=DIM // 2, attn_flash=True))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_heads_joined_without_an_output_projection_are_read(kv_heads):
    """attn_project_out=False: the heads' outputs, joined, are the output (W_o = I), grouped key/value heads too (the
    review found these refused, the value projection's width taken for the output's)."""
    source = _module(depth=1, attn_project_out=False, attn_kv_heads=kv_heads)
    adapted = from_xtransformers(source)
    assert adapted.frozen == ("layers.0.attn.W_o", "final_norm.bias")
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert (adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)(u) - source(u)).abs().max() < 1e-12


@pytest.mark.parametrize("flags, message", [
    ({"shift_tokens": (1, 0)}, r"2 layers built for 4 layer types; a per-layer option shorter .*shift_tokens"),
    ({"depth": 1, "layers_execute_order": (1, 0)}, r"layer types fa in layers_execute_order=\(1, 0\); a stack"),
])
def test_layers_built_or_run_otherwise_than_their_types_are_refused_naming_the_flag(flags, message):
    """A shift_tokens tuple shorter than the layers (x-transformers zips it with the layer types and builds two of
    four) leaked an IndexError and 'cannot be read as the library builds it'; a reordered run named no flag. One
    entry per layer is read (the control)."""
    with pytest.raises(SplitformerError, match=f"^Decoder uses {message}"):
        from_xtransformers(_module(x_transformers.Decoder, **flags))
    assert from_xtransformers(_module(x_transformers.Decoder, shift_tokens=(1, 0, 1, 0))).stack


def test_unit_offset_and_layout_are_what_make_it_equal():
    """Negative controls: the gains without the unit offset, and the post-norm scheme on pre-norm weights."""
    source = _module(depth=2)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    no_offset = [{k: v - 1 if k.endswith("gain") else v for k, v in layer.items()} for layer in adapted.layers]
    assert np.abs(_numpy(adapted, u.numpy(), no_offset) - expected).max() > 1e-3
    post = from_xtransformers(_module(depth=2, pre_norm=False))
    assert set(post.layers[0]) == set(adapted.layers[0])
    plain = [dict(layer) for layer in adapted.layers]  # not the pre-norm reading, which post's module refuses
    assert np.abs(_numpy(post, u.numpy(), plain) - expected).max() > 1e-3


def test_composed_schemes_hold_their_orders_and_drop_layer_norm_biases():
    for flags in ({}, {"macaron": True}, {"pre_and_post_norm": True}, {"pre_norm": False}):
        adapted = from_xtransformers(_module(depth=1, **flags))
        scheme = parse_scheme(adapted.scheme_file)
        assert order_check(scheme, splitting_order(scheme)).holds, adapted.scheme
        assert not any(name.endswith("norm1.bias") for name in adapted.layers[0])
    wrong = parse_scheme(adapted.scheme_file.replace("splitting_order = 1", "splitting_order = 2"))
    assert not order_check(wrong, splitting_order(wrong)).holds


@pytest.mark.parametrize(("flags", "named"), [
    ({"sandwich_norm": True, "use_layerscale": True}, "sandwich_norm with macaron or use_layerscale"),
    ({"gate_residual": True, "macaron": True}, "gate_residual with use_layerscale or macaron"), ({"attn_qk_norm": True, "attn_qk_norm_groups": 2}, "attn_qk_norm_groups"),
    ({"dynamic_pos_bias": True, "attn_flash": False}, "dynamic_pos_bias"),
    ({"rotary_pos_emb": True, "rotary_emb_dim": DIM // HEADS, "rotary_interpolation_factor": 2.0},
     "rotary_interpolation_factor"),
    ({"rotary_pos_emb": True, "rotary_emb_dim": DIM // HEADS, "attn_qk_norm": True}, "rotary_pos_emb with qk_norm"),
    ({"attn_pre_scale_post_talking_heads": True, "attn_flash": False}, "attn_pre_scale_post_talking_heads"),
    ({"ff_solu": True}, "ff_solu"), ({"scale_residual": True}, "scale_residual"),
    ({"cross_attend": True}, "cross_attend"), ({"use_dynamic_tanh": True}, "use_dynamic_tanh"),
    ({"attn_sigmoid": True, "attn_flash": False}, "attn_sigmoid"), ({"attn_l2_distance": True, "attn_flash": False}, "attn_l2_distance"),
    ({"ff_custom_activation": torch.nn.LeakyReLU()}, r"^Encoder\.ff \(ff_custom_activation\) activation LeakyReLU\(.*\) has no "),
])
def test_unsupported_flags_are_refused_by_name(flags, named):
    with pytest.raises(SplitformerError, match=named) as error:
        from_xtransformers(_module(depth=1, **flags))
    assert "\n" not in str(error.value)


def _rotary(cls, depth, seed=0):
    """x-transformers' rotary of every feature pair (``rotary_emb_dim = dim_head``), its inverse
    frequencies in float64 (its buffer holds float32 ones)."""
    module = _module(cls, depth, seed, rotary_pos_emb=True, rotary_emb_dim=DIM // HEADS)
    rotary = module.rotary_pos_emb
    rotary.inv_freq = 10000.0 ** (-torch.arange(0, DIM // HEADS, 2, dtype=torch.float64) / (DIM // HEADS))
    return module


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("cls", ["Encoder", "Decoder"])
def test_interleaved_rotary_equals_numpy_and_torch(cls, depth):
    """x-transformers rotates interleaved pairs (2r, 2r + 1); the adapter permutes the query and key
    kernels into rotary-attention's pairs (r, r + d_head/2). Negative control: unpermuted kernels."""
    source = _rotary(getattr(x_transformers, cls), depth)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    assert adapted.options["rope_theta"] == 10000.0 and "rotary-attention" in adapted.scheme_file
    assert np.abs(_numpy(adapted, u.numpy()) - expected).max() <= 1e-10
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():
        assert np.abs(stack(u).numpy() - expected).max() <= 1e-10
    attention = [layer[1] for layer in source.layers if type(layer[1]).__name__ == "Attention"]
    unpermuted = [layer | {f"attn.W_{part}": getattr(attention[index], f"to_{part}").weight.detach().numpy().T
                           for part in "qk"} for index, layer in enumerate(adapted.layers)]
    assert np.abs(_numpy(adapted, u.numpy(), unpermuted) - expected).max() > 1e-3


def test_rotary_decoder_kv_cache_decodes_token_by_token():
    source = _rotary(x_transformers.Decoder, 2)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    cache = [{} for _ in adapted.layers]
    with torch.no_grad():
        steps = [stack(u[:, i:i + 1], cache=cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10


def test_a_flag_or_attribute_the_reader_does_not_know_is_refused_by_name():
    """An allowlist of the attributes each x-transformers module may have: a flag missing from the
    refusal lists (attn_orthog_projected_values_per_head) or a future one is refused, never read."""
    with pytest.raises(SplitformerError, match="uses attn_orthog_projected_values_per_head"):
        from_xtransformers(_module(depth=1, attn_orthog_projected_values_per_head=True))
    for path in ("", "layers.0.1", "layers.0.1.attend"):
        module = _module(depth=1)
        from_xtransformers(module)  # control
        part = module.get_submodule(path)
        part.future_flag = True
        with pytest.raises(SplitformerError, match=rf"has {type(part).__name__}\.future_flag=True, an attribute the "
                                                   "reader does not know") as error:
            from_xtransformers(module)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("cls, path, value", [
    (x_transformers.Decoder, "layers.0.1.attend", False), (x_transformers.Encoder, "layers.0.1.attend", True),
    (x_transformers.Decoder, "layers.0.1", False), (x_transformers.Encoder, "", True), (x_transformers.Decoder, "", False),
])
def test_the_causal_attributes_the_forward_reads_must_agree(cls, path, value):
    """attack5 05: causality is read from the ``causal`` attributes x-transformers' forward reads (the layers',
    each Attention's, each Attend's), not from the class; an edited one is refused by its path."""
    module = _module(cls, depth=1)
    assert from_xtransformers(module).scheme.endswith("-causal") == (cls is x_transformers.Decoder)  # control
    module.get_submodule(path).causal = value
    with pytest.raises(SplitformerError, match=rf"uses {re.escape(path + '.causal' if path else 'causal')}={value}"):
        from_xtransformers(module)


@pytest.mark.parametrize("flags, path, attribute, value, message", [
    ({"use_rmsnorm": True}, "final_norm", "scale", 8.0, "RMSNorm.scale=8.0"),
    ({"use_rmsnorm": True}, "layers.0.0.0", "scale", 2.0, "RMSNorm.scale=2.0"),
    ({"use_scalenorm": True}, "final_norm", "scale", 1.0, "ScaleNorm.scale=1.0"),
    ({"attn_qk_norm": True}, "layers.0.1", "qk_norm_q_scale", 2, "Attention.qk_norm_q_scale=2"),
    ({"attn_qk_norm": True}, "layers.0.1", "qk_norm_k_scale", 0.5, "Attention.qk_norm_k_scale=0.5"),
    ({"ff_glu": True}, "layers.1.1.ff.0", "mult_bias", 2.0, "GLU.mult_bias=2.0"),
])
def test_the_values_of_accepted_attributes_are_compared(flags, path, attribute, value, message):
    """attack5 06: factors the forward multiplies by (a norm's √d scale, qk-norm's and GLU's unit factors)
    edited after construction are refused by name, not dropped; as built they are read (control)."""
    module = _module(depth=1, **flags)
    from_xtransformers(module)  # control
    setattr(module.get_submodule(path), attribute, value)
    with pytest.raises(SplitformerError, match=re.escape(message)):
        from_xtransformers(module)


def test_builtin_macaron_pre_ln_is_x_transformers_macaron():
    """``macaron-pre-ln`` (with zero LayerNorm and attention biases) computes ``Encoder(macaron=True)``;
    the post-LN built-in ``macaron`` does not (negative control)."""
    from splitformer import derive

    source = _module(depth=2, macaron=True)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = source(u).numpy()
    adapted = from_xtransformers(source)

    def outputs(name):
        module = derive(name, activation="gelu").numpy_module()
        # the biases x-transformers does not have (LayerNorm's, attention's) are zero
        layers = [{key: params.get(key, np.zeros(DIM)) for key in module.PARAMETERS} for params in adapted.layers]
        final = {"gain": adapted.final_norm["gain"], "bias": np.zeros(DIM)} if module.FINAL_NORM_PARAMETERS else None
        return module.forward_stack(u.numpy(), layers, n_heads=HEADS, eps=adapted.eps, final_norm=final)

    assert np.abs(outputs("macaron-pre-ln") - expected).max() <= 1e-10
    assert np.abs(outputs("macaron") - expected).max() > 1e-3


def test_check_evaluator_reads_a_layer_norm_without_bias():
    """``check``'s hand evaluator of ``layer-norm`` (bias = false) equals the kind's continuous definitions;
    the same norm with a bias (0.5) does not (negative control)."""
    import mpmath

    from splitformer.codegen.verification.definitions import evaluate_definitions
    from splitformer.codegen.verification.scheme_checks import random_parameters
    from splitformer.codegen.verification.semantics import KNOWN_KINDS, MPMATH, Semantics, Sizes

    scheme_file = from_xtransformers(_module(depth=1)).scheme_file
    scheme = parse_scheme(scheme_file)
    sizes = Sizes(tokens=3, features=4, heads=2, hidden=5)
    with mpmath.workdps(40):
        params = {k: np.frompyfunc(mpmath.mpf, 1, 1)(v) for k, v in random_parameters(scheme, sizes, 3).items()}
        assert "norm1.bias" not in params
        u = np.frompyfunc(mpmath.mpf, 1, 1)(np.random.default_rng(4).standard_normal((3, 4)))
        semantics = Semantics(scheme, params, sizes, MPMATH, eps=mpmath.mpf("1e-5"))
        difference = KNOWN_KINDS["layer-norm"](semantics, "norm1", u) - evaluate_definitions(semantics, "norm1", u)
        assert max(abs(value) for value in difference.flat) < mpmath.mpf(10) ** -35
        text = scheme_file.replace(
            'norm1 = { kind = "layer-norm", bias = false }', 'norm1 = "layer-norm"')
        biased = parse_scheme(text)
        params["norm1.bias"] = np.frompyfunc(mpmath.mpf, 1, 1)(np.full(4, 0.5))
        biased_semantics = Semantics(biased, params, sizes, MPMATH, eps=mpmath.mpf("1e-5"))
        with_bias = KNOWN_KINDS["layer-norm"](biased_semantics, "norm1", u)
        assert 'norm1 = "layer-norm"' in text
        assert max(abs(value) for value in (with_bias - evaluate_definitions(semantics, "norm1", u)).flat) > 0.4


def test_relu_squared_is_stated_not_proximal():
    """``check`` verifies the claim that squared ReLU is not a proximal map (σ' = 2u > 1); claiming it is fails."""
    from splitformer.codegen.verification.statements.activations import PROXIMAL, activation_checks

    (check,) = [check for check in activation_checks() if check.id == "activation/relu-squared"]
    assert check.holds and "expansive" in check.detail
    (wrong,) = [check for check in activation_checks(PROXIMAL | {"relu-squared": True})
                if check.id == "activation/relu-squared"]
    assert not wrong.holds


def test_an_encoder_dropping_whole_layers_in_training_mode_is_refused():
    """Attack 16: ``layer_dropout`` (x-transformers' tuple ``layer_dropouts``) skips whole layers at random in training
    mode; it was read, the source 0.5–5.5 off per call. Refused naming it; control: after ``.eval()`` it is read and
    equal."""
    source = _module(layer_dropout=0.5).train()  # training mode, as constructed
    with pytest.raises(SplitformerError, match=r"^Encoder \(Encoder\) is in training mode with layer_dropouts=0\.5: "
                                               r".*call \.eval\(\) on the module"):
        from_xtransformers(source)
    adapted = from_xtransformers(source.eval())
    assert "the source's layer dropout (stochastic depth, p = 0.5) is not carried" in " ".join(adapted.notes)
    assert not any("layer dropout" in note for note in from_xtransformers(_module()).notes)  # control
    stack = adapted.build(adapted.derivation().torch_module(), dtype=torch.float64)
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert (stack(x) - source(x)).abs().max() <= 1e-10


def test_layers_that_differ_are_refused_naming_what_differs():
    """A tester (s43): ``shift_tokens`` with one value per layer was refused as "layers that differ in structure",
    naming neither the layer nor what differs in it."""
    with pytest.raises(SplitformerError, match=r"layers that differ in structure; .*layer 1's shift1 is .*'reach': 2.*, "
                                               r"layer 0's .*'reach': 1"):
        from_xtransformers(_module(depth=2, shift_tokens=(1, 0, 2, 0)))
