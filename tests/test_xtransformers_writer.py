"""``to_xtransformers``: a generated Stack's (or an Adapted's) parameters written into x-transformers.

Round trips: module A read by ``from_xtransformers``, built into a generated torch Stack, written into
module B of the same flags and other random weights: B computes what A computes (float64, ≤ 1e-12) and
holds A's parameters. A Stack with other parameters written into B: B computes what the Stack does.
What x-transformers' layout cannot hold is refused by name.
"""

import pytest
import torch

from splitformer.adapters import from_xtransformers, to_torch, to_xtransformers
from splitformer.symbolic.errors import SplitformerError

from test_xtransformers import DIM, _derived, _module, _rotary

import x_transformers  # a test dependency: a broken install fails, never skips

#: One flag of each kind of map the reader applies (transpose, unit offset, ½-steps, one tied gain,
#: GLU halves, tied layers, repeated kv heads, permuted rotary pairs, qk-norm gains, ALiBi, padded heads,
#: LayerScale steps, branch norms, causal).
FLAGS = {
    "pre-norm": {}, "macaron": {"macaron": True}, "use_scalenorm": {"use_scalenorm": True},
    "SwiGLU": {"ff_glu": True, "ff_swish": True}, "weight_tie_layers": {"weight_tie_layers": True},
    "attn_kv_heads": {"attn_kv_heads": 1}, "rotary": {"rotary_pos_emb": True, "rotary_emb_dim": DIM // 2},
    "attn_qk_norm": {"attn_qk_norm": True}, "alibi": {"alibi_pos_bias": True},
    "use_layerscale": {"use_layerscale": True}, "sandwich_norm": {"sandwich_norm": True},
    "post-norm": {"pre_norm": False}, "SwiGLU without bias": {"ff_glu": True, "ff_swish": True, "ff_no_bias": True},
}


def _pair(cls=x_transformers.Encoder, **flags):
    if flags.get("rotary_pos_emb"):  # its inverse frequencies in float64
        return _rotary(cls, 2, 0), _rotary(cls, 2, 1)
    return _module(cls, 2, 0, **flags), _module(cls, 2, 1, **flags)


@pytest.mark.parametrize("flag", FLAGS)
def test_round_trip_through_a_generated_stack_equals_the_original_module(flag):
    source, target = _pair(**FLAGS[flag])
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    target.load_state_dict(to_xtransformers(stack, target), strict=True)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert (source(u) - target(u)).abs().max() <= 1e-12
    for key, value in source.state_dict().items():
        if value.is_floating_point():
            assert (value - target.state_dict()[key]).abs().max() <= 1e-15, key


def test_a_changed_stack_is_what_x_transformers_computes():
    """Other parameters (a trained Stack's) written into a Decoder: it computes what the Stack computes."""
    source, target = _pair(x_transformers.Decoder, use_rmsnorm=True, attn_kv_heads=1, ff_glu=True)
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    with torch.no_grad():  # move every parameter, keeping the copies of the shared key/value head equal
        layers = [{key: value * 1.1 + 0.05 for key, value in layer.items()} for layer in adapted.layers]
        stack.load_params(layers, {key: value * 0.9 for key, value in adapted.final_norm.items()})
    target.load_state_dict(to_xtransformers(stack, target), strict=True)
    u = torch.randn(2, 6, DIM, dtype=torch.float64)
    with torch.no_grad():
        expected = stack(u)
        assert (target(u) - expected).abs().max() <= 1e-12
        assert (source(u) - expected).abs().max() > 1e-3  # control: the original weights compute something else


def test_a_wrapper_keeps_its_embeddings_and_logits():
    wrapper = x_transformers.TransformerWrapper(num_tokens=11, max_seq_len=8, attn_layers=_module(depth=1)).double()
    adapted = from_xtransformers(wrapper)
    moved = adapted.with_params([{key: value + 0.1 for key, value in adapted.layers[0].items()}], adapted.final_norm)
    state = to_xtransformers(moved, wrapper)
    assert torch.equal(state["token_emb.emb.weight"], wrapper.token_emb.emb.weight.detach())
    assert not torch.equal(state["attn_layers.layers.0.1.to_q.weight"], wrapper.attn_layers.layers[0][1].to_q.weight)


def _moved(adapted, key, change, final=None):
    layers = [dict(layer) for layer in adapted.layers]
    layers[0][key] = change(layers[0][key].copy())
    return adapted.with_params(layers, final or adapted.final_norm)


def _set(array, index, value):
    array[index] = value
    return array


@pytest.mark.parametrize(("flags", "key", "change", "message"), [
    ({"attn_kv_heads": 1}, "attn.W_k", lambda w: _set(w, (0, DIM - 1), 5.0), "shared key/value head"),
    ({"use_scalenorm": True}, "norm1.gain", lambda g: _set(g, 3, 5.0), "ScaleNorm's one gain"),
    ({"use_simple_rmsnorm": True}, "norm1.gain", lambda g: g * 2, "fixes it at 1"),
    ({"alibi_pos_bias": True}, "attn.slopes", lambda s: s + 1, "a buffer"),
    ({"weight_tie_layers": True}, "attn.W_q", lambda w: w + 1, "tied"),
])
def test_what_the_layout_cannot_hold_is_refused_by_name(flags, key, change, message):
    source = _module(**flags)
    with pytest.raises(SplitformerError, match=rf"layer \d: {key}.*{message}"):
        to_xtransformers(_moved(from_xtransformers(source), key, change), source)


def test_a_final_layer_norm_bias_and_other_flags_are_refused():
    source = _module()
    adapted = from_xtransformers(source)
    final = {"gain": adapted.final_norm["gain"], "bias": adapted.final_norm["bias"] + 1}
    with pytest.raises(SplitformerError, match="final_norm: bias.*fixes it at 0"):
        to_xtransformers(adapted.with_params(list(adapted.layers), final), source)
    with pytest.raises(SplitformerError, match=r"to_xtransformers\(params, module\)"):
        to_torch(adapted)
    with pytest.raises(SplitformerError, match="read from a module with other flags"):
        to_xtransformers(adapted, _module(use_rmsnorm=True))
    # the two schemes' names were the same here, and the message named nothing else (a tester): it names the lines
    with pytest.raises(SplitformerError, match=r"\(scheme 'xt-pre-layer-norm-gelu', the module's 'xt-pre-layer-norm-gelu'\): "
                                               r"scheme file lines \(- the Adapted's, \+ the module's\): "
                                               r"-final_norm = true \| \+final_norm = false$"):
        to_xtransformers(adapted, _module(pre_norm_has_final_norm=False))
    rotary = from_xtransformers(_module(rotary_pos_emb=True, rotary_emb_dim=4))
    with pytest.raises(SplitformerError, match=r"other flags .*: options rope_theta 10000.0 against 40000.0$"):
        to_xtransformers(rotary, _module(rotary_pos_emb=True, rotary_emb_dim=4, rotary_base_rescale_factor=2.0))
    other = from_xtransformers(_module(macaron=True))
    stack = other.build(_derived(other).torch_module(), dtype=torch.float64)
    with pytest.raises(SplitformerError, match="the Stack"):
        to_xtransformers(stack, source)
    with pytest.raises(SplitformerError, match="no xtransformers adapter for Linear"):
        to_xtransformers(stack, torch.nn.Linear(2, 2))


@pytest.mark.parametrize("target, message", [
    ({"depth": 3}, "2 parameter mappings for a source of 3 layers"), ({"depth": 1}, "for a source of 1 layers"),
    ({"ff_mult": 2}, r"layer 0: ffn.W_1 has shape \(16, 64\), expected \(16, 32\)"),
    ({"heads": 4, "attn_dim_head": DIM // 4}, "read from a module of 2 heads, the module has 4"),
])
def test_an_adapted_of_another_depth_width_or_head_count_is_refused_by_name(target, message):
    """An Adapted's layers were not checked against the module's as a Stack's are (a new user's raw IndexError
    from deep in the writer); the same depth and widths are the control."""
    adapted = from_xtransformers(_module(depth=2))
    assert DIM == 16 and adapted.n_heads == 2
    flags = {"depth": 2} | target
    with pytest.raises(SplitformerError, match=f"^[^\\n]*{message}"):
        to_xtransformers(adapted, x_transformers.Encoder(dim=DIM, heads=flags.pop("heads", 2), attn_flash=True,
                                                         attn_dim_head=flags.pop("attn_dim_head", DIM // 2), **flags))
    state = to_xtransformers(adapted, x_transformers.Encoder(dim=DIM, depth=2, heads=2, attn_dim_head=DIM // 2,
                                                             attn_flash=True))
    assert len(state) > 0


_LAYERS = ("layers.0", "layers.1")
#: What build leaves out of training, by flag: what x-transformers holds fixed.
_FROZEN = {
    "pre-norm": ("final_norm.bias",), "rotary": ("final_norm.bias",), "attn_kv_heads": ("final_norm.bias",),
    "attn_qk_norm": tuple(f"{layer}.attn.{part}_gain" for layer in _LAYERS for part in "kq") + ("final_norm.bias",),
    "use_simple_rmsnorm": tuple(f"{layer}.{norm}.gain" for layer in _LAYERS for norm in ("norm1", "norm2"))
    + ("final_norm.gain",),
}


@pytest.mark.parametrize("flag", list(_FROZEN))
def test_a_trained_stack_is_written_back_where_the_layout_holds_what_training_changed(flag):
    """``build`` leaves what x-transformers holds fixed (the final LayerNorm's bias, which it does not have, unit
    qk-norm and SimpleRMSNorm gains) out of training: three SGD steps on the built Stack write back into a fresh
    module that then computes what the Stack does. Controls: those entries trained too are refused by name; a shared
    key/value head, which a free step unties, is refused by name."""
    flags = FLAGS.get(flag, {flag: True})
    source, target = _pair(x_transformers.Decoder, **flags)
    adapted = from_xtransformers(source)
    assert adapted.frozen == _FROZEN[flag]

    def trained(everything):
        stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
        assert {name for name, p in stack.named_parameters() if not p.requires_grad} == set(adapted.frozen)
        for name in adapted.frozen:
            stack.get_parameter(name).requires_grad_(everything)
        optimizer = torch.optim.SGD([p for p in stack.parameters() if p.requires_grad], lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            stack(torch.randn(2, 5, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(step)),
                  ).pow(2).mean().backward()
            optimizer.step()
        return stack

    if flag == "attn_kv_heads":
        with pytest.raises(SplitformerError, match="^layer 0: attn.W_k.*a shared key/value head"):
            to_xtransformers(trained(False), target)
        return
    stack = trained(False)
    target.load_state_dict(to_xtransformers(stack, target), strict=True)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert float((target(u) - stack(u)).abs().max()) < 1e-12
    with pytest.raises(SplitformerError, match="cannot be written: x-transformers' layout fixes it at"):
        to_xtransformers(trained(True), target)


def _edit_layer(stack, edit):
    layer = stack.layers[1]
    if edit == "n_heads":
        layer.n_heads = 4
    elif edit == "eps":
        layer.eps = 0.5
    elif edit == "hook":
        layer.register_forward_hook(lambda module, inputs, output: output + 1)
    else:
        forward = layer.forward
        layer.forward = lambda *args, **kwargs: forward(*args, **kwargs) + 1


@pytest.mark.parametrize("edit, message", [
    ("n_heads", r"n_heads=2, the Stack layers\[1\] n_heads=4"), ("eps", r"eps=1e-05, the Stack layers\[1\] eps=0.5"),
    ("hook", r"the Stack\.layers\.1 has a forward hook"), ("forward", r"the Stack\.layers\.1 has its forward replaced"),
])
def test_every_layer_of_the_stack_written_from_is_checked(edit, message):
    """attack5 02: ``check_computes`` compares every layer's configuration, not layers[0]'s, and refuses hooks
    and instance methods on the generated Stack itself (what it computes is then not what is written)."""
    source, target = _pair()
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    to_xtransformers(stack, target)  # control
    _edit_layer(stack, edit)
    with pytest.raises(SplitformerError, match=message):
        to_xtransformers(stack, target)


def test_a_non_floating_dtype_is_refused():
    """attack5 08: an integer state dict would truncate every weight (load_state_dict casts it back silently)."""
    source, target = _pair()
    with pytest.raises(SplitformerError, match=r"dtype=torch\.int64 is refused"):
        to_xtransformers(from_xtransformers(source), target, dtype=torch.int64)
    assert to_xtransformers(from_xtransformers(source), target, dtype=torch.float32)["final_norm.gamma"].dtype == torch.float32


def test_a_stack_whose_final_norm_was_switched_off_is_refused():
    """Sixth attacker, 06: ``has_final_norm = False`` set on a built Stack skips its final norm; writing it
    into a module that applies one would differ (by 9.35 in the attack), so the flag is compared."""
    source, target = _pair()
    adapted = from_xtransformers(source)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    to_xtransformers(stack, target)  # control
    stack.has_final_norm = False
    with pytest.raises(SplitformerError, match="has_final_norm=False"):
        to_xtransformers(stack, target)


def test_every_flag_gives_its_own_scheme_name():
    """A tester's finding: ``use_layerscale`` was named as the default block (``xt-pre-layer-norm-gelu``), so the two
    could not be studied or compared side by side ("a scheme is given twice")."""
    adapted = {flag: from_xtransformers(_module(x_transformers.Encoder, 2, 0, **flags)) for flag, flags in FLAGS.items()}
    files = {}  # one name per scheme computed (tied layers and shared key/value heads are the Stack's, not the scheme's)
    for flag, source in adapted.items():
        files.setdefault(source.scheme, set()).add(source.scheme_file.split("\n", 2)[2])  # its name and summary aside
    assert all(len(texts) == 1 for texts in files.values()), files
    assert "layerscale" in adapted["use_layerscale"].scheme and "layerscale" not in adapted["pre-norm"].scheme


def test_names_cut_at_64_characters_stay_apart():
    """A reviewer's finding: names cut at 64 characters collided (33 of 355 flag sets), so two blocks could not be
    studied or compared side by side: with and without ALiBi below were both ``xt-macaron-post-layerscale-rms-norm-
    gelu-no-bias-causal-qk-norm`` (the control: the old cut gives that for both). The cut ends in a digest of the whole."""
    flags = dict(dim=16, depth=1, heads=2, attn_dim_head=8, attn_flash=True, macaron=True, use_layerscale=True,
                 use_rmsnorm=True, pre_norm=False, attn_qk_norm=True, ff_no_bias=True)
    plain, alibi = (from_xtransformers(x_transformers.Decoder(**flags, **extra)).scheme
                    for extra in ({}, {"alibi_pos_bias": True}))
    assert plain == "xt-macaron-post-layerscale-rms-norm-gelu-no-bias-causal-qk-norm"  # 63 characters: kept whole
    assert len(alibi) == 64 and alibi.startswith("xt-macaron-post-layerscale-rms-norm-gelu-no-bias-causal-") \
        and alibi != plain
    assert (plain + "-alibi")[:64].rstrip("-") == plain  # the old cut: one name for the two


@pytest.mark.parametrize("depth", [{"depth": 2}, {}], ids=["depth given", "depth left to x-transformers"])
def test_custom_layers_that_spell_the_default_layout_are_read(depth):
    """A tester's finding: ``custom_layers=("a", "f", "a", "f")``, the default layout of depth 2, was refused as a
    custom layout. It is read now, equal to the default module's scheme and outputs; another layout (control) is
    still refused. Without ``depth`` (x-transformers' own usage: it sets depth to the layers' count, 4) it was still
    refused (a tester, s43)."""
    torch.manual_seed(0)
    default = x_transformers.Encoder(dim=16, depth=2, heads=2, attn_dim_head=8, attn_flash=True).double()
    spelled = x_transformers.Encoder(dim=16, heads=2, attn_dim_head=8, attn_flash=True,
                                     custom_layers=("a", "f", "a", "f"), **depth).double()
    spelled.load_state_dict(default.state_dict())
    adapted = from_xtransformers(spelled)
    assert adapted.scheme_file == from_xtransformers(default).scheme_file
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (stack(u) - spelled(u)).abs().max() <= 1e-12
    with pytest.raises(SplitformerError, match="custom_layers"):
        from_xtransformers(x_transformers.Encoder(dim=16, depth=2, heads=2, attn_dim_head=8, attn_flash=True,
                                                  custom_layers=("a", "a", "f", "f")))


def test_a_source_without_any_bias_builds_a_bias_free_stack_that_trains_and_writes_back():
    """A reviewer's finding (s42): with ``ff_no_bias`` nothing of x-transformers has a bias, but the reading said
    ``bias=True``: ``Stack(bias=False).load_params(adapted.layers)`` was refused and ``build`` gave a final-norm bias
    that x-transformers cannot hold. Read as ``bias=False``: built without one, trained, written back; control: the
    default feed-forward keeps its biases and the reading's ``bias=True``."""
    source, target = _pair(x_transformers.Decoder, ff_no_bias=True)
    adapted = from_xtransformers(source)
    assert adapted.bias is False and from_xtransformers(_pair(x_transformers.Decoder)[0]).bias is True
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    assert not any(name.endswith("bias") or ".b_" in name for name, _ in stack.named_parameters())
    optimizer = torch.optim.SGD(stack.parameters(), lr=0.1)
    stack(torch.randn(2, 5, DIM, dtype=torch.float64)).pow(2).mean().backward()
    optimizer.step()
    target.load_state_dict(to_xtransformers(stack, target), strict=True)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert (stack(u) - target(u)).abs().max() <= 1e-12


def test_plain_layers_are_written_with_their_final_norm_and_checked_against_the_modules_flags():
    """A fuzzer's findings (s45): layer mappings (trained with NumPy's ``vjp_stack``, say) could not be written into
    a module with a final norm (``to_xtransformers`` had no ``final_norm``; its message pointed at ``to_torch``), and
    layers read from a pre-norm module were written into a post-norm one without a word."""
    source, target = _pair()
    adapted = from_xtransformers(source)
    layers = [dict(layer) for layer in adapted.layers]
    with pytest.raises(SplitformerError, match=r"pass its parameters, to_xtransformers\(layers, module, final_norm="):
        to_xtransformers(layers, target)
    target.load_state_dict(to_xtransformers(layers, target, final_norm=adapted.final_norm), strict=True)
    u = torch.randn(2, 5, DIM, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(target(u), source(u), rtol=0, atol=1e-12)
    post = _module(x_transformers.Encoder, 2, 1, pre_norm=False)
    with pytest.raises(SplitformerError, match=r"layers\[0\] was read from a module with other flags \(scheme "
                                               r"'xt-pre-.*', the target's 'xt-post-"):
        to_xtransformers(list(adapted.layers), post)
    with pytest.raises(SplitformerError, match="final_norm goes with plain parameters; an Adapted holds its own"):
        to_xtransformers(adapted, target, final_norm=adapted.final_norm)


@pytest.mark.parametrize("dim_head", [6, 8])
def test_an_unchanged_float32_qk_norm_reading_is_written_back(dim_head):
    """A fuzzer's finding (s45): a float32 module with ``attn_qk_norm`` could not be written back unchanged where
    10·√d_head is no float32 value (d_head 6, 8): its fixed gain, read rounded, was compared with the exact offset to
    1e-10. Compared to the parameters' own rounding now; control: a gain changed by 1e-3 is still refused."""
    torch.manual_seed(0)
    module = x_transformers.Encoder(dim=4 * dim_head, depth=1, heads=4, attn_dim_head=dim_head, attn_qk_norm=True,
                                    attn_flash=True).eval()
    adapted = from_xtransformers(module)
    assert adapted.layers[0]["attn.q_gain"].dtype.name == "float32"
    state = to_xtransformers(adapted, module)
    for key, value in module.state_dict().items():
        assert torch.equal(state[key], value), key
    changed = [dict(layer) for layer in adapted.layers]
    changed[0]["attn.q_gain"] = changed[0]["attn.q_gain"] * (1 + 1e-5)
    with pytest.raises(SplitformerError, match=r"attn.q_gain\[0\] = .* cannot be written: x-transformers' layout "
                                               r"fixes it at"):
        to_xtransformers(changed, module, final_norm=adapted.final_norm)


def test_a_float32_change_of_one_copy_of_a_shared_head_is_refused_beside_qk_norm():
    """The reviewer's finding (s45): one tolerance from float32's epsilon times the largest entry (qk-norm's fixed 80)
    let a change of 3e-5 to one of two query heads' copies of a shared key head be written back and lost. Only a
    fixed entry may differ by its own rounding; copies of one entry must agree to 1e-10 (control: unchanged,
    written)."""
    torch.manual_seed(0)
    module = x_transformers.Encoder(dim=32, depth=1, heads=4, attn_kv_heads=2, attn_qk_norm=True,
                                    attn_flash=True).eval()
    adapted = from_xtransformers(module)
    to_xtransformers(adapted, module)
    for delta in (3e-7, 3e-5):
        changed = [dict(layer) for layer in adapted.layers]
        kernel = changed[0]["attn.W_k"].copy()
        kernel[0, -1] += delta  # the last query head's copy of its key/value head
        changed[0]["attn.W_k"] = kernel
        with pytest.raises(SplitformerError, match="holds it in one entry with another canonical entry that differs"):
            to_xtransformers(changed, module, final_norm=adapted.final_norm)


def test_rotary_frequencies_rounded_to_float32_by_the_library_are_read():
    """A fuzzer's finding (s45): a rotary module whose float32 buffer holds θ = 500000's frequencies over 64-feature
    heads (Llama 3's base), or a base rescaled by ``rotary_base_rescale_factor``, was refused as computing "something
    its attributes do not say": the reader's probe compared the generated exact rotation with the buffer's float32
    rounding to 1e-8. Read now, θ exactly; the module with the exact frequencies equals the generated Stack."""
    torch.manual_seed(0)
    for module in (x_transformers.Decoder(dim=64, depth=1, heads=2, attn_dim_head=64, rotary_pos_emb=True,
                                          rotary_emb_dim=64, attn_flash=True),
                   x_transformers.Encoder(dim=128, depth=1, heads=2, attn_dim_head=64, rotary_pos_emb=True,
                                          rotary_emb_dim=64, rotary_base_rescale_factor=2.0, attn_flash=True)):
        if isinstance(module, x_transformers.Decoder):
            module.rotary_pos_emb.inv_freq = 1.0 / (500000 ** (torch.arange(0, 64, 2).float() / 64))
        module = module.double().eval()
        adapted = from_xtransformers(module)
        theta = adapted.options["rope_theta"]
        assert theta == 500000.0 or isinstance(module, x_transformers.Encoder)
        stack = adapted.build(adapted.derivation().torch_module(), dtype=torch.float64)
        module.rotary_pos_emb.inv_freq = theta ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
        u = torch.randn(2, 7, module.dim if hasattr(module, "dim") else 64, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(stack(u), module(u), rtol=0, atol=1e-10)


def test_swiglu_without_bias_holds_its_output_bias_at_zero():
    """A fuzzer's finding (s45): ``ff_glu`` with ``ff_no_bias`` was refused; x-transformers' GLU projection keeps its
    bias there while the output drops it. Read as the gated feed-forward with ``b_2 = 0`` held out of training (a
    note says so); a trained nonzero ``b_2`` cannot be written back and is refused by name."""
    source = _module(x_transformers.Encoder, 2, 0, ff_glu=True, ff_swish=True, ff_no_bias=True)
    adapted = from_xtransformers(source)
    assert "layers.0.ffn.b_2" in adapted.frozen and any("b_2 = 0" in note for note in adapted.notes)
    stack = adapted.build(_derived(adapted).torch_module(), dtype=torch.float64)
    assert not stack.layers[0].ffn.b_2.requires_grad
    changed = [dict(layer) for layer in adapted.layers]
    changed[1]["ffn.b_2"] = changed[1]["ffn.b_2"] + 0.1
    with pytest.raises(SplitformerError, match=r"layer 1: ffn.b_2\[0\] = 0.1 cannot be written: x-transformers' "
                                               r"layout fixes it at 0"):
        to_xtransformers(changed, source, final_norm=adapted.final_norm)
