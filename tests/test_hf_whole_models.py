"""Whole models read from their sources: timm's ``VisionTransformer`` into the generated ``vit``
network (``from_timm(model, network="vit")``) and transformers' ``BertModel`` into
``splitformer.nn.TextEncoder`` (``from_hf_encoder``), each against the source's own forward in
float64 (random weights, every bias nonzero), with negative controls and the refusals by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_timm

from conftest import GENERATED, import_path
from test_adapters import randomize
from timm_import import import_timm

vision_transformer = import_timm("timm.models.vision_transformer")
NUMPY_VIT = import_path(GENERATED / "numpy" / "vit.py")
TORCH_VIT = import_path(GENERATED / "torch" / "vit.py")


def timm_vit(**options):
    settings = dict(img_size=(16, 8), patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_ratio=1.5,
                    num_classes=5) | options
    torch.manual_seed(0)
    return randomize(vision_transformer.VisionTransformer(**settings).double())


def _pixels(model, batch=2):
    height, width = model.patch_embed.img_size
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("num_classes", [5, 0], ids=["head", "no-head"])
def test_timm_vision_transformer_equals_the_vit_network_both_backends(num_classes):
    model = timm_vit(num_classes=num_classes)
    pixels = _pixels(model)
    with torch.no_grad():
        features, output = model.forward_features(pixels), model(pixels)
    adapted = from_timm(model, network="vit")
    assert adapted.model == "vit" and adapted.config == {"patch_size": 4, "n_heads": 3, "eps": 1e-6,
                                                         "image_size": (16, 8)}
    generated = adapted.build(TORCH_VIT)
    with torch.no_grad():
        assert (generated(pixels) - features).abs().max() <= 1e-10
        if num_classes:
            assert (generated.logits(pixels) - output).abs().max() <= 1e-10
    assert np.abs(NUMPY_VIT.forward(pixels.numpy(), adapted.params, **adapted.config) - features.numpy()).max() <= 1e-10
    if num_classes:
        logits = NUMPY_VIT.logits(pixels.numpy(), adapted.params, **adapted.config)
        assert np.abs(logits - output.numpy()).max() <= 1e-10
    else:
        assert "head.W" not in adapted.params


def test_timm_negative_control_positions_read_in_another_order_differ():
    model = timm_vit()
    pixels = _pixels(model)
    adapted = from_timm(model, network="vit")
    params = dict(adapted.params)
    params["embed.pos"] = params["embed.pos"][::-1].copy()  # the class token's position read last
    with torch.no_grad():
        expected = model(pixels).numpy()
    assert np.abs(NUMPY_VIT.logits(pixels.numpy(), params, **adapted.config) - expected).max() > 1e-3


@pytest.mark.parametrize("options, message", [
    ({"class_token": False, "global_pool": "avg"}, "no class token"),
    ({"reg_tokens": 2}, "register tokens"),
    ({"no_embed_class": True}, "no_embed_class"),
    ({"pos_embed": "none"}, "no position embedding"),
    ({"dynamic_img_size": True}, "dynamic_img_size"),
    ({"pre_norm": True}, "pre_norm"),
    ({"global_pool": "avg"}, "no final norm"),
    ({"global_pool": "avg", "fc_norm": False}, "pooling global_pool='avg'"),
    ({"final_norm": False}, "no final norm"),
    ({"qk_norm": True}, "q/k normalization"),
    ({"init_values": 1e-5}, "LayerScale"),
    ({"act_layer": torch.nn.SiLU}, "exact GELU"),
])
def test_timm_options_the_vit_network_does_not_compute_are_refused_by_name(options, message):
    with pytest.raises(SplitformerError, match=message):
        from_timm(timm_vit(**options), network="vit")


def test_timm_a_hook_or_replaced_forward_is_refused_and_other_networks_too():
    model = timm_vit()
    handle = model.patch_embed.register_forward_hook(lambda module, args, out: out * 2)
    with pytest.raises(SplitformerError, match="patch_embed has a forward hook"):
        from_timm(model, network="vit")
    handle.remove()
    model.norm.forward = lambda x: x
    with pytest.raises(SplitformerError, match="norm has its forward replaced"):
        from_timm(model, network="vit")
    with pytest.raises(SplitformerError, match=r"no timm reader of VisionTransformer into the network 'cvt' "
                                               r"\(supported: VisionTransformer → vit\)"):
        from_timm(timm_vit(), network="cvt")
    with pytest.raises(SplitformerError, match="whole network 'vit': it can be expected to have n_heads and eps, not scheme"):
        from_timm(timm_vit(), network="vit", scheme="pre-ln")
    assert from_timm(timm_vit(), network="vit", eps=1e-6, n_heads=3).model == "vit"
    assert from_timm(timm_vit()).stack  # without network=: the blocks and final norm, as before


def test_hf_vit_takes_network_too_and_builds():
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=1, intermediate_size=20, num_labels=4)
    source = randomize(transformers.ViTForImageClassification(config).double())
    adapted = from_hf(source, network="vit")
    pixels = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (adapted.build(TORCH_VIT).logits(pixels) - source(pixels).logits).abs().max() <= 1e-10
    with pytest.raises(SplitformerError, match="not the generated vit torch module"):
        adapted.build(import_path(GENERATED / "torch" / "pre_ln.py"))
