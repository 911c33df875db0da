"""The networks of ``make bench`` and the modules a user would pick instead (inference, float32).

vit vs transformers' ``ViTModel`` (16 images 64², patches of 8, d 256, 8 heads, d_ff 1024, 4 layers);
cvt vs ``CvtModel`` (8 images 64², 3 stages: d 64, 192, 384, depths 1, 2, 3, CvT-13's kernels and
strides); resnet-block (16 images 32², 64 channels) and unet-level (16 images 32², 3 → 64 channels)
vs their torch ``Conv2d``/``BatchNorm2d`` compositions. ``bench/benchmark.py`` times them
(rows ``vit/torch``, ``vit/numpy``, …), the NumPy figures against the same torch reference.
"""

from __future__ import annotations

from pathlib import Path

SHAPES = {"vit": "16 images 64², d 256, 4 layers", "cvt": "8 images 64², 3 stages",
          "resnet-block": "16 images 32², 64 channels", "unet-level": "16 images 32², 3 → 64 channels"}


def _random(model):
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.05)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
    return model.float().eval()


def _drawn(*shape: int):
    """A standard normal input (seed 1), drawn on the CPU and moved to the default device (``bench/gpu.py`` builds
    under ``torch.device("cuda")``, where a CPU generator cannot draw)."""
    import torch

    values = torch.randn(*shape, generator=torch.Generator().manual_seed(1), device="cpu")
    return values.to(torch.get_default_device())


def _hf(name: str):
    """The transformers module, its pixels, and the adapter's (params, config)."""
    import numpy as np
    import transformers

    from splitformer.adapters import from_hf

    if name == "vit":
        config = transformers.ViTConfig(image_size=64, patch_size=8, num_channels=3, hidden_size=256,
                                        num_attention_heads=8, num_hidden_layers=4, intermediate_size=1024,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model, batch = _random(transformers.ViTModel(config, add_pooling_layer=False)), 16
    else:
        config = transformers.CvtConfig(num_channels=3, patch_sizes=[7, 3, 3], patch_stride=[4, 2, 2],
                                        patch_padding=[2, 1, 1], embed_dim=[64, 192, 384], num_heads=[1, 3, 6],
                                        depth=[1, 2, 3], mlp_ratio=[4.0] * 3, cls_token=[False, False, True],
                                        drop_path_rate=[0.0] * 3, attention_drop_rate=[0.0] * 3, drop_rate=[0.0] * 3)
        model, batch = _random(transformers.CvtModel(config, add_pooling_layer=False)), 8
    return model, _drawn(batch, 3, 64, 64), from_hf(model).astype(np.float32)


def _grid(name: str):
    """The torch composition, its input, the canonical params and the generated modules' options."""
    import torch

    torch.manual_seed(0)
    if name == "resnet-block":
        conv1, bn1 = torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64)
        conv2, bn2 = torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64)
        layers = torch.nn.ModuleList([conv1, bn1, conv2, bn2])
        reference = lambda x: torch.relu(bn2(conv2(torch.relu(bn1(conv1(x))))) + x)  # noqa: E731
        groups, channels = {"conv1": conv1, "bn1": bn1, "conv2": conv2, "bn2": bn2}, (64, 64)
        u = _drawn(16, 64, 32, 32)
    else:
        down, conv = torch.nn.Conv2d(3, 64, 3, stride=2, padding=1), torch.nn.Conv2d(64, 64, 3, padding=1)
        norm, up = torch.nn.BatchNorm2d(64), torch.nn.ConvTranspose2d(64, 3, 2, stride=2)
        layers = torch.nn.ModuleList([down, conv, norm, up])
        reference = lambda x: x + up(torch.relu(norm(conv(down(x)))))  # noqa: E731
        groups, channels = {"down": down, "conv": conv, "bn": norm, "up": up}, (3, 64)
        u = _drawn(16, 3, 32, 32)
    _random(layers)
    params = {}
    for group, layer in groups.items():
        if isinstance(layer, torch.nn.BatchNorm2d):
            values = {"gain": layer.weight, "bias": layer.bias, "mean": layer.running_mean, "var": layer.running_var}
        else:
            order = (0, 2, 3, 1) if isinstance(layer, torch.nn.ConvTranspose2d) else (1, 2, 3, 0)
            values = {"W": layer.weight.permute(*order), "b": layer.bias}
        params.update({f"{group}.{key}": value.detach().cpu().numpy().copy() for key, value in values.items()})
    return reference, u, params, channels


def torch_call(name: str, role: str, modules: Path):
    """A no-argument function running one inference of ``name`` as ``role`` (``reference``, ``torch``)."""
    from rows import generated

    if name in ("vit", "cvt"):
        model, pixels, adapted = _hf(name)
        if role == "reference":
            return lambda: model(pixel_values=pixels)
        params = adapted.params
        if name == "vit":
            d, d_ff = params["layers.0.ffn.W_1"].shape
            net = generated(modules, "torch", name).Model(n_layers=4, d_model=d, d_ff=d_ff, n_channels=3, n_classes=0,
                                                          **adapted.config)
        else:
            net = generated(modules, "torch", name).Model(3, [64, 192, 384], [1, 2, 3], [256, 768, 1536],
                                                          adapted.config["stages"], n_classes=0,
                                                          eps=adapted.config["eps"])
        net = net.load_params(params).eval()
        return lambda: net(pixels)
    reference, u, params, (n_channels, d) = _grid(name)
    if role == "reference":
        return lambda: reference(u)
    net = generated(modules, "torch", name).Model(n_channels, d).load_params(params).eval()
    return lambda: net(u)


def numpy_inputs(name: str) -> tuple:
    """(args, params, kwargs) of the generated NumPy ``forward`` of ``name``."""
    if name in ("vit", "cvt"):
        _, pixels, adapted = _hf(name)
        return [pixels.numpy()], dict(adapted.params), dict(adapted.config)
    _, u, params, _ = _grid(name)
    return [u.numpy()], params, {}
