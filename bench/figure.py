"""One benchmark figure in one process: warm up, then back-to-back calls, print JSON.

    python bench/figure.py ROW ROLE --inputs DIR [--modules generated] [--seconds S] [--profile]
    python bench/figure.py ROW candidate --inputs DIR --prepare    # write a NumPy row's inputs first

``ROW`` names a row of ``bench/rows.py`` (``post-ln/N128/torch``, ``cvt/numpy``, …); ``ROLE`` is
``reference`` (the module a user would pick instead) or ``candidate`` (the generated code in
``--modules``). A NumPy candidate reads its weights and inputs from ``--inputs`` (written by
``bench/benchmark.py``), so its process never imports torch. The process measures sustained
throughput as a user's loop sees it: nothing pauses between calls, so BLAS threads that spin
after a call are part of what the next call pays. The output is one JSON object with the
median time per call, the number of calls, the achieved GFLOP/s (rows that count their GEMMs),
the page faults per call (memory the allocator gave back to the system and the next call
touches afresh: a cost of allocation patterns, not of arithmetic) and, for a training row, the
bytes one forward keeps for the backward pass; ``--profile`` adds the top operators of a
``torch.profiler`` run (torch processes) or the per-statement table of a generated NumPy
``forward`` (``bench/numpy_profile.py``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from operators import by_kind  # noqa: E402
from rows import Seconds, Timed, generated, row  # noqa: E402

ROLES = ("reference", "candidate")
WARM_UP_SECONDS = 0.3


def sustained(timed: Timed, seconds: float, min_calls: int = 5, synchronize=lambda: None) -> list[float]:
    """Per-call times of back-to-back calls for at least ``seconds`` and ``min_calls`` calls (after
    a warm-up), ``synchronize()`` (a device's) after each; a call returning ``Seconds`` gives its own time."""
    warm_up = timed.warm_up or timed.call
    start = time.perf_counter()
    while True:
        warm_up()
        if time.perf_counter() - start >= WARM_UP_SECONDS:
            break
    synchronize()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < min_calls:
        before = time.perf_counter()
        result = timed.call()
        synchronize()
        times.append(result if isinstance(result, Seconds) else time.perf_counter() - before)
    return times


def profile(function, rows: int = 8) -> tuple[list[dict], dict[str, float]]:
    """The top operators by self CPU time over a few calls, and ms per call per kind (torch figures)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            function()
    averages = sorted(prof.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total = sum(event.self_cpu_time_total for event in averages) or 1
    top = [{"op": event.key, "ms_per_call": event.self_cpu_time_total / 3 / 1e3,
            "share": event.self_cpu_time_total / total, "calls": event.count // 3}
           for event in averages[:rows]]
    return top, by_kind([(event.key, event.self_cpu_time_total / 3 / 1e3) for event in averages])


def measure(name: str, role: str, modules: Path, inputs: Path, *, seconds: float = 1.0, min_calls: int = 5,
            threads: int = 2, new_tokens: int | None = None, with_profile: bool = False, device: str = "cpu") -> dict:
    """One figure of row ``name`` as ``role``: the JSON object this process prints. A torch row on another
    ``device`` is built there (``torch.device``) and the device synchronized after each call."""
    the_row = row(name) if new_tokens is None else row(name, new_tokens=new_tokens)
    synchronize = lambda: None  # noqa: E731
    if the_row.imports_torch(role):
        import torch

        torch.set_num_threads(threads)
        if torch.device(device).type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32's figures
            synchronize = lambda: torch.cuda.synchronize(device)  # noqa: E731
        with torch.device(device):
            timed = the_row.timed(role, modules, inputs)
    else:
        timed = the_row.timed(role, modules, inputs)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = sustained(timed, seconds, min_calls, synchronize)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(times)  # warm-up calls: a few more
    median = statistics.median(times)
    result = {"row": name, "role": role, "median_s": median, "calls": len(times), "page_faults_per_call": faults}
    if the_row.flops:
        result["gflops"] = the_row.flops / median / 1e9
    if timed.kept is not None:
        result["kept_bytes"] = timed.kept()
    if with_profile and not the_row.imports_torch(role):
        from numpy_profile import profile_lines

        result["statements"] = profile_lines(timed.call, generated(modules, "numpy", the_row.profiled_module))
    elif with_profile:
        result["profile"], result["kinds"] = profile(timed.call)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/figure.py", description=__doc__.splitlines()[0])
    parser.add_argument("row", help="a row of bench/rows.py, e.g. post-ln/N128/torch")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--inputs", type=Path, required=True, help="folder of the NumPy candidates' inputs")
    parser.add_argument("--modules", type=Path, default=ROOT / "generated", help="folder with numpy/ and torch/ modules")
    parser.add_argument("--seconds", type=float, default=1.0, help="measured back-to-back time (default 1 s)")
    parser.add_argument("--min-calls", type=int, default=5, help="at least this many timed calls (default 5)")
    parser.add_argument("--new-tokens", type=int, help="decoding rows: tokens generated after the prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="where a torch row is built and run (bench/gpu.py: cuda)")
    parser.add_argument("--profile", action="store_true", help="add a torch.profiler operator table (torch) or a per-statement table (NumPy)")
    parser.add_argument("--prepare", action="store_true", help="write the row's NumPy inputs to --inputs and exit")
    arguments = parser.parse_args(argv)
    if arguments.prepare:
        arguments.inputs.mkdir(parents=True, exist_ok=True)
        row(arguments.row).prepare(arguments.inputs)
        return 0
    print(json.dumps(measure(arguments.row, arguments.role, arguments.modules, arguments.inputs,
                             seconds=arguments.seconds, min_calls=arguments.min_calls, threads=arguments.threads,
                             new_tokens=arguments.new_tokens, with_profile=arguments.profile,
                             device=arguments.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
