"""``make bench``: generated code against ``torch.nn.TransformerEncoderLayer``, as ratios.

Every figure is measured interleaved (reference, candidate, reference, …) in one process;
the ratio is the median of the per-round ratios (candidate / reference, < 1 is faster).
Absolute times are printed for orientation only: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from splitformer.codegen.adapters import from_torch  # noqa: E402
from splitformer.codegen.output import write_files  # noqa: E402
from splitformer.codegen.passes import PASSES  # noqa: E402
from splitformer.codegen.pipeline import generate  # noqa: E402
from splitformer.symbolic import load_scheme  # noqa: E402

#: Idle time before each measured call: BLAS threads of the previous call spin for a while
#: and would otherwise slow the next call down (a 20 ms pause still doubled torch's times).
PAUSE = 0.1
#: Each measurement repeats the call back to back for at least this long (small shapes).
MEASURE = 0.05
SHAPES = {  # name: (batch, tokens, d, heads, d_ff)
    "main": (8, 128, 512, 8, 2048),
    "small": (4, 32, 128, 4, 512),
    "long": (1, 1024, 256, 4, 1024),
}


def _module(folder: Path, backend: str, name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{backend}_{folder.name}", folder / backend / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _repeats(function) -> int:
    """How many back-to-back calls make one measurement of at least ``MEASURE`` seconds."""
    start = time.perf_counter()
    function()
    return max(1, math.ceil(MEASURE / max(time.perf_counter() - start, 1e-6)))


def _interleaved(reference, candidate, rounds: int) -> tuple[float, float, float]:
    """Median ratio candidate/reference and the median times per call (seconds)."""
    reference(), candidate()  # warm up
    repeats = max(_repeats(reference), _repeats(candidate))
    ratios, times_ref, times_cand = [], [], []
    for _ in range(rounds):
        times = []
        for function in (reference, candidate):
            time.sleep(PAUSE)
            start = time.perf_counter()
            for _ in range(repeats):
                function()
            times.append((time.perf_counter() - start) / repeats)
        times_ref.append(times[0])
        times_cand.append(times[1])
        ratios.append(times[1] / times[0])
    return statistics.median(ratios), statistics.median(times_ref), statistics.median(times_cand)


def _flops(batch, tokens, d, heads, d_ff) -> float:
    rows = batch * tokens
    projections = 2 * rows * d * (4 * d + 2 * d_ff)
    attention = 2 * 2 * batch * tokens * tokens * d
    return float(projections + attention)


def _row(label, shape, ratio, t_ref, t_cand, target) -> str:
    gflops = _flops(*shape) / t_cand / 1e9
    verdict = "ok" if ratio <= target else "MISSED"
    return (f"{label:34} {ratio:6.2f}x  (target <= {target:.2f}, {verdict})  "
            f"ref {t_ref * 1e3:8.2f} ms  gen {t_cand * 1e3:8.2f} ms  {gflops:6.1f} GFLOP/s")


def bench_shape(folder: Path, shape_name: str, rounds: int, passes_label: str) -> list[str]:
    batch, tokens, d, heads, d_ff = shape = SHAPES[shape_name]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True).eval()
    params = from_torch(layer)
    numpy_module = _module(folder, "numpy", "post_ln")
    torch_module = _module(folder, "torch", "post_ln")
    block = torch_module.Block(d, heads, d_ff).load_params(params).eval()
    x = torch.randn(batch, tokens, d)
    u = x.numpy()
    lines = []

    def reference_inference():
        with torch.inference_mode():
            layer(x)

    def candidate_inference():
        with torch.inference_mode():
            block(x)

    ratio, t_ref, t_cand = _interleaved(reference_inference, candidate_inference, rounds)
    lines.append(_row(f"[{shape_name}/{passes_label}] torch inference", shape, ratio, t_ref, t_cand, 1.00))

    train_layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True)
    train_layer.load_state_dict(layer.state_dict())
    train_block = torch_module.Block(d, heads, d_ff).load_params(params)

    def reference_training():
        train_layer.zero_grad(set_to_none=True)
        train_layer(x).square().mean().backward()

    def candidate_training():
        train_block.zero_grad(set_to_none=True)
        train_block(x).square().mean().backward()

    ratio, t_ref, t_cand = _interleaved(reference_training, candidate_training, rounds)
    lines.append(_row(f"[{shape_name}/{passes_label}] torch training step", shape, ratio, t_ref, t_cand, 0.90))

    def numpy_forward():
        numpy_module.forward(u, params, n_heads=heads)

    ratio, t_ref, t_cand = _interleaved(reference_inference, numpy_forward, rounds)
    lines.append(_row(f"[{shape_name}/{passes_label}] numpy forward", shape, ratio, t_ref, t_cand, 1.20))
    return lines


def peak_memory(folder: Path) -> str:
    """Peak traced allocation of the NumPy forward against torch's fused path (main shape)."""
    batch, tokens, d, heads, d_ff = SHAPES["main"]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True).eval()
    params = from_torch(layer)
    numpy_module = _module(folder, "numpy", "post_ln")
    x = torch.randn(batch, tokens, d)
    u = x.numpy()
    numpy_module.forward(u, params, n_heads=heads)
    tracemalloc.start()
    numpy_module.forward(u, params, n_heads=heads)
    _, numpy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer(x)
    torch_peak = _torch_peak(prof)
    ratio = numpy_peak / torch_peak
    verdict = "ok" if ratio <= 1.5 else "MISSED"
    return (f"{'[main] numpy peak memory':34} {ratio:6.2f}x  (target <= 1.50, {verdict})  "
            f"ref {torch_peak / 2**20:8.1f} MiB  gen {numpy_peak / 2**20:8.1f} MiB")


