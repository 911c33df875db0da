"""The as-built comparison (``adapters.as_built``) for timm's ViT (``Block``, ``VisionTransformer``, rebuilt by
``as_built_timm`` from its parameters and the attributes its readers read) and transformers' CvT (rebuilt from
``module.config``): an attribute set after construction is refused by name in one line. Each change in
``REFUSED`` made the source compute otherwise while the adapter, without the check, read it as built (float64,
random parameters); the controls are read and equal their sources."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers

import splitformer.codegen.adapters as adapters
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_timm

from test_adapters_timm import block
from test_cvt import CONFIGS, _cvt, _pixels, _torch_model
from test_hf_whole_models import TORCH_VIT, _pixels as _vit_pixels, timm_vit
from timm_import import import_timm


def _classifier():
    return _cvt(True, CONFIGS["2-stages"])


def _cvt_deviation(model):
    """The largest difference of the generated cvt's logits from the source's."""
    adapted, pixels = from_hf(model), _pixels()
    with torch.no_grad():
        return float((_torch_model(adapted, model, torch.float64).logits(pixels) - model(pixels).logits).abs().max())


def _vit_deviation(model):
    """The largest difference of the generated vit network's logits from the source's."""
    adapted, pixels = from_timm(model, network="vit"), _vit_pixels(model)
    with torch.no_grad():
        return float((adapted.build(TORCH_VIT).logits(pixels) - model(pixels)).abs().max())


_ATTENTION = "cvt.encoder.stages.1.layers.0.attention.attention"
_EMBEDDING = "cvt.encoder.stages.0.embedding.convolution_embeddings.projection"


def _convolution(projection):
    return f"{_ATTENTION}.convolution_projection_{projection}.convolution_projection.convolution"


#: (make, deviation, owner, changes (part, attribute, value), the first one named): each set after construction
#: made the source compute otherwise (the padded convolutions pad by reflection, replication or wrapping; the
#: key and value grids are sampled dilated; the score scale and width of the attention are another d's) while
#: the adapter read it as built; the unpadded patch convolution of a timm ViT pads through its reversed padding.
REFUSED = [
    (_classifier, _cvt_deviation, "CvtForImageClassification", ((_EMBEDDING, "padding_mode", "reflect"),)),
    (_classifier, _cvt_deviation, "CvtForImageClassification", ((_convolution("query"), "padding_mode", "replicate"),)),
    (_classifier, _cvt_deviation, "CvtForImageClassification", ((_convolution("key"), "padding_mode", "circular"),)),
    (_classifier, _cvt_deviation, "CvtForImageClassification", ((_convolution("value"), "padding_mode", "reflect"),)),
    (_classifier, _cvt_deviation, "CvtForImageClassification",
     ((_convolution("query"), "padding_mode", "reflect"), (_convolution("query"), "_reversed_padding_repeated_twice", [2, 0, 2, 0]))),
    (_classifier, _cvt_deviation, "CvtForImageClassification",
     ((_convolution("key"), "dilation", (2, 2)), (_convolution("value"), "dilation", (2, 2)))),
    (_classifier, _cvt_deviation, "CvtForImageClassification",
     ((_ATTENTION, "scale", 25 ** -0.5), (_ATTENTION, "embed_dim", 25))),
    (timm_vit, _vit_deviation, "VisionTransformer",
     (("patch_embed.proj", "padding_mode", "reflect"), ("patch_embed.proj", "_reversed_padding_repeated_twice", [1, 1, 1, 1]))),
    (timm_vit, _vit_deviation, "VisionTransformer",
     (("patch_embed.proj", "padding_mode", "circular"), ("patch_embed.proj", "_reversed_padding_repeated_twice", [3, 0, 3, 0]))),
    (timm_vit, _vit_deviation, "VisionTransformer",
     (("patch_embed.proj", "padding_mode", "replicate"), ("patch_embed.proj", "_reversed_padding_repeated_twice", [2, 0, 2, 0]))),
]
IDS = [f"{case[2]}.{case[3][0][0].replace('cvt.encoder.', '')}.{'+'.join(change[1] for change in case[3])}" for case in REFUSED]


def _change(module, changes):
    for part, attribute, value in changes:
        setattr(module.get_submodule(part), attribute, value)
    return module


@pytest.mark.parametrize("make, deviation, owner, changes", REFUSED, ids=IDS)
def test_an_attribute_changing_the_computation_is_refused_by_name(make, deviation, owner, changes):
    module = make()
    assert deviation(module) <= 1e-10  # control: as built, read and equal
    _change(module, changes)
    part, attribute, _ = changes[0]
    with pytest.raises(SplitformerError, match=rf"^{re.escape(f'{owner}.{part}.{attribute}')} is ") as error:
        deviation(module)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make, deviation, owner, changes", REFUSED, ids=IDS)
def test_before_the_check_each_was_read_as_built_and_differed(make, deviation, owner, changes, monkeypatch):
    monkeypatch.setattr(adapters, "check_as_built", lambda *args, **kwargs: None)
    assert deviation(_change(make(), changes)) > 1e-5


#: Attributes set after construction that the readers refused already (their messages first) or that the check
#: refuses now though the source computed as before (a record contradicting the modules): all refused.
ALSO_REFUSED = [
    (_classifier, "CvtForImageClassification: stage 1 config has stride_kv", (_convolution("key"), "stride", (1, 1))),
    (_classifier, "CvtForImageClassification: stage 1 config has cls", (_ATTENTION, "with_cls_token", False)),
    (_classifier, r"CvtForImageClassification: LayerNorm and BatchNorm eps differ",
     (f"{_ATTENTION}.convolution_projection_key.convolution_projection.normalization", "eps", 0.1)),
    (_classifier, r"CvtForImageClassification\.cvt\.encoder\.stages\.1\.stage is 0, but CvtStage is built with 1",
     ("cvt.encoder.stages.1", "stage", 0)),
    (_classifier, r"CvtForImageClassification\.layernorm\.normalized_shape is \(4,\)", ("layernorm", "normalized_shape", (4,))),
    (timm_vit, "timm Block scales scores by 0.3", ("blocks.0.attn", "scale", 0.3)),
    (timm_vit, "VisionTransformer final norm has eps=0.1", ("norm", "eps", 0.1)),
    (timm_vit, r"VisionTransformer has pooling global_pool='avg'", ("", "global_pool", "avg")),
    (timm_vit, r"VisionTransformer has resampled positions \(dynamic_img_size=True\)", ("", "dynamic_img_size", True)),
    (timm_vit, r"VisionTransformer\.num_prefix_tokens is 0, but VisionTransformer is built with 1", ("", "num_prefix_tokens", 0)),
    (timm_vit, r"VisionTransformer\.has_class_token is False", ("", "has_class_token", False)),
    (timm_vit, r"VisionTransformer\.patch_embed\.strict_img_size is False", ("patch_embed", "strict_img_size", False)),
    (timm_vit, r"VisionTransformer\.blocks\.1\.attn\.gate is .*, but Attention is built with None",
     ("blocks.1.attn", "gate", lambda x: torch.full_like(x, -3.0))),
    (timm_vit, r"VisionTransformer\.blocks\.0\.mlp\.scale is an attribute Mlp does not have as built", ("blocks.0.mlp", "scale", 2.0)),
]


@pytest.mark.parametrize("make, message, change", ALSO_REFUSED, ids=[f"{c[2][0]}.{c[2][1]}" for c in ALSO_REFUSED])
def test_what_the_readers_refused_is_refused_and_a_contradicting_record_too(make, message, change):
    module = _change(make(), (change,))
    with pytest.raises(SplitformerError, match=f"^{message}") as error:
        (from_timm if make is timm_vit else from_hf)(module, **({"network": "vit"} if make is timm_vit else {}))
    assert "\n" not in str(error.value)


def test_a_switch_to_another_kernel_for_the_same_values_is_read(rng):
    """``IMMATERIAL``: timm's ``Attention.fused_attn`` (sdpa or the same softmax written out) and
    ``LayerNorm._fast_norm``, a CvT ``BatchNorm2d``'s momentum and ``track_running_stats`` (training only)."""
    model = timm_vit()
    model.blocks[0].attn.fused_attn = not model.blocks[0].attn.fused_attn
    model.norm._fast_norm = True
    assert _vit_deviation(model) <= 1e-10
    cvt = _classifier()
    for module in cvt.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum, module.track_running_stats = 0.5, False
    assert _cvt_deviation(cvt) <= 1e-10


