"""timm's ViT adapters read exactly ``timm.models.vision_transformer.Block`` with ``timm.layers.attention.Attention``
and ``timm.layers.mlp.Mlp`` (and that ``VisionTransformer`` and ``PatchEmbed``): timm's beit, nest, volo, pvt_v2,
sam and others define classes of the same names that compute otherwise. Before, the name check passed and the
reader raised a raw ``AttributeError`` (tenth attacker, T2); now one line names the class found and the one read.
The vit network names ``attn_pool`` when it is set (T3: the message read "global_pool='token' … 'token'").
Control: vision_transformer's Block adapts and equals its source within 1e-10 in float64."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from splitformer import SplitformerError
from splitformer.adapters import from_timm

from test_adapter_as_built import _generated
from test_adapters import randomize
from test_hf_whole_models import timm_vit
from timm_import import import_timm

vision_transformer = import_timm("timm.models.vision_transformer")


def _refused(module, message, **options):
    with pytest.raises(SplitformerError, match=message) as error:
        from_timm(module, **options)
    assert "\n" not in str(error.value)


def test_the_vision_transformer_block_is_read(rng):
    torch.manual_seed(0)
    block = randomize(vision_transformer.Block(8, 2, qkv_bias=True).double())
    u = rng.standard_normal((2, 5, 8))
    with torch.no_grad():
        expected = block(torch.tensor(u)).numpy()
    assert np.abs(_generated(from_timm(block), u) - expected).max() <= 1e-10


@pytest.mark.parametrize("module", ["beit", "vision_transformer_sam", "pvt_v2"])
def test_another_timm_block_is_refused_by_its_class(module):
    klass = import_timm(f"timm.models.{module}").Block
    torch.manual_seed(0)
    block = klass(dim=32, num_heads=4).double().eval()
    _refused(block, rf"^timm Block is timm\.models\.{module}\.Block, not timm\.models\.vision_transformer\.Block; "
                    "the adapter reads that class's computation only")


@pytest.mark.parametrize("module", ["beit", "nest", "volo", "pvt_v2", "vision_transformer_sam"])
def test_another_timm_attention_in_a_vision_transformer_block_is_refused_by_its_class(module):
    klass = import_timm(f"timm.models.{module}").Attention
    block = vision_transformer.Block(32, 4, qkv_bias=True).double().eval()
    block.attn = klass(32, num_heads=4, qkv_bias=True).double()
    _refused(block, rf"^timm Block\.attn is timm\.models\.{module}\.Attention, not timm\.layers\.attention\.Attention")


def test_another_timm_block_in_a_vision_transformer_is_refused_by_its_class():
    model = timm_vit()
    model.blocks[1] = import_timm("timm.models.beit").Block(dim=12, num_heads=3).double().eval()
    _refused(model, r"^VisionTransformer block 1 is timm\.models\.beit\.Block, not ")
    _refused(model, r"^VisionTransformer\.blocks\.1 is timm\.models\.beit\.Block, not ", network="vit")


def test_attention_pooling_is_named_by_the_vit_network():
    model = timm_vit()
    model.attn_pool = torch.nn.Identity()  # set while global_pool stays 'token'
    assert model.global_pool == "token"
    _refused(model, re.escape("VisionTransformer has attention pooling (attn_pool is Identity) where the network "
                              "reads the class token; the vit network does not compute it"), network="vit")
    for fc_norm in (False, None):  # None: timm puts the final norm after the pooling (tester s39 L8: "no final norm")
        _refused(timm_vit(global_pool="avg", fc_norm=fc_norm), re.escape(
            "pooling global_pool='avg' (the network reads the class token: global_pool='token')"), network="vit")
