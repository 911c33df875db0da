"""The benchmark header: CPU model, BLAS libraries and the measured GEMM rate.

    python bench/machine.py [--threads 2]   # prints one JSON object

Ratios between numpy's OpenBLAS and torch's BLAS differ by CPU vendor, so every run records
them; the GEMM rate (float32, 1024×512 @ 512×2048, the FFN's shape) is the physical limit that
the per-figure GFLOP/s are compared with. The elementwise rate (NumPy, ``x·2`` of 8 MB of float32
into another array) is what memory-bound NumPy statements move with; the convolution time (NumPy, nine GEMMs
with K = 64 summed: a 3 × 3 convolution of 16 images 32², 64 channels) what small GEMMs over operands larger
than the caches move with: a shared machine can double it for minutes while the other two stay.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import torch

GEMM = (1024, 512, 2048)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas() -> list[str]:
    """The BLAS/OpenMP libraries loaded by numpy and torch (threadpoolctl), or why not known."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl not installed (pip install 'splitformer[bench]')"]
    return sorted({f"{pool['internal_api']} {pool.get('version') or ''} ({pool['prefix']}, "
                   f"{pool['num_threads']} threads)".replace("  ", " ") for pool in threadpool_info()})


def _median_seconds(call, seconds: float) -> float:
    """The median time of back-to-back calls for ``seconds`` (after three)."""
    for _ in range(3):
        call()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        before = time.perf_counter()
        call()
        times.append(time.perf_counter() - before)
    return statistics.median(times)


def gemm_rate(multiply, a, b, seconds: float = 0.5) -> float:
    """GFLOP/s of back-to-back GEMMs (median call)."""
    m, k, n = GEMM
    return 2 * m * k * n / _median_seconds(lambda: multiply(a, b), seconds) / 1e9


def elementwise_rate(seconds: float = 0.3) -> float:
    """GB/s read and written by back-to-back ``np.multiply(x, 2, out=y)`` over 8 MB of float32 (median call)."""
    x = np.random.default_rng(2).standard_normal(1 << 21, dtype=np.float32)
    y = np.empty_like(x)
    return 2 * x.nbytes / _median_seconds(lambda: np.multiply(x, 2, out=y), seconds) / 1e9


def convolution_ms(seconds: float = 0.5) -> float:
    """ms of back-to-back 3 × 3, 64 → 64 convolutions of 16 images 32² (float32), each written in plain NumPy as nine
    GEMMs with K = 64 over shifted columns of one padded field, summed (median call): what OpenBLAS's small GEMMs and
    the sums of their products move with. A shared machine can double it while the GEMM limit and the elementwise rate
    above stay (10.1 ms at the start of a run, 17.3 at its end, session 19)."""
    width, count = 34, 16 * 34 * 34
    field = np.random.default_rng(3).standard_normal((64, count + 2 * width + 2), dtype=np.float32)
    kernel = np.random.default_rng(4).standard_normal((9, 64, 64), dtype=np.float32)
    out, term = np.empty((64, count), np.float32), np.empty((64, count), np.float32)

    def convolve():
        np.matmul(kernel[0], field[:, :count], out=out)
        for offset in range(1, 9):
            shift = (offset // 3) * width + offset % 3
            np.add(out, np.matmul(kernel[offset], field[:, shift:shift + count], out=term), out=out)
    return _median_seconds(convolve, seconds) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/machine.py", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args(argv)
    torch.set_num_threads(arguments.threads)
    m, k, n = GEMM
    a = np.random.default_rng(0).standard_normal((m, k), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((k, n), dtype=np.float32)
    torch.matmul(torch.from_numpy(a), torch.from_numpy(b))  # load torch's BLAS before listing it
    print(json.dumps({
        "cpu": cpu_model(), "blas": blas(), "numpy": np.__version__, "torch": torch.__version__,
        "gemm_gflops": {"numpy": gemm_rate(np.matmul, a, b),
                        "torch": gemm_rate(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))},
        "elementwise_gbs": elementwise_rate(),
        "convolution_ms": convolution_ms(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
