"""timm ViT adapters, against timm itself (imported without torchvision: ``timm_import``)."""

from __future__ import annotations

import functools

import pytest
import torch

from splitformer import SplitformerError
from splitformer.adapters import from_timm, to_torch

from test_adapters import D, HEADS, assert_same_state, modules, parity, randomize  # noqa: F401 (fixture)

from timm_import import import_timm

vision_transformer = import_timm("timm.models.vision_transformer")


def block(**options):
    settings = dict(mlp_ratio=1.5, qkv_bias=True) | options
    return randomize(vision_transformer.Block(D, HEADS, **settings).double())


def test_block_round_trips(modules, rng):
    source = block()
    adapted = from_timm(source)
    assert (adapted.scheme, adapted.activation, adapted.eps, adapted.bias) == ("pre-ln", "gelu", 1e-6, True)
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10
    assert_same_state(to_torch(adapted), source.state_dict())


def test_a_block_with_the_tanh_gelu_round_trips(modules, rng):
    """torch's ``GELU(approximate="tanh")`` is read as the scheme activation gelu-tanh (it was refused: a tester
    found x-transformers' message listing activations its reader then refused)."""
    source = block(act_layer=functools.partial(torch.nn.GELU, approximate="tanh"))
    adapted = from_timm(source)
    assert adapted.activation == "gelu-tanh"
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10
    exact = from_timm(block())  # control: the exact GELU's reading differs from this block by far more
    assert parity(modules, exact.with_params(adapted.params), source, rng.standard_normal((2, 5, D))) > 1e-6


def test_a_block_with_timms_own_gelu_class_round_trips(modules, rng):
    """timm's ``act_layer="gelu"`` builds ``timm.layers.activations.GELU``, which has no ``approximate``: read as the
    exact GELU (a reviewer: reading the tanh form raised AttributeError on it)."""
    activations = import_timm("timm.layers.activations")
    source = block(act_layer=activations.GELU)
    assert type(source.mlp.act).__module__ == "timm.layers.activations" and not hasattr(source.mlp.act, "approximate")
    adapted = from_timm(source)
    assert adapted.activation == "gelu"
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10


def test_vision_transformer_round_trips(modules):
    torch.manual_seed(0)
    model = vision_transformer.VisionTransformer(img_size=8, patch_size=4, embed_dim=D, depth=2, num_heads=HEADS,
                                                 mlp_ratio=1.5, num_classes=3)
    model = randomize(model.double())
    adapted = from_timm(model)
    assert adapted.stack and adapted.final_norm is not None and adapted.eps == 1e-6
    tokens = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: tokens.append(args[0]))
    with torch.no_grad():
        features = model.forward_features(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert parity(modules, adapted, lambda _: features, tokens[0].numpy()) <= 1e-10
    mapped = {k: v for k, v in model.state_dict().items() if k.startswith(("blocks.", "norm."))}
    assert_same_state(to_torch(adapted), mapped)


@pytest.mark.parametrize("options, message", [
    ({"qkv_bias": False}, "biases in some parts"),
    ({"init_values": 1e-5}, "LayerScale"),
    ({"qk_norm": True}, "q/k normalization"),
])
def test_refuses_block_options_no_scheme_implements(options, message):
    with pytest.raises(SplitformerError, match=message):
        from_timm(block(**options))


def _gated_attention(source):
    source.attn = randomize(type(source.attn)(D, num_heads=HEADS, qkv_bias=True, gated=True).double())


@pytest.mark.parametrize("change, message", [
    (_gated_attention, r"timm Block\.attn\.gate \(Linear\) is not a part the adapter maps"),
    (lambda source: source.attn.register_parameter("temperature", torch.nn.Parameter(torch.ones(1))),
     r"timm Block has the parameter attn\.temperature, which the adapter does not map"),
    (lambda source: setattr(source, "drop_path2", torch.nn.Tanh()), r"timm Block\.drop_path2 is Tanh, not Identity or DropPath"),
])
def test_a_part_the_adapter_does_not_map_is_refused_by_name(change, message):
    """An allowlist of each part and parameter: timm's own gated attention (a ``gate`` Linear its
    forward applies) or any unknown addition is refused, not read as plain pre-ln."""
    source = block()
    from_timm(source)  # control
    change(source)
    with pytest.raises(SplitformerError, match=message):
        from_timm(source)


def test_timms_own_tanh_gelu_class_is_read_as_gelu_tanh(modules, rng):
    """A tester's finding: timm's ``act_layer="gelu_tanh"`` builds ``timm.layers.activations.GELUTanh``,
    ``F.gelu(x, approximate="tanh")``, which was refused though torch's ``GELU(approximate="tanh")`` is read (timm's
    SigLIP ViTs use it). Read as gelu-tanh; control: the exact GELU's reading differs from it."""
    activations = import_timm("timm.layers.activations")
    source = block(act_layer=activations.GELUTanh)
    adapted = from_timm(source)
    assert adapted.activation == "gelu-tanh"
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10
    exact = from_timm(block())
    assert parity(modules, exact.with_params(adapted.params), source, rng.standard_normal((2, 5, D))) > 1e-6


def test_a_vision_transformer_given_another_patch_size_after_construction_is_read(modules):
    """A tester's finding: ``set_input_size(patch_size=8)`` leaves ``feature_info`` (forward_intermediates' record of
    strides, which no forward reads) as built for the old patch, and the as-built check refused the model over it.
    Read, and its features equal timm's; control: a changed attribute a forward reads is still refused."""
    torch.manual_seed(1)
    model = vision_transformer.VisionTransformer(img_size=16, patch_size=4, embed_dim=D, depth=1, num_heads=HEADS,
                                                 num_classes=3)
    model = randomize(model.double())
    model.set_input_size(patch_size=8)
    adapted = from_timm(model)
    tokens = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: tokens.append(args[0]))
    with torch.no_grad():
        features = model.forward_features(torch.randn(2, 3, 16, 16, dtype=torch.float64))
    assert parity(modules, adapted, lambda _: features, tokens[0].numpy()) <= 1e-10
    model.global_pool = "max"  # the readout the reading leaves out is refused as before
    with pytest.raises(SplitformerError):
        from_timm(model, network="vit")


