"""``make demo``: check generated code against ``torch.nn.TransformerEncoderLayer``.

Loads the generated NumPy and PyTorch modules of a scheme from the output folder, builds a
torch layer whose parameters *all* get random values, and prints the largest difference
for each backend, precision and torch execution path.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

__all__ = ["main", "load_generated", "random_layer"]

#: Schemes the demo knows a torch reference for: name → ``norm_first``.
REFERENCES = {"post-ln": False, "pre-ln": True}


def load_generated(out: Path, backend: str, name: str) -> ModuleType:
    """Import ``out/<backend>/<name>.py`` by path."""
    path = out / backend / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"splitformer_generated_{backend}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_layer(d: int, n_heads: int, d_ff: int, eps: float, norm_first: bool, seed: int, activation: str = "relu"):
    """A float64 torch encoder layer whose every parameter is random (biases and gains too)."""
    import torch

    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(
        d, n_heads, d_ff, dropout=0.0, activation=activation, layer_norm_eps=eps,
        batch_first=True, norm_first=norm_first, dtype=torch.float64,
    ).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    return layer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m splitformer.codegen.demo")
    parser.add_argument("scheme", choices=sorted(REFERENCES))
    parser.add_argument("--out", default="generated")
    arguments = parser.parse_args(argv)
    name = arguments.scheme.replace("-", "_")
    try:
        import torch
    except ImportError:
        print("error: the demo compares against PyTorch: pip install 'splitformer[torch]'", file=sys.stderr)
        return 2
    for backend in ("numpy", "torch"):
        if not (Path(arguments.out) / backend / f"{name}.py").is_file():
            print(f"error: no {Path(arguments.out) / backend / f'{name}.py'}: run "
                  f"splitformer derive {arguments.scheme} --backend all --out {arguments.out}", file=sys.stderr)
            return 2

    from .adapters import from_torch

    numpy_module = load_generated(Path(arguments.out), "numpy", name)
    torch_module = load_generated(Path(arguments.out), "torch", name)
    d, n_heads, d_ff, eps = 16, 4, 40, 1e-5
    layer = random_layer(d, n_heads, d_ff, eps, REFERENCES[arguments.scheme], seed=0)
    params = from_torch(layer)
    u = np.random.default_rng(0).standard_normal((3, 7, d))
    print(f"{arguments.scheme} against torch.nn.TransformerEncoderLayer "
          f"(d={d}, heads={n_heads}, d_ff={d_ff}, eps={eps}, all parameters random)")
    print(f"{'backend':8} {'dtype':8} {'reference path':16} {'max |diff|':>11}  tolerance")
    failures = 0
    for dtype, tolerance in ((np.float64, 1e-10), (np.float32, 1e-4)):
        torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
        reference_layer = layer.to(torch_dtype)
        block = torch_module.Block(d, n_heads, d_ff, eps=eps, dtype=torch_dtype).load_params(params).eval()
        x = torch.tensor(u.astype(dtype))
        numpy_params = {key: value.astype(dtype) for key, value in params.items()}
        for path, grad in (("no_grad (fused)", False), ("autograd", True)):
            with torch.set_grad_enabled(grad):
                reference = reference_layer(x).detach().numpy()
                candidates = {
                    "numpy": numpy_module.forward(u.astype(dtype), numpy_params, n_heads=n_heads, eps=eps),
                    "torch": block(x).detach().numpy(),
                }
            for backend, value in candidates.items():
                error = float(np.max(np.abs(value - reference)))
                ok = error <= tolerance and value.dtype == dtype
                failures += not ok
                print(f"{backend:8} {np.dtype(dtype).name:8} {path:16} {error:11.2e}  {tolerance:.0e} {'ok' if ok else 'FAIL'}")
    print("all checks hold" if not failures else f"{failures} check(s) failed")
    print("Networks (docs/guide/networks.md): splitformer derive vit cvt resnet-block unet-level; splitformer check vit cvt")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
