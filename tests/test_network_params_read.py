"""A whole network's parameters as an adapter reads them (``AdaptedModel.params``, a ``NetworkParams``) are refused by
the generated modules with a configuration other than the one read — NumPy's functions with their keyword arguments,
torch's ``Model.load_params`` with the Model's — as a block adapter's are. A tester's finding: ``vit.logits(x,
adapted.params, n_heads=2, …)`` for a three-head source ran, 0.22 off the source's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from splitformer.adapters import from_hf

from conftest import GENERATED, import_path
from test_adapters import randomize
from test_cvt import CONFIGS, _cvt, _pixels, _torch_model

NUMPY_VIT = import_path(GENERATED / "numpy" / "vit.py")
TORCH_VIT = import_path(GENERATED / "torch" / "vit.py")
NUMPY_CVT = import_path(GENERATED / "numpy" / "cvt.py")
TORCH_CVT = import_path(GENERATED / "torch" / "cvt.py")
NUMPY_RESNET = import_path(GENERATED / "numpy" / "resnet_block.py")


@pytest.fixture(scope="module")
def vit():
    """A three-head ViT classifier with every parameter random (N(0, 0.5²): transformers' init makes attention
    nearly uniform, which hides a wrong head count), its adapter reading and an image batch."""
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=2, intermediate_size=20, num_labels=5)
    source = randomize(transformers.ViTForImageClassification(config).double())
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.normal_(0, 0.5)
    pixels = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        expected = source(pixels).logits.numpy()
    return from_hf(source), pixels, expected


def test_vit_numpy_refuses_a_configuration_other_than_the_one_read(vit):
    adapted, pixels, expected = vit
    assert np.abs(NUMPY_VIT.logits(pixels.numpy(), adapted.params, **adapted.config) - expected).max() <= 1e-10
    for changed, message in (({"n_heads": 2}, "n_heads=3, the call has n_heads=2"),
                             ({"eps": 1e-6}, "eps=1e-12, the call has eps=1e-06"),
                             ({"image_size": (4, 4)}, r"image_size=\(8, 8\), the call has image_size=\(4, 4\)")):
        with pytest.raises(ValueError, match=rf"^params: the source was read with {message}: pass \*\*adapted.config"):
            NUMPY_VIT.logits(pixels.numpy(), adapted.params, **{**adapted.config, **changed})
        with pytest.raises(ValueError, match="^params: the source was read with"):
            NUMPY_VIT.vjp(pixels.numpy(), adapted.params, np.ones((2, 5, 12)), **{**adapted.config, **changed})
    # the defaults the call leaves out are compared too; image_size=None is read from the pixels
    assert np.abs(NUMPY_VIT.logits(pixels.numpy(), adapted.params, patch_size=4, n_heads=3) - expected).max() <= 1e-10
    # control: the same arrays as a plain dict are not the source's reading: they run, and differ
    wrong = NUMPY_VIT.logits(pixels.numpy(), dict(adapted.params), **{**adapted.config, "n_heads": 2})
    assert np.abs(wrong - expected).max() > 1e-2


def test_vit_torch_model_refuses_to_load_a_reading_of_another_configuration(vit):
    adapted, pixels, expected = vit
    sizes = dict(n_layers=2, d_model=12, d_ff=20, n_channels=3, n_classes=5, dtype=torch.float64)
    model = TORCH_VIT.Model(**sizes, **adapted.config).load_params(adapted.params)
    with torch.no_grad():
        assert (model.logits(pixels).numpy() - expected).__abs__().max() <= 1e-10
    other = TORCH_VIT.Model(**sizes, **{**adapted.config, "n_heads": 2})
    with pytest.raises(ValueError, match="^params: the source was read with n_heads=3, the call has n_heads=2"):
        other.load_params(adapted.params)
    other.load_params(dict(adapted.params))  # control: a plain dict is not checked
    with torch.no_grad():
        assert (other.logits(pixels).numpy() - expected).__abs__().max() > 1e-2
    assert type(adapted.astype(np.float32).params) is type(adapted.params)  # a converted reading keeps the check


def test_a_network_reading_is_refused_by_another_network():
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=1, intermediate_size=20)
    adapted = from_hf(randomize(transformers.ViTModel(config).double()))
    field = np.zeros((1, 12, 4, 4))
    with pytest.raises(ValueError, match="^params: these are the vit network's parameters; .* computes another "
                                         "network .*: derive vit for them"):
        NUMPY_RESNET.forward(field, adapted.params)


def test_cvt_refuses_a_stage_configuration_other_than_the_one_read():
    model = _cvt(True, CONFIGS["2-stages"])
    pixels = _pixels()
    with torch.no_grad():
        expected = model(pixels).logits.numpy()
    adapted = from_hf(model)
    assert np.abs(NUMPY_CVT.logits(pixels.numpy(), adapted.params, **adapted.config) - expected).max() <= 1e-10
    stages = [dict(stage) for stage in adapted.config["stages"]]
    stages[1]["n_heads"] = 1
    with pytest.raises(ValueError, match=r"^params: the source was read with stages\[1\]\['n_heads'\]=3, the call has "
                                         r"stages\[1\]\['n_heads'\]=1: pass"):
        NUMPY_CVT.logits(pixels.numpy(), adapted.params, stages=stages, eps=adapted.config["eps"])
    with torch.no_grad():
        assert np.abs(_torch_model(adapted, model, torch.float64).logits(pixels).numpy() - expected).max() <= 1e-10
    with pytest.raises(ValueError, match=r"^params: the source was read with stages\[1\]\['n_heads'\]=3"):
        TORCH_CVT.Model(3, [16, 24], [1, 2], [64, 60], stages, n_classes=4, eps=adapted.config["eps"],
                        dtype=torch.float64).load_params(adapted.params)
    # control: a plain dict with the changed stages runs, and differs from the source
    wrong = NUMPY_CVT.logits(pixels.numpy(), dict(adapted.params), stages=stages, eps=adapted.config["eps"])
    assert np.abs(wrong - expected).max() > 1e-2


def test_a_float32_reading_takes_its_eps_in_float32_and_a_subclass_is_named(vit):
    """A reviewer's findings: the NumPy network converted ``eps`` to a Python float before comparing it with the
    reading, so ``eps=np.float32(1e-12)`` (the value read, as float32 holds it) was refused; and a subclass of the
    torch Model overriding ``forward`` was said to compute another network."""
    adapted, pixels, expected = vit
    single = adapted.astype(np.float32)
    config = {**single.config, "eps": np.float32(single.config["eps"])}
    assert np.abs(NUMPY_VIT.logits(pixels.numpy().astype(np.float32), single.params, **config) - expected).max() < 1e-3

    class Mine(TORCH_VIT.Model):
        def forward(self, pixel_values):
            return super().forward(pixel_values)

    sizes = dict(n_layers=2, d_model=12, d_ff=20, n_channels=3, n_classes=5, dtype=torch.float64)
    with pytest.raises(ValueError, match="^params: Mine is not a generated network module's"):
        Mine(**sizes, **adapted.config).load_params(adapted.params)