def _torch_peak(prof) -> int:
    """Peak of live CPU memory from the profiler's allocation events."""
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.cpu_memory_usage
        peak = max(peak, live)
    return peak


def derive_times(rounds: int = 3) -> list[str]:
    lines = []
    for label, arguments, target in (
        ("derive post-ln --backend all", ["post-ln"], 1.5),
        ("derive all built-ins", ["--all-builtins"], 4.0),
    ):
        times = []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "splitformer.codegen.cli", "derive", *arguments, "--backend", "all",
                                "--out", out], check=True, capture_output=True, cwd=ROOT)
                times.append(time.perf_counter() - start)
        best = statistics.median(times)
        verdict = "ok" if best <= target else "MISSED"
        lines.append(f"{label:34} {best:6.2f} s  (target <= {target:.1f} s, {verdict}, fresh process, median of {rounds})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/benchmark.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shapes", default="main,small,long")
    parser.add_argument("--ablation", action="store_true", help="also measure with each pass switched off")
    arguments = parser.parse_args(argv)
    torch.set_num_threads(2)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    print(f"splitformer benchmark: torch {torch.__version__}, numpy {np.__version__}, "
          f"{torch.get_num_threads()} threads, float32; ratio = generated / reference (median of "
          f"{arguments.rounds} interleaved rounds)")
    variants = {"all passes": None}
    if arguments.ablation:
        variants["no passes"] = ()
        for name in PASSES:
            variants[f"without {name}"] = tuple(p for n, p in PASSES.items() if n != name)
    scheme = load_scheme("post-ln")
    with tempfile.TemporaryDirectory() as scratch:
        folders = {}
        for label, passes in variants.items():
            folder = Path(scratch) / label.replace(" ", "_")
            write_files(generate(scheme, ("numpy", "torch"), folder, passes=passes))
            folders[label] = folder
        for shape in arguments.shapes.split(","):
            for label, folder in folders.items():
                if label != "all passes" and shape != "main":
                    continue
                for line in bench_shape(folder, shape, arguments.rounds, label):
                    print(line, flush=True)
        print(peak_memory(folders["all passes"]))
    for line in derive_times():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
