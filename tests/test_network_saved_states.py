"""What a network's chain keeps: ``backward="derived"`` saves its states and parameters as autograd does
(an in-place edit between forward and backward raises, as for any saved tensor), and the NumPy
``forward`` keeps no layer's input (its peak memory does not grow with the depth)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from conftest import generated_now

STAGE = dict(patch_size=3, patch_stride=2, patch_padding=1, n_heads=1, kernel_qkv=3, stride_q=1, padding_q=1,
             stride_kv=2, padding_kv=1, cls=True)


def _vit(backward):
    return generated_now("vit")[1].Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2,
                                         image_size=(4, 4), dtype=torch.float64, backward=backward)


def _cvt(backward):
    return generated_now("cvt")[1].Model(3, [4], [2], [8], [STAGE], dtype=torch.float64, backward=backward)


def _resnet(backward):
    return generated_now("resnet-block")[1].Model(3, 3, dtype=torch.float64, backward=backward)


def _output(model, pixels):
    output = model(pixels)
    return output[0] if isinstance(output, tuple) else output


@pytest.mark.parametrize("network", [_vit, _cvt, _resnet], ids=["vit", "cvt", "resnet-block"])
@pytest.mark.parametrize("edit", ["parameter", "input", None])
def test_an_in_place_edit_between_forward_and_backward_raises(network, edit):
    """Negative control (``edit=None``): the same backward without the edit runs."""
    torch.manual_seed(0)
    model = network("derived")
    pixels = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    output = _output(model, pixels)
    if edit is None:
        output.sum().backward()
        return
    with torch.no_grad():
        (next(model.parameters()) if edit == "parameter" else pixels).add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        output.sum().backward()


def _vit_params(n_layers, d=64):
    rng = np.random.default_rng(0)
    torch_model = generated_now("vit")[1].Model(n_layers=n_layers, d_model=d, n_heads=2, d_ff=d, n_channels=1,
                                                patch_size=1, image_size=(8, 8), dtype=torch.float64)
    return {name: rng.normal(size=tuple(p.shape)) for name, p in torch_model.named_parameters()}


def _peak(function) -> int:
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_numpy_forward_keeps_no_layer_input():
    """The peak of ``forward`` with 12 layers is that of 2 layers plus less than one layer's state (the chain
    keeping each layer's input would add ten); negative control: ``vjp`` keeps them."""
    numpy_module = generated_now("vit")[0]
    pixels = np.random.default_rng(1).normal(size=(16, 1, 8, 8))
    state = pixels.shape[0] * 65 * 64 * 8  # one (batch, tokens, d) float64 array
    shallow, deep = _vit_params(2), _vit_params(12)
    forward = {n: _peak(lambda: numpy_module.forward(pixels, params, patch_size=1, n_heads=2))
               for n, params in ((2, shallow), (12, deep))}
    assert forward[12] - forward[2] < state
    seed = np.ones((16, 65, 64))
    vjp = {n: _peak(lambda: numpy_module.vjp(pixels, params, seed, patch_size=1, n_heads=2))
           for n, params in ((2, shallow), (12, deep))}
    assert vjp[12] - vjp[2] > 9 * state
