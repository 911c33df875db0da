"""The torch table of ``make bench`` on a CUDA device, when one is present (otherwise it says so).

    python bench/gpu.py [--shapes N128,N1024] [--pairs 5] [--seconds 1.0]

For each shape: the generated post-ln ``Block`` against ``torch.nn.TransformerEncoderLayer``
(the same weights), inference and a training step (forward, backward, SGD update), float32, on
``cuda``. Each call is timed with CUDA events after a warm-up; reference and candidate alternate
for ``--pairs`` rounds of back-to-back calls, and the median ratio (candidate / reference, < 1
is faster) is printed with its spread. Before timing, the generated forward runs once under
``torch.cuda.set_sync_debug_mode("error")``: a host synchronization in its forward fails the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from shapes import SHAPES  # noqa: E402

FIGURES = ("torch-inference", "torch-training")
WARM_UP_SECONDS = 0.3


def _timed(function, seconds: float) -> float:
    """Median milliseconds per call of back-to-back calls (CUDA events), after a warm-up."""
    import torch

    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP_SECONDS:
        function()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        function()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def _modules(shape: str):
    """The reference layer and the generated ``Block`` on ``cuda``, and the input there."""
    from rows import generated
    from sources import block_source

    _, _, d, heads, d_ff = SHAPES[shape]
    reference, adapted, inputs = block_source("post-ln", *SHAPES[shape])
    candidate = generated(ROOT / "generated", "torch", "post-ln").Block(d, heads, d_ff, device="cuda")
    return reference.to("cuda"), candidate.load_params(adapted.params), inputs[0].to("cuda")


def _no_host_sync(candidate, x) -> None:
    """The generated forward under CUDA's sync debug mode "error" (a host sync raises)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            candidate(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="N128,N1024", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back time per round")
    arguments = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"no CUDA device is present (torch {torch.__version__}): the GPU table is not measured")
        return 0
    from sources import timed_call

    print(f"splitformer GPU benchmark: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, float32")
    for shape in arguments.shapes.split(","):
        reference, candidate, x = _modules(shape)
        _no_host_sync(candidate, x)
        for figure in FIGURES:
            training = figure == "torch-training"
            functions = [timed_call(module, [x], training).call for module in (reference, candidate)]
            ratios, times = [], []
            for _ in range(arguments.pairs):
                times = [_timed(function, arguments.seconds) for function in functions]
                ratios.append(times[1] / times[0])
            print(f"[{shape}] {figure:16} {statistics.median(ratios):5.2f}x  spread {min(ratios):.2f}-"
                  f"{max(ratios):.2f} over {len(ratios)} pairs  ref {times[0]:7.3f} ms  gen {times[1]:7.3f} ms",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
