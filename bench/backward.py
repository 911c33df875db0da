"""Training step of a generated Block (post-ln, llama, decoder): derived backward against autograd.

Every figure comes from its own process (``--worker``): time = median of back-to-back
training steps (forward, backward) after a warm-up; memory = the peak resident set growth of
one step (after a warm-up step on a tiny input), and the bytes of the tensors kept for the backward pass (``saved_tensors_hooks``
sees autograd's saved tensors and ``ctx.save_for_backward`` alike). The two backward modes
alternate round by round. One thread per process (the machine is shared).

    python bench/backward.py [--rounds 5] [--calls 10] [--size B,N,d,H,d_ff] [--scheme post-ln]

``llama`` runs with ``n_kv_heads = H/2`` (grouped queries); ``decoder`` with a memory of ``N/2``
tokens (its gradient is part of the step). The bytes kept by torch's own layer and by the
NumPy ``vjp`` are measured for ``post-ln``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SCHEMES = ("post-ln", "llama", "decoder")


def _block(mode: str, size: tuple[int, ...], scheme: str = "post-ln"):
    """The block and its inputs (the state; a decoder's memory), every one requiring its gradient."""
    import importlib

    import torch

    module = importlib.import_module(f"generated.torch.{scheme.replace('-', '_')}")
    batch, tokens, d, heads, d_ff = size
    torch.manual_seed(0)
    options = {"n_kv_heads": max(1, heads // 2)} if scheme == "llama" else {}
    block = module.Block(d, heads, d_ff, backward=mode, **options)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    inputs = [torch.randn(batch, tokens, d, requires_grad=True)]
    if scheme == "decoder":
        inputs.append(torch.randn(batch, max(1, tokens // 2), d, requires_grad=True))
    return block, inputs


def _step(block, inputs):
    out = block(*inputs)
    out.backward(out.detach())  # J = ½‖out‖²
    block.zero_grad(set_to_none=True)
    for tensor in inputs:
        tensor.grad = None


def worker(mode: str, figure: str, size: tuple[int, ...], calls: int, scheme: str = "post-ln") -> dict:
    import torch

    torch.set_num_threads(1)
    block, inputs = _block(mode, size, scheme)
    if figure == "time":
        for _ in range(2):
            _step(block, inputs)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            _step(block, inputs)
            times.append(time.perf_counter() - start)
        return {"seconds": statistics.median(times)}
    from sources import kept_bytes

    _step(*_block(mode, (1, 8, *size[2:]), scheme))  # one-time costs (kernels, pools) outside the figure
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    activations, out = kept_bytes(lambda: block(*inputs), [*block.parameters(), *inputs])
    out.backward(out.detach())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {"peak_kib": peak, "saved_bytes": activations}


def kept_elsewhere(size: tuple[int, ...]) -> dict:
    """Bytes kept for the backward by torch's own layer (autograd) and by the NumPy ``vjp``."""
    import torch

    from generated.numpy import post_ln
    from sources import kept_bytes

    batch, tokens, d, heads, d_ff = size
    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True).eval()
    u = torch.randn(batch, tokens, d, requires_grad=True)
    kept, _ = kept_bytes(lambda: layer(u), [*layer.parameters(), u])
    from splitformer.codegen.adapters import from_torch

    params = from_torch(layer)
    _, saved = post_ln._vjp_forward(u.detach().numpy(), params, None, 1e-5, heads)
    buffers = {id(array.base if array.base is not None else array): array.nbytes for array in saved}
    return {"torch_layer": kept, "numpy_vjp": sum(buffers.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--size", default="8,128,256,4,1024")
    parser.add_argument("--scheme", choices=SCHEMES, default="post-ln")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "FIGURE"))
    arguments = parser.parse_args(argv)
    size = tuple(int(part) for part in arguments.size.split(","))
    if arguments.worker:
        result = kept_elsewhere(size) if arguments.worker[0] == "elsewhere" else worker(*arguments.worker, size,
                                                                                          arguments.calls,
                                                                                          arguments.scheme)
        print(json.dumps(result))
        return 0
    results = {(mode, figure): [] for mode in ("autograd", "derived") for figure in ("time", "memory")}
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for round_number in range(arguments.rounds):
        modes = ("autograd", "derived") if round_number % 2 == 0 else ("derived", "autograd")
        for figure in ("time", "memory"):
            for mode in modes:
                output = subprocess.run([sys.executable, __file__, "--worker", mode, figure, "--size", arguments.size,
                                         "--calls", str(arguments.calls), "--scheme", arguments.scheme], check=True,
                                        capture_output=True, text=True, env=env).stdout
                results[(mode, figure)].append(json.loads(output))
    print(f"{arguments.scheme} Block training step, float32, (B, N, d, H, d_ff) = {size}, 1 thread, "
          f"{arguments.rounds} rounds × {arguments.calls} calls")
    for mode in ("autograd", "derived"):
        times = sorted(1e3 * r["seconds"] for r in results[(mode, "time")])
        peaks = sorted(r["peak_kib"] / 1024 for r in results[(mode, "memory")])
        saved = results[(mode, "memory")][0]["saved_bytes"] / 2**20
        print(f"  {mode:9} step {statistics.median(times):7.1f} ms (range {times[0]:.1f}–{times[-1]:.1f})  "
              f"peak RSS growth {statistics.median(peaks):6.1f} MiB (range {peaks[0]:.1f}–{peaks[-1]:.1f})  "
              f"kept for backward {saved:6.1f} MiB")
    if arguments.scheme == "post-ln":
        elsewhere = json.loads(subprocess.run([sys.executable, __file__, "--worker", "elsewhere", "kept", "--size",
                                               arguments.size], check=True, capture_output=True, text=True,
                                              env=env).stdout)
        print(f"  kept for backward by torch.nn.TransformerEncoderLayer (autograd): "
              f"{elsewhere['torch_layer'] / 2**20:.1f} MiB; by the NumPy vjp: {elsewhere['numpy_vjp'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
