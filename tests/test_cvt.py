"""The cvt model: parity with transformers' CvtModel / CvtForImageClassification (eval, random BatchNorm statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformers

from splitformer.adapters import from_hf  # noqa: E402
from splitformer.symbolic.errors import SplitformerError  # noqa: E402

from conftest import generated_now  # noqa: E402

NUMPY, TORCH = generated_now("cvt")

#: Two and three stages; the class node in the last; stride_kv 2; d_ff ≠ 4d; qkv_bias off in one stage.
#: (transformers indexes drop-path rates by stage: depth[s] > s.)
CONFIGS = {
    "2-stages": dict(patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], embed_dim=[16, 24],
                     num_heads=[1, 3], depth=[1, 2], mlp_ratio=[4.0, 2.5], cls_token=[False, True]),
    "3-stages": dict(patch_sizes=[3, 3, 3], patch_stride=[2, 2, 1], patch_padding=[1, 1, 1], embed_dim=[8, 12, 16],
                     num_heads=[1, 2, 4], depth=[1, 2, 3], mlp_ratio=[2.0, 3.0, 4.0], cls_token=[False, False, True],
                     qkv_bias=[True, False, True]),
}


def _cvt(classifier: bool, config: dict, **overrides):
    stages = len(config["depth"])
    defaults = dict(num_channels=3, stride_kv=[2] * stages, stride_q=[1] * stages, padding_kv=[1] * stages,
                    padding_q=[1] * stages, kernel_qkv=[3] * stages, qkv_bias=[True] * stages,
                    drop_path_rate=[0.0] * stages, attention_drop_rate=[0.0] * stages, drop_rate=[0.0] * stages,
                    qkv_projection_method=["dw_bn"] * stages, num_labels=4)
    torch.manual_seed(0)
    cls = transformers.CvtForImageClassification if classifier else transformers.CvtModel
    model = cls(transformers.CvtConfig(**{**defaults, **config, **overrides})).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # default inits zero biases: would hide bugs
            parameter.normal_(0, 0.3)
            assert (parameter != 0).all(), name
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):  # random statistics, not 0 and 1
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
    return model


def _pixels(height=32, width=32):
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _torch_model(adapted, model, dtype):
    config = model.config
    d_ffs = [int(d * ratio) for d, ratio in zip(config.embed_dim, config.mlp_ratio)]
    n_classes = adapted.params["head.W"].shape[1] if "head.W" in adapted.params else 0
    generated = TORCH.Model(3, list(config.embed_dim), list(config.depth), d_ffs, adapted.config["stages"],
                            n_classes=n_classes, eps=adapted.config["eps"], dtype=dtype)
    return generated.load_params(adapted.params)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_cvt_model_parity_float64_both_backends(config):
    model = _cvt(False, config)
    pixels = _pixels()
    with torch.no_grad():
        expected = model(pixels)
    adapted = from_hf(model)
    hidden, cls = NUMPY.forward(pixels.numpy(), adapted.params, **adapted.config)
    assert np.abs(hidden - expected.last_hidden_state.numpy()).max() <= 1e-10
    assert np.abs(cls - expected.cls_token_value.numpy()).max() <= 1e-10
    with torch.no_grad():
        hidden, cls = _torch_model(adapted, model, torch.float64)(pixels)
    assert (hidden - expected.last_hidden_state).abs().max() <= 1e-10
    assert (cls - expected.cls_token_value).abs().max() <= 1e-10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_cvt_classification_parity(config, dtype):
    model = _cvt(True, config)
    pixels = _pixels(40, 24)  # any size the reference takes: CvT has no position table
    with torch.no_grad():
        expected = model(pixels).logits.numpy()
    adapted = from_hf(model)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
    adapted = adapted.astype(numpy_dtype)
    logits = NUMPY.logits(pixels.numpy().astype(numpy_dtype), adapted.params, **adapted.config)
    assert logits.dtype == numpy_dtype and np.abs(logits - expected).max() <= tolerance
    with torch.no_grad():
        out = _torch_model(adapted, model, dtype).logits(pixels.to(dtype))
    assert np.abs(out.numpy() - expected).max() <= tolerance
    built = adapted.build(TORCH)  # its sizes read from the parameters, in their dtype (it was refused: "vit only")
    with torch.no_grad():
        assert next(built.parameters()).dtype == dtype
        assert np.abs(built.logits(pixels.to(dtype)).numpy() - expected).max() <= tolerance


def test_adapter_refuses_what_the_model_does_not_compute():
    config = CONFIGS["2-stages"]
    with pytest.raises(SplitformerError, match="class token in stage 0"):
        from_hf(_cvt(False, {**config, "cls_token": [True, True]}))
    with pytest.raises(SplitformerError, match="the last stage has no class token"):
        from_hf(_cvt(True, {**config, "cls_token": [False, False]}))
    with pytest.raises(SplitformerError, match="qkv_projection_method='avg'"):
        _cvt_config = {**config, "qkv_projection_method": ["dw_bn", "avg"]}
        from_hf(_cvt(False, _cvt_config))


@pytest.mark.parametrize("key, value, message", [
    ("padding_kv", [0, 0], r"stage 0 config has padding_kv = 0 but stages\.0\.layers\.0\.attention\.attention\."
                           r"convolution_projection_key\.convolution_projection\.convolution\.padding is \(1, 1\)"),
    ("num_heads", [1, 1], r"stage 1 config has n_heads = 1 but stages\.1\.layers\.0\.attention\.attention\."
                          r"num_heads is 3"),
    ("patch_stride", [4, 1], r"stage 1 config has patch_stride = 1 but stages\.1\.embedding\."
                             r"convolution_embeddings\.projection\.stride is \(2, 2\)"),
    ("stride_kv", [2, 1], r"stage 1 config has stride_kv = 1 but .*convolution_projection_key\..*\.stride is \(2, 2\)"),
])
def test_a_config_edited_after_construction_is_compared_with_the_modules(key, value, message):
    """The convolutions and attentions compute; a config that no longer describes them is refused."""
    model = _cvt(True, CONFIGS["2-stages"])
    from_hf(model)  # control
    setattr(model.config, key, value)
    with pytest.raises(SplitformerError, match="^CvtForImageClassification: " + message) as error:
        from_hf(model)
    assert "\n" not in str(error.value)


#: Queries and keys padded differently (kernel 5, padding_q 2; padding_kv 0 or 2, the keys on a grid larger than
#: the tokens' in stage 1): a mutant taking K's padding from Q's fails here.
UNEVEN_PADDING = dict(kernel_qkv=[5, 3], padding_q=[2, 1], padding_kv=[0, 2], stride_kv=[2, 1])


@pytest.mark.parametrize("classifier", [False, True], ids=["CvtModel", "CvtForImageClassification"])
def test_cvt_parity_with_queries_and_keys_padded_differently(classifier):
    model = _cvt(classifier, CONFIGS["2-stages"], **UNEVEN_PADDING)
    pixels = _pixels(40, 24)
    with torch.no_grad():
        output = model(pixels)
    adapted = from_hf(model)
    assert [stage["padding_q"] != stage["padding_kv"] for stage in adapted.config["stages"]] == [True, True]
    with torch.no_grad():
        generated = _torch_model(adapted, model, torch.float64)
        if classifier:
            got = [NUMPY.logits(pixels.numpy(), adapted.params, **adapted.config), generated.logits(pixels).numpy()]
            expected = output.logits.numpy()
        else:
            got = [NUMPY.forward(pixels.numpy(), adapted.params, **adapted.config)[0], generated(pixels)[0].numpy()]
            expected = output.last_hidden_state.numpy()
    assert max(np.abs(value - expected).max() for value in got) <= 1e-10


def test_queries_off_the_token_grid_are_refused_as_by_the_reference():
    """stride_q ≠ 1 (or padding_q ≠ (kernel_qkv − 1)/2) puts the queries on another grid: transformers' CvT fails
    in the residual sum; the adapter and both generated modules refuse it by name before any work."""
    model = _cvt(False, CONFIGS["2-stages"], stride_q=[2, 1])
    with pytest.raises(RuntimeError), torch.no_grad():
        model(_pixels())
    with pytest.raises(SplitformerError, match="stage 0 has stride_q = 2"):
        from_hf(model)
    stages = from_hf(_cvt(False, CONFIGS["2-stages"])).config["stages"]
    adapted = from_hf(_cvt(False, CONFIGS["2-stages"]))
    for change in ({"stride_q": 2}, {"padding_q": 0}):
        wrong = [{**stages[0], **change}, stages[1]]
        with pytest.raises(ValueError, match=r"stages\[0\]: stride_q = .* put the queries on another grid"):
            NUMPY.forward(_pixels().numpy(), adapted.params, stages=wrong)
        with pytest.raises(ValueError, match=r"stages\[0\]: stride_q = .* put the queries on another grid"):
            TORCH.Model(3, [16, 24], [1, 2], [64, 60], wrong, dtype=torch.float64)


def test_numpy_cvt_refuses_parameters_and_settings_no_stage_reads():
    """A layer after a gap, a misspelt parameter and an unknown stage setting are refused before any work
    (they were ignored: a missing ``stages.1.layers.0`` ran stage 1 with no layers, logits 1.05 off)."""
    model = _cvt(True, CONFIGS["2-stages"])
    adapted = from_hf(model)
    pixels = _pixels()
    with torch.no_grad():
        expected = model(pixels).logits.numpy()
    assert np.abs(NUMPY.logits(pixels.numpy(), adapted.params, **adapted.config) - expected).max() <= 1e-10
    gap = {name: value for name, value in adapted.params.items() if not name.startswith("stages.1.layers.0.")}
    misspelt = {**adapted.params, "stages.0.bogus": adapted.params["stages.0.embed.W"]}
    for params, name in ((gap, "stages.1.layers.1."), (misspelt, "stages.0.bogus")):
        with pytest.raises(ValueError, match=f"unexpected parameter '{name}"):
            NUMPY.logits(pixels.numpy(), params, **adapted.config)
        with pytest.raises(ValueError, match=f"unexpected parameter '{name}"):
            NUMPY.forward(pixels.numpy(), params, **adapted.config)
    stages = [dict(adapted.config["stages"][0]), {**adapted.config["stages"][1], "stride_kvv": 2}]
    with pytest.raises(ValueError, match=r"stages\[1\] has the unknown setting 'stride_kvv'"):
        NUMPY.logits(pixels.numpy(), adapted.params, **{**adapted.config, "stages": stages})
    two_channels = pixels.numpy()[:, :2]  # tester s39 L3: the kernel was blamed ('stages.0.embed.W' has shape …)
    for function in (NUMPY.logits, NUMPY.forward):
        with pytest.raises(ValueError, match=r"^pixel_values has 2 channels, the first stage's embedding 3 "):
            function(two_channels, adapted.params, **adapted.config)


def test_a_negative_running_variance_is_refused_by_name():
    """Attack s33 L9: a batch norm's negative running variance was read, and every output was NaN; the control reads."""
    model = _cvt(False, next(iter(CONFIGS.values())))
    norm = next(module for module in model.modules() if isinstance(module, torch.nn.BatchNorm2d))
    assert from_hf(model) is not None
    with torch.no_grad():
        norm.running_var[1] = -0.5
    with pytest.raises(SplitformerError, match=r"running_var holds a negative variance"):
        from_hf(model)
