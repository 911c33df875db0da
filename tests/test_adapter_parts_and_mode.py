"""The as-built comparison (``adapters.as_built``) of parts, tensors and training mode: every part of a source
must be the part its library class builds from its configuration, of the same library class, holding the same
parameters and buffers (an extra, a missing or a replaced one is refused by name, in one line), and no part may
be in a training mode whose forward differs from the evaluated one (a BatchNorm's batch statistics, a drop
rate above 0 the adapter does not carry). ``SILENT`` were read and differed before the check (float64, random
parameters); ``UNREADABLE`` raised a raw ``AttributeError`` in the CvT reader."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import splitformer.codegen.adapters as adapters
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_torch

from test_adapter_as_built_vision import _ATTENTION, _classifier, _cvt_deviation, _vit_deviation
from test_adapters import encoder_layer
from test_cvt import CONFIGS, NUMPY, _cvt, _pixels
from test_hf_whole_models import timm_vit

_LAYER = "cvt.encoder.stages.1.layers.0"
_QUERY = f"{_ATTENTION}.convolution_projection_query.convolution_projection"
_DOUBLE = {"dtype": torch.float64}


def _set(part, attribute, value):
    def change(model):
        setattr(model.get_submodule(part), attribute, value)
        return model
    return change


def _train(part):
    def change(model):
        model.get_submodule(part).train()
        return model
    return change


def _grouped(model):
    """The depth-wise query convolution replaced by a grouped one (8 groups of 3): the reader reads one column."""
    grouped = torch.nn.Conv2d(24, 24, 3, padding=1, groups=8, bias=False, **_DOUBLE)
    torch.nn.init.normal_(grouped.weight, 0, 0.3)
    return _set(_QUERY, "convolution", grouped)(model)


def _dropping_vit():
    return timm_vit(drop_rate=0.1).train()


_OWNER = "CvtForImageClassification"

#: (make, change, deviation, refusal): each read as built and differing before the check.
SILENT = [
    (_classifier, _set(f"{_QUERY}.convolution", "bias", torch.nn.Parameter(torch.randn(24, **_DOUBLE))), _cvt_deviation,
     rf"{_OWNER}.{_QUERY}.convolution.bias: Conv2d holds a parameter bias here, but is built with none"),
    (_classifier, _grouped, _cvt_deviation, rf"{_OWNER}.{_QUERY}.convolution.groups is 8, but Conv2d is built with 24"),
    (_classifier, _train(f"{_QUERY}.normalization"), _cvt_deviation,
     rf"{_OWNER}.{_QUERY}.normalization \(BatchNorm2d\) is in training mode: it normalizes with the batch's statistics"),
    (_classifier, _train(""), _cvt_deviation, rf"{_OWNER}.cvt.encoder.stages.0.* \(BatchNorm2d\) is in training mode"),
    (_classifier, _set(_LAYER, "drop_path", torch.nn.Tanh()), _cvt_deviation,
     rf"{_OWNER}.{_LAYER}.drop_path is Tanh, not the Identity {_OWNER} builds there"),
    (_classifier, _set(f"{_LAYER}.attention.output", "dropout", torch.nn.Tanh()), _cvt_deviation,
     rf"{_OWNER}.{_LAYER}.attention.output.dropout is Tanh, not the Dropout"),
    (_classifier, _set(f"{_LAYER}.output", "dropout", torch.nn.Tanh()), _cvt_deviation,
     rf"{_OWNER}.{_LAYER}.output.dropout is Tanh, not the Dropout"),
    (_classifier, _set("cvt.encoder.stages.0.embedding", "dropout", torch.nn.Tanh()), _cvt_deviation,
     rf"{_OWNER}.cvt.encoder.stages.0.embedding.dropout is Tanh, not the Dropout"),
    (_classifier, _set(_ATTENTION, "dropout", torch.nn.Tanh()), _cvt_deviation, rf"{_OWNER}.{_ATTENTION}.dropout is Tanh"),
    (timm_vit, _set("", "pos_drop", torch.nn.Tanh()), _vit_deviation, r"VisionTransformer.pos_drop is Tanh, not the Dropout"),
    (timm_vit, _set("", "patch_drop", torch.nn.Tanh()), _vit_deviation, r"VisionTransformer.patch_drop is Tanh, not the Identity"),
    (timm_vit, _set("", "head_drop", torch.nn.Tanh()), _vit_deviation, r"VisionTransformer.head_drop is Tanh, not the Dropout"),
    (_dropping_vit, lambda model: model, _vit_deviation,
     r"VisionTransformer.\w+_drop \(Dropout\) is in training mode with p=0.1: its forward drops at random"),
]
SILENT_IDS = ["conv-bias", "grouped-conv", "bn-train", "model-train", "drop_path", "attention.output.dropout",
              "output.dropout", "embedding.dropout", "attention.dropout", "pos_drop", "patch_drop",
              "head_drop", "vit-dropout-train"]

#: (change, refusal): each raised a raw AttributeError in the CvT reader before the check.
UNREADABLE = [
    (_set(_QUERY, "normalization", torch.nn.Identity()), rf"{_QUERY}.normalization is Identity, not the BatchNorm2d"),
    (lambda model: _set(f"{_QUERY}.normalization", "bias", None)(_set(f"{_QUERY}.normalization", "weight", None)(model)),
     rf"{_QUERY}.normalization.bias: BatchNorm2d has no parameter bias here, but is built with one"),
    (_set(_LAYER, "layernorm_before", torch.nn.RMSNorm(24, eps=1e-5, **_DOUBLE)),
     rf"{_LAYER}.layernorm_before is RMSNorm, not the LayerNorm"),
    (_set(_LAYER, "layernorm_before", torch.nn.LayerNorm(24, elementwise_affine=False, **_DOUBLE)),
     rf"{_LAYER}.layernorm_before.bias: LayerNorm has no parameter bias here"),
    (_set("cvt.encoder.stages.0.embedding.convolution_embeddings", "normalization", None),
     r"cvt.encoder.stages.0.embedding.convolution_embeddings.normalization is missing: .* builds a LayerNorm there"),
    (_set(_ATTENTION, "projection_query", torch.nn.Identity()), rf"{_ATTENTION}.projection_query is Identity, not the Linear"),
]


@pytest.mark.parametrize("make, change, deviation, refusal", SILENT, ids=SILENT_IDS)
def test_a_part_computing_otherwise_is_refused_by_name(make, change, deviation, refusal):
    model = make()
    if make is not _dropping_vit:
        assert deviation(model) <= 1e-10  # control: as built, read and equal
    with pytest.raises(SplitformerError, match=f"^{refusal}") as error:
        deviation(change(model))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make, change, deviation, refusal", SILENT, ids=SILENT_IDS)
def test_before_the_check_each_was_read_and_differed(make, change, deviation, refusal, monkeypatch):
    monkeypatch.setattr(adapters, "check_as_built", lambda *args, **kwargs: None)
    assert deviation(change(make())) > 1e-5


@pytest.mark.parametrize("change, refusal", UNREADABLE, ids=[re.sub(r"\W+", "-", case[1][:40]) for case in UNREADABLE])
def test_a_part_the_reader_could_not_read_is_refused_by_name(change, refusal):
    with pytest.raises(SplitformerError, match=f"^{_OWNER}.{refusal}") as error:
        from_hf(change(_classifier()))
    assert "\n" not in str(error.value)


def test_a_dilated_patch_convolution_is_refused_before_the_generated_forward_fails(monkeypatch):
    """Read as built, the generated forward computed another grid (4 × 4, the source 3 × 3): comparing them failed on
    broadcasting."""
    change = _set("encoder.stages.1.embedding.convolution_embeddings.projection", "dilation", (2, 2))
    with pytest.raises(SplitformerError, match=r"^CvtModel\.encoder\.stages\.1\.embedding\..*dilation is \(2, 2\), "
                                               r"but Conv2d is built with \(1, 1\)"):
        from_hf(change(_cvt(False, CONFIGS["2-stages"])))
    monkeypatch.setattr(adapters, "check_as_built", lambda *args, **kwargs: None)
    model = change(_cvt(False, CONFIGS["2-stages"]))
    adapted = from_hf(model)
    hidden, _ = NUMPY.forward(_pixels().numpy(), adapted.params, **adapted.config)
    with torch.no_grad():
        assert hidden.shape == (2, 24, 4, 4) and model(_pixels()).last_hidden_state.shape == (2, 24, 3, 3)


def test_a_training_mode_whose_forward_is_the_evaluated_one_is_read(rng):
    """Controls: a torch layer fresh from its constructor (train mode, dropout 0), one dropping at the rate the
    adapter carries into the Block, a timm ViT in train mode with every drop rate 0: read (and equal)."""
    layer = encoder_layer().train()
    assert from_torch(layer).dropout == 0.0
    u = torch.tensor(rng.standard_normal((2, 5, 8)))
    with torch.no_grad():
        adapted = from_torch(layer)
        assert (adapted.build(adapted.derivation().torch_module())(u) - layer(u)).abs().max() <= 1e-10
    dropping = torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.25, batch_first=True, **_DOUBLE)
    assert from_torch(dropping).dropout == 0.25
    assert _vit_deviation(timm_vit().train()) <= 1e-10


def test_a_part_outside_the_library_layout_is_refused_for_every_builder(rng):
    """A CvT, a torch encoder layer, a BERT and a GPT-2 block with an extra part, parameter or buffer its class
    builds none of: refused by name (its forward may use it; the readers map named parts only)."""
    from test_adapter_as_built import _bert_layer, _gpt2

    cvt = _set("cvt.encoder.stages.0", "extra", torch.nn.Tanh())(_classifier())
    with pytest.raises(SplitformerError, match=rf"^{_OWNER}\.cvt\.encoder\.stages\.0\.extra \(Tanh\) is a part {_OWNER} "
                                               "does not build from this configuration"):
        from_hf(cvt)
    layer = encoder_layer()
    layer.extra = torch.nn.Linear(8, 8, **_DOUBLE)
    with pytest.raises(SplitformerError, match=r"^TransformerEncoderLayer\.extra \(Linear\) is a part"):
        from_torch(layer)
    bert = _bert_layer()
    bert.output.dense.register_parameter("scale", torch.nn.Parameter(torch.ones(8, **_DOUBLE)))
    with pytest.raises(SplitformerError, match=r"^BertLayer\.output\.dense\.scale: Linear holds a parameter scale"):
        from_hf(bert)
    block = _gpt2()
    block.register_buffer("offset", torch.zeros(8, **_DOUBLE))
    with pytest.raises(SplitformerError, match=r"^GPT2Block\.offset: GPT2Block holds a buffer offset"):
        from_hf(block)
    assert np.isfinite(from_hf(_gpt2()).params["attn.W_q"]).all()  # control


def test_a_whole_models_part_outside_the_blocks_is_compared_too():
    """GPT-2's ``transformer.drop``, BERT's and HF ViT's ``embeddings.dropout`` replaced by ``Tanh`` (read before,
    logits off by 0.03 to 0.2): refused by name."""
    from splitformer.nn import from_hf_lm
    from test_adapter_as_built import _gpt2_lm, _vit_classifier
    from test_hf_whole_models import bert

    for read, model, part in ((from_hf_lm, _gpt2_lm(), "transformer.drop"), (from_hf, bert(), "embeddings.dropout"),
                              (from_hf, _vit_classifier(), "vit.embeddings.dropout")):
        read(model)  # control: as built
        parent, _, name = part.rpartition(".")
        setattr(model.get_submodule(parent), name, torch.nn.Tanh())
        with pytest.raises(SplitformerError, match=rf"^{type(model).__name__}\.{re.escape(part)} is Tanh, not the Dropout"):
            read(model)


@pytest.mark.parametrize("training", [False, True])
def test_build_returns_its_module_in_the_sources_mode(training):
    """A tester's finding: ``adapted.build()`` of an eval-mode ``TransformerEncoderLayer`` (torch's default dropout 0.1)
    returned a training-mode Block dropping out (0.48 off the source). Now the source's mode: in eval, the source's
    output (float64, random parameters); in training, training (the control: dropout carried, as before)."""
    import splitformer

    torch.manual_seed(0)
    source = torch.nn.TransformerEncoderLayer(12, 3, 20, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    source.train(training)
    adapted = from_torch(source)
    block = adapted.build(splitformer.derive("post-ln").torch_module())
    assert block.training is training and block.dropout == pytest.approx(0.1)
    if not training:
        u = torch.randn(2, 5, 12, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(block(u), source(u), rtol=1e-12, atol=1e-12)