def test_a_bias_free_vision_transformer_is_read_without_biases(modules):
    """A tester's finding: timm's ``qkv_bias=False, proj_bias=False`` with ``LayerNorm(bias=False)`` (no bias anywhere)
    was refused as a module not "as built": the rebuild dropped the norm's ``bias=False``. Read with ``bias=False``;
    its features equal timm's; control: a bias-free block under biased norms is still refused as a mix."""
    torch.manual_seed(2)
    bias_free = functools.partial(torch.nn.LayerNorm, bias=False)
    model = vision_transformer.VisionTransformer(img_size=8, patch_size=4, embed_dim=D, depth=2, num_heads=HEADS,
                                                 num_classes=3, qkv_bias=False, proj_bias=False, norm_layer=bias_free)
    model = randomize(model.double())
    adapted = from_timm(model)
    assert adapted.bias is False
    tokens = []
    hook = model.blocks[0].register_forward_pre_hook(lambda module, args: tokens.append(args[0]))
    with torch.no_grad():
        features = model.forward_features(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    hook.remove()
    assert parity(modules, adapted, lambda _: features, tokens[0].numpy()) <= 1e-10
    from test_hf_whole_models import TORCH_VIT  # the whole model as the generated vit network, its logits timm's
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (from_timm(model, network="vit").build(TORCH_VIT).logits(pixels) - model(pixels)).abs().max() <= 1e-10
    with pytest.raises(SplitformerError, match="biases in some parts and not in others"):
        from_timm(block(qkv_bias=False, proj_bias=False))


def test_a_stack_reading_given_to_the_vit_network_says_which_reading_it_takes():
    """A tester's finding: the vit network's module given ``from_timm(model)`` (the blocks' reading: ``network="vit"``
    forgotten) refused it as computing "None with None". The message names the whole model's reading."""
    import numpy as np
    import splitformer
    model = vision_transformer.VisionTransformer(img_size=8, patch_size=4, embed_dim=D, depth=1, num_heads=HEADS,
                                                 num_classes=3).double().eval()
    vit = splitformer.derive("vit").numpy_module()
    with pytest.raises(ValueError, match=r"^params: the source was read as a stack of pre-ln blocks \(with gelu\); "
                                         r"the module .* is a network's module, which takes a whole model's reading "
                                         r"\(from_timm\(model, network=\"vit\"\)"):
        vit.forward(np.zeros((1, 3, 8, 8)), from_timm(model), patch_size=4, n_heads=HEADS, eps=1e-6)


def test_refusals_name_the_class_the_reading_maps_and_whose_class_of_one_name():
    """A tester's findings: ``norm_layer="rmsnorm"`` was refused as if a part had been changed after construction
    (it is a construction choice), and torch's ``LayerNorm`` set in place of timm's was "LayerNorm, not the
    LayerNorm …" (both classes print one name). The first names the class the reading maps there, the second both
    classes' modules."""
    with pytest.raises(SplitformerError, match=r"^timm Block\.norm1 is RmsNorm, not LayerNorm, the class the reading "
                                               r"maps there$"):
        from_timm(vision_transformer.Block(D, HEADS, norm_layer=import_timm("timm.layers").RmsNorm))
    model = vision_transformer.VisionTransformer(img_size=8, patch_size=4, embed_dim=D, depth=1, num_heads=HEADS,
                                                 num_classes=3)
    model.norm = torch.nn.LayerNorm(D, eps=1e-6)
    with pytest.raises(SplitformerError, match=r"^VisionTransformer\.norm is torch\.nn\.modules\.normalization\."
                                               r"LayerNorm, not the timm\.layers\.norm\.LayerNorm VisionTransformer "
                                               r"builds there"):
        from_timm(model)
