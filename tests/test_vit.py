"""The vit model: parity with transformers' ViT (both backends, both dtypes), adapter refusals, image sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformers

from splitformer.adapters import from_hf  # noqa: E402
from splitformer.codegen.pipeline import generate_network  # noqa: E402
from splitformer.codegen.output import write_files  # noqa: E402
from splitformer.symbolic.errors import SplitformerError  # noqa: E402
from splitformer.symbolic.network_spec import load_network  # noqa: E402

from conftest import GENERATED, ROOT, generated_now, import_path  # noqa: E402

NUMPY, TORCH = generated_now("vit")

#: Small random configurations: d_ff ≠ 4d in one, qkv_bias on and off, both LayerNorm ε.
CONFIGS = {
    "dff100-bias-eps1e-6": dict(intermediate_size=100, qkv_bias=True, layer_norm_eps=1e-6),
    "dff192-nobias-eps1e-12": dict(intermediate_size=192, qkv_bias=False, layer_norm_eps=1e-12),
}


def _vit(classifier: bool, image_size=32, seed=0, **overrides):
    config = transformers.ViTConfig(image_size=image_size, patch_size=8, num_channels=3, hidden_size=48,
                                    num_attention_heads=3, num_hidden_layers=2,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    **{"num_labels": 5, **overrides})
    torch.manual_seed(seed)
    cls = transformers.ViTForImageClassification if classifier else transformers.ViTModel
    model = cls(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # default inits zero biases: would hide bugs
            parameter.normal_(0, 0.3)
            assert (parameter != 0).all(), name
    return model


def _pixels(model, batch=2, dtype=torch.float64):
    size = model.config.image_size
    height, width = size if isinstance(size, (tuple, list)) else (size, size)
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=dtype)


def _reference(model, pixels):
    with torch.no_grad():
        output = model(pixels)
    return (output.logits if hasattr(output, "logits") else output.last_hidden_state).numpy()


def _torch_model(adapted, dtype):
    params = adapted.params
    d, d_ff = params["layers.0.ffn.W_1"].shape
    n_classes = params["head.W"].shape[1] if "head.W" in params else 0
    model = TORCH.Model(n_layers=sum(name.endswith("attn.W_q") for name in params), d_model=d, d_ff=d_ff,
                        n_channels=params["embed.W"].shape[0], n_classes=n_classes, dtype=dtype, **adapted.config)
    return model.load_params(params)


@pytest.mark.parametrize("classifier", [False, True], ids=["ViTModel", "ViTForImageClassification"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_parity_float64_both_backends(config, classifier):
    model = _vit(classifier, **config)
    pixels = _pixels(model)
    expected = _reference(model, pixels)
    adapted = from_hf(model)
    function = NUMPY.logits if classifier else NUMPY.forward
    assert np.abs(function(pixels.numpy(), adapted.params, **adapted.config) - expected).max() <= 1e-10
    generated = _torch_model(adapted, torch.float64)
    with torch.no_grad():
        out = generated.logits(pixels) if classifier else generated(pixels)
    assert np.abs(out.numpy() - expected).max() <= 1e-10


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_parity_float32_both_backends(config):
    model = _vit(True, **config)
    pixels = _pixels(model)
    expected = _reference(model, pixels)
    adapted = from_hf(model).astype(np.float32)
    logits = NUMPY.logits(pixels.numpy().astype(np.float32), adapted.params, **adapted.config)
    assert logits.dtype == np.float32 and np.abs(logits - expected).max() <= 1e-4
    generated = _torch_model(adapted, torch.float32)
    with torch.no_grad():
        out = generated.logits(pixels.float())
    assert out.dtype == torch.float32 and np.abs(out.numpy() - expected).max() <= 1e-4


def test_a_non_square_image_the_reference_accepts_is_accepted():
    model = _vit(False, image_size=(32, 16))
    pixels = _pixels(model, batch=1)
    adapted = from_hf(model)
    out = NUMPY.forward(pixels.numpy(), adapted.params, **adapted.config)
    assert out.shape == (1, 1 + 4 * 2, 48)
    assert np.abs(out - _reference(model, pixels)).max() <= 1e-10


def test_sizes_the_reference_rejects_are_rejected_by_name():
    model = _vit(False)
    adapted = from_hf(model)
    other = np.zeros((1, 3, 40, 40))
    with pytest.raises(ValueError, match="doesn't match model"):
        model(torch.tensor(other))  # the reference refuses it too (no interpolation)
    with pytest.raises(ValueError, match="pixel_values has size"):
        NUMPY.forward(other, adapted.params, **adapted.config)
    config = {**adapted.config, "image_size": None}
    with pytest.raises(ValueError, match="give 5x5 patches of 8, the position term has 16"):
        NUMPY.forward(other, adapted.params, **config)
    for height, width in ((16, 64), (64, 16), (8, 128)):  # 16 patches, as the term's, laid out otherwise (tester s39 L4)
        with pytest.raises(ValueError, match=f"give a {height // 8}x{width // 8} patch grid: pass image_size"):
            NUMPY.forward(np.zeros((1, 3, height, width)), adapted.params, **config)
    square = NUMPY.forward(np.ones((1, 3, 32, 32)), adapted.params, **config)  # a square grid: the term's own layout
    assert np.array_equal(square, NUMPY.forward(np.ones((1, 3, 32, 32)), adapted.params, **adapted.config))
    with pytest.raises(ValueError, match="pixel_values must have shape"):
        _torch_model(adapted, torch.float64)(torch.tensor(other))
    gray = np.zeros((1, 1, 32, 32))  # the input's channels are wrong, not the weights: said so (it blamed embed.W)
    with pytest.raises(ValueError, match=r"^pixel_values has 1 channels, the patch embedding 3 \('embed.W' \(3, "):
        NUMPY.forward(gray, adapted.params, **adapted.config)
    transposed = {**adapted.params, "layers.0.ffn.W_1": adapted.params["layers.0.ffn.W_1"].T}  # d_ff is read from it
    with pytest.raises(ValueError, match=r"'layers.0.ffn.W_1' has shape \(\d+, 48\), expected \(48, d_ff\)$"):
        NUMPY.forward(np.zeros((1, 3, 32, 32)), transposed, **adapted.config)


def test_a_tuple_patch_size_is_read_when_square_and_refused_otherwise():
    model = _vit(False)
    model.config.patch_size = (8, 8)  # transformers' configurations take either spelling
    assert from_hf(model).config["patch_size"] == 8
    model.config.patch_size = (8, 4)
    with pytest.raises(SplitformerError, match=r"patch_size=\(8, 4\); the vit model's patches are square"):
        from_hf(model)

def test_adapter_refuses_what_the_model_does_not_compute():
    with pytest.raises(SplitformerError, match="activation_fn activation NewGELUActivation|intermediate_act_fn activation NewGELUActivation"):
        from_hf(_vit(False, hidden_act="gelu_new"))
    with pytest.raises(SplitformerError, match="classifier is Identity"):
        from_hf(_vit(True, num_labels=0))
    model = _vit(False)
    layer = model.layers[1] if hasattr(model, "layers") else model.encoder.layer[1]
    attention = layer.attention if hasattr(model, "layers") else layer.attention.attention
    attention.scaling = 0.5
    with pytest.raises(SplitformerError, match="layer 1 scales attention scores by 0.5"):
        from_hf(model)


def _layers(model):
    return list(model.layers) if hasattr(model, "layers") else list(model.encoder.layer)


def _set_activation(layer, module):
    if hasattr(layer, "mlp"):
        layer.mlp.activation_fn = module
    else:
        layer.intermediate.intermediate_act_fn = module


def test_eps_and_activation_are_read_from_the_modules_not_the_config():
    """The config says layer_norm_eps=1e-12 and gelu; the modules compute what they hold."""
    model = _vit(False)
    for norm in [model.layernorm] + [getattr(layer, name) for layer in _layers(model)
                                     for name in ("layernorm_before", "layernorm_after")]:
        norm.eps = 0.5
    assert from_hf(model).config["eps"] == 0.5  # one eps everywhere: read, not the config's
    changes = [
        (lambda m: setattr(_layers(m)[1].layernorm_before, "eps", 0.5), r"different LayerNorm eps \(.*layers\.1\.layernorm_before\.eps=0\.5"),
        (lambda m: setattr(m.layernorm, "eps", 0.5), r"different LayerNorm eps \(layernorm\.eps=0\.5"),
        (lambda m: _set_activation(_layers(m)[0], torch.nn.ReLU()), r"layer 0: .* computes relu; the vit model's step uses the exact"),
        (lambda m: setattr(_layers(m)[0], "layernorm_after", torch.nn.RMSNorm(48)), r"layer 0\.layernorm_after is RMSNorm, not LayerNorm"),
    ]
    for change, message in changes:
        model = _vit(False)
        change(model)
        with pytest.raises(SplitformerError, match=message):
            from_hf(model)


def test_generated_numpy_rejects_bad_arguments_before_work():
    adapted = from_hf(_vit(True))
    pixels = np.zeros((1, 3, 32, 32))
    with pytest.raises(ValueError, match="pixel_values must be float32 or float64"):
        NUMPY.forward(pixels.astype(np.int64), adapted.params, **adapted.config)
    with pytest.raises(ValueError, match="missing parameter 'layers.1.norm2.gain'"):
        params = {k: v for k, v in adapted.params.items() if k != "layers.1.norm2.gain"}
        NUMPY.forward(pixels, params, **adapted.config)
    with pytest.raises(ValueError, match="not divisible by n_heads = 5"):
        NUMPY.forward(pixels, dict(adapted.params), **{**adapted.config, "n_heads": 5})
    with pytest.raises(ValueError, match="^params: the source was read with n_heads=3, the call has n_heads=5"):
        NUMPY.forward(pixels, adapted.params, **{**adapted.config, "n_heads": 5})


def test_a_transposed_head_is_named_with_its_shape():
    """Attack s33 L7: the NumPy module read n_classes off head.W's last axis, so a (classes, d) head.W (torch's Linear
    layout) was "expected (d, d)"; it reads it off head.b first, as the torch Model knows it."""
    adapted = from_hf(_vit(True))
    pixels = np.zeros((1, 3, 32, 32))
    d, classes = adapted.params["head.W"].shape
    assert d != classes
    transposed = {**adapted.params, "head.W": adapted.params["head.W"].T}
    with pytest.raises(ValueError, match=rf"^parameter 'head.W' has shape \({classes}, {d}\), expected \({d}, {classes}\)$"):
        NUMPY.logits(pixels, transposed, **adapted.config)
    assert NUMPY.logits(pixels, adapted.params, **adapted.config).shape == (1, classes)


def test_committed_files_match_the_generator(update_golden):
    files = generate_network(load_network("vit"), ("numpy", "torch"), GENERATED)
    if update_golden:
        write_files(files)
    stale = [str(path.relative_to(ROOT)) for path, text in files.items() if path.read_text(encoding="utf-8") != text]
    assert not stale, f"generated/ is out of date: {stale}; run make generate"


def test_an_adapted_network_and_block_build_with_the_derived_backward():
    """Tester s39 L7: ``build`` took no ``backward=``; the derived backward needed a Model built by hand. Its gradients
    equal autograd's (the control: the default build runs autograd)."""
    from splitformer.adapters import from_torch

    model = _vit(True)
    adapted = from_hf(model)
    pixels = _pixels(model)
    grads = {}
    for backward in ("autograd", "derived"):
        built = adapted.build(TORCH, backward=backward)
        assert built.backward_mode == backward
        built.logits(pixels).square().sum().backward()
        grads[backward] = {name: parameter.grad for name, parameter in built.named_parameters()}
    assert all(torch.allclose(grads["derived"][name], grads["autograd"][name], atol=1e-12) for name in grads["autograd"])
    layer = torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    post_ln = import_path(GENERATED / "torch" / "post_ln.py")
    assert from_torch(layer).build(post_ln, backward="derived").backward_mode == "derived"
    assert from_torch(layer).build(post_ln).backward_mode == "autograd"
