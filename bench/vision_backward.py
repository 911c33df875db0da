"""Training step of the generated vision models (vit, cvt): derived backward against autograd.

Every figure comes from its own process (``--worker``): memory = the bytes of the activations
kept for the backward pass (the storages autograd's ``saved_tensors_hooks`` sees, plus the
tensors a derived ``autograd.Function`` keeps on its ``ctx``; parameters and the image
excluded) and the peak resident set growth of one training step (after a warm-up step on a
one-image batch); time = the median of back-to-back steps. One thread per process.

    python bench/vision_backward.py [--calls 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: vit: 32 × 32 images, patches of 4 (65 tokens), d = 128, 4 heads, d_ff = 512, 4 layers, 10 classes.
VIT = dict(n_layers=4, d_model=128, n_heads=4, d_ff=512, n_channels=3, patch_size=4, image_size=(32, 32), n_classes=10)
#: cvt: 56 × 56 images, three stages (CvT-13's kernels and strides; 14², 7², 4² grids, d = 64, 128, 192,
#: depths 1, 2, 2, d_ff = 4d), the class node in the last stage, 10 classes.
_STAGE = dict(kernel_qkv=3, stride_q=1, padding_q=1, stride_kv=2, padding_kv=1)
CVT = dict(n_channels=3, embed_dims=[64, 128, 192], depths=[1, 2, 2], d_ffs=[256, 512, 768], n_classes=10,
           stages=[dict(_STAGE, patch_size=7, patch_stride=4, patch_padding=2, n_heads=1, cls=False),
                   dict(_STAGE, patch_size=3, patch_stride=2, patch_padding=1, n_heads=2, cls=False),
                   dict(_STAGE, patch_size=3, patch_stride=2, patch_padding=1, n_heads=3, cls=True)])
SIZES = {"vit": (8, 32), "cvt": (8, 56)}


def _model(name: str, mode: str):
    import importlib

    import torch

    module = importlib.import_module(f"generated.torch.{name}")
    torch.manual_seed(0)
    model = module.Model(**(VIT if name == "vit" else CVT), backward=mode)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
            if parameter_name.endswith(".var"):
                parameter.abs_().add_(0.5)
    return model


def _worker(name: str, mode: str, calls: int) -> dict:
    import torch

    from sources import kept_bytes

    torch.set_num_threads(1)
    model = _model(name, mode)
    batch, side = SIZES[name]
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(batch, 3, side, side, generator=generator)
    model.logits(pixels[:1]).sum().backward()  # warm-up on one image
    model.zero_grad(set_to_none=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kept, logits = kept_bytes(lambda: model.logits(pixels), [*model.parameters(), pixels])
    logits.backward(logits.detach())  # J = ½‖logits‖²
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    times = []
    for _ in range(calls):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logits = model.logits(pixels)
        logits.backward(logits.detach())
        times.append(time.perf_counter() - start)
    return {"kept_mib": kept / 2**20, "peak_mib": peak / 1024, "step_ms": 1e3 * statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker, args.calls)))
        return
    print("| model | backward | kept for backward | peak RSS growth | step (median) |")
    print("| --- | --- | --- | --- | --- |")
    for name in SIZES:
        for mode in ("autograd", "derived"):
            result = subprocess.run([sys.executable, __file__, "--worker", name, mode, "--calls", str(args.calls)],
                                    check=True, capture_output=True, text=True, cwd=ROOT)
            figures = json.loads(result.stdout)
            print(f"| {name} | {mode} | {figures['kept_mib']:.1f} MiB | {figures['peak_mib']:.1f} MiB | "
                  f"{figures['step_ms']:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