def test_sources_as_built_are_read_and_equal(rng):
    """Controls: timm's Block and VisionTransformer (its blocks, its vit network), CvtModel and
    CvtForImageClassification of two and three stages, unmodified."""
    source = block()
    u = rng.standard_normal((2, 5, source.attn.qkv.weight.shape[1]))
    adapted = from_timm(source)
    with torch.no_grad():
        expected = source(torch.tensor(u)).numpy()
        generated = adapted.build(adapted.derivation().torch_module())(torch.tensor(u)).numpy()
    assert np.abs(generated - expected).max() <= 1e-10
    model = timm_vit()
    assert from_timm(model).stack and _vit_deviation(model) <= 1e-10
    for config in CONFIGS.values():
        assert _cvt_deviation(_cvt(True, config)) <= 1e-10
        cvt = _cvt(False, config)
        with torch.no_grad():
            expected = cvt(_pixels()).last_hidden_state
            hidden, _ = _torch_model(from_hf(cvt), cvt, torch.float64)(_pixels())
        assert (hidden - expected).abs().max() <= 1e-10


def test_models_as_timm_create_model_and_from_pretrained_make_them_are_read(tmp_path):
    """What ``timm.create_model`` records (``pretrained_cfg``, ``_traits``, ``_model_args``) and what
    ``from_pretrained`` adds to a CvT are known; the record is no constructor argument the check reads."""
    timm = import_timm("timm")
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=3, depth=2)
    model = model.double().eval()
    assert from_timm(model).stack and from_timm(model, network="vit").model == "vit"
    source = _classifier()
    source.save_pretrained(tmp_path)
    loaded = transformers.CvtForImageClassification.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert _cvt_deviation(loaded) <= 1e-10
    loaded.cvt.encoder.stages[0].embedding.convolution_embeddings.projection.padding_mode = "reflect"
    with pytest.raises(SplitformerError, match=r"^CvtForImageClassification\.cvt\.encoder\.stages\.0\..*padding_mode is 'reflect'"):
        from_hf(loaded)


def test_a_config_edited_so_that_no_model_can_be_built_is_refused_by_name():
    model = _classifier()
    model.config.embed_dim = [16, 25]  # 25 is not divisible by the 3 heads: CvtModel itself fails to build
    with pytest.raises(SplitformerError) as error:
        from_hf(model)
    assert "\n" not in str(error.value) and str(error.value).startswith("CvtForImageClassification")


def test_the_check_leaves_the_sources_and_the_random_state_as_they_were():
    for make in (timm_vit, _classifier):
        model = make()
        attributes, state = repr([vars(part) for part in model.modules()]), torch.get_rng_state()
        adapters.check_as_built(type(model).__name__, model)
        assert repr([vars(part) for part in model.modules()]) == attributes and torch.equal(torch.get_rng_state(), state)
