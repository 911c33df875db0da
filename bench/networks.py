"""The generated networks against the modules a user would pick instead (inference, float32).

vit vs transformers' ``ViTModel`` (16 images 64², patches of 8, d 256, 8 heads, d_ff 1024, 4 layers);
cvt vs ``CvtModel`` (8 images 64², 3 stages: d 64, 192, 384, depths 1, 2, 3, CvT-13's kernels and
strides); resnet-block (16 images 32², 64 channels) and unet-level (16 images 32², 3 → 64 channels)
vs their torch ``Conv2d``/``BatchNorm2d`` compositions. Every figure runs in its own process
(``--worker``): a warm-up, back-to-back calls for ``--seconds``, the median per call; reference
and candidate processes alternate for ``--pairs`` pairs and the ratio of each pair
(candidate / reference) is printed with its median and spread. The NumPy figures are timed
against the same torch reference.

    python bench/networks.py [--pairs 3] [--seconds 1] [--networks vit,cvt] [--modules generated]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = ("vit", "cvt", "resnet-block", "unet-level")
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


def _hf(name: str):
    """The transformers module, its pixels, and the adapter's (params, config)."""
    import numpy as np
    import torch
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
    pixels = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return model, pixels, from_hf(model).astype(np.float32)


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
        u = torch.randn(16, 64, 32, 32, generator=torch.Generator().manual_seed(1))
    else:
        down, conv = torch.nn.Conv2d(3, 64, 3, stride=2, padding=1), torch.nn.Conv2d(64, 64, 3, padding=1)
        norm, up = torch.nn.BatchNorm2d(64), torch.nn.ConvTranspose2d(64, 3, 2, stride=2)
        layers = torch.nn.ModuleList([down, conv, norm, up])
        reference = lambda x: x + up(torch.relu(norm(conv(down(x)))))  # noqa: E731
        groups, channels = {"down": down, "conv": conv, "bn": norm, "up": up}, (3, 64)
        u = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _random(layers)
    params = {}
    for group, layer in groups.items():
        if isinstance(layer, torch.nn.BatchNorm2d):
            values = {"gain": layer.weight, "bias": layer.bias, "mean": layer.running_mean, "var": layer.running_var}
        else:
            order = (0, 2, 3, 1) if isinstance(layer, torch.nn.ConvTranspose2d) else (1, 2, 3, 0)
            values = {"W": layer.weight.permute(*order), "b": layer.bias}
        params.update({f"{group}.{key}": value.detach().numpy().copy() for key, value in values.items()})
    return reference, u, params, channels


def _callable(name: str, role: str, modules: Path):
    """A no-argument function running one inference of ``name`` as ``role`` (reference, torch, numpy)."""
    import importlib.util

    import torch

    def load(backend):
        path = modules / backend / f"{name.replace('-', '_')}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{backend}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    if name in ("vit", "cvt"):
        model, pixels, adapted = _hf(name)
        if role == "reference":
            return lambda: model(pixel_values=pixels)
        if role == "numpy":
            image, numpy = pixels.numpy(), load("numpy")
            return lambda: numpy.forward(image, adapted.params, **adapted.config)
        generated = load("torch")
        params = adapted.params
        if name == "vit":
            d, d_ff = params["layers.0.ffn.W_1"].shape
            net = generated.Model(n_layers=4, d_model=d, d_ff=d_ff, n_channels=3, n_classes=0, **adapted.config)
        else:
            net = generated.Model(3, [64, 192, 384], [1, 2, 3], [256, 768, 1536], adapted.config["stages"],
                                  n_classes=0, eps=adapted.config["eps"])
        net = net.load_params(params).eval()
        return lambda: net(pixels)
    reference, u, params, (n_channels, d) = _grid(name)
    if role == "reference":
        return lambda: reference(u)
    if role == "numpy":
        x, numpy = u.numpy(), load("numpy")
        return lambda: numpy.forward(x, params)
    net = load("torch").Model(n_channels, d).load_params(params).eval()
    return lambda: net(u)


def worker(name: str, role: str, modules: Path, seconds: float) -> float:
    import torch

    function = _callable(name, role, modules)
    with torch.inference_mode():
        for _ in range(1):
            function()
        times, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds or len(times) < 3:
            begin = time.perf_counter()
            function()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def _measure(name: str, role: str, arguments) -> float:
    environment = dict(os.environ, OMP_NUM_THREADS=str(arguments.threads), MKL_NUM_THREADS=str(arguments.threads),
                       OPENBLAS_NUM_THREADS=str(arguments.threads))
    command = [sys.executable, __file__, "--worker", name, role, "--modules", str(arguments.modules),
               "--seconds", str(arguments.seconds), "--threads", str(arguments.threads)]
    output = subprocess.run(command, env=environment, check=True, capture_output=True, text=True).stdout
    return json.loads(output.splitlines()[-1])["seconds"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/networks.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--backends", default="torch,numpy")
    parser.add_argument("--modules", type=Path, default=ROOT / "generated", help="the generated/ folder to time")
    parser.add_argument("--worker", nargs=2, metavar=("NETWORK", "ROLE"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        import torch

        torch.set_num_threads(arguments.threads)
        sys.path.insert(0, str(ROOT))
        print(json.dumps({"seconds": worker(*arguments.worker, arguments.modules, arguments.seconds)}))
        return 0
    print(f"networks, float32, {arguments.threads} threads, inference; ratio = generated / reference "
          f"(median of {arguments.pairs} alternating process pairs, spread min-max)", flush=True)
    for name in arguments.networks.split(","):
        for backend in arguments.backends.split(","):
            pairs = [(_measure(name, "reference", arguments), _measure(name, backend, arguments))
                     for _ in range(arguments.pairs)]
            ratios = [candidate / reference for reference, candidate in pairs]
            print(f"{name:13} {backend:6} [{SHAPES[name]}] reference {1e3 * statistics.median(r for r, _ in pairs):7.1f} ms"
                  f"  generated {1e3 * statistics.median(c for _, c in pairs):7.1f} ms  "
                  f"ratio {statistics.median(ratios):5.2f}x  spread {min(ratios):.2f}-{max(ratios):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
