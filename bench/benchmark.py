"""``make bench``: sustained throughput of the generated post-ln block and networks against torch, as ratios.

Each figure runs in its own process (``bench/figure.py``): a warm-up, then back-to-back calls
for at least ``--seconds``, the median per call. Reference and candidate processes alternate
for ``--pairs`` pairs; the ratio of each pair (candidate / reference, < 1 is faster) is printed
with their median and spread. The header records the CPU, the BLAS libraries and the measured
GEMM rate, the physical limit each figure's GFLOP/s is compared with. ``--interleaved`` is the
older in-process mode (reference and candidate alternating in one process), labelled as such.
The network rows (vit, cvt, resnet-block, unet-level) come from ``bench/networks.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import networks  # noqa: E402
from networks import NETWORKS  # noqa: E402
from shapes import SHAPES  # noqa: E402

#: figure: (label, target ratio).
TARGETS = {
    "torch-inference": ("torch inference", 1.00),
    "torch-training": ("torch training step", 0.90),
    "numpy-forward": ("numpy forward", 1.20),
}
#: The reference of the NumPy figure is torch's fused inference path.
REFERENCE_FIGURE = {"numpy-forward": "torch-inference"}
DERIVE_TARGETS = (("derive post-ln --backend all", ["post-ln"], 1.5),
                  ("derive all built-ins", ["--all-builtins"], 4.0))


def _environment(threads: int) -> dict[str, str]:
    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return {**os.environ, **{name: str(threads) for name in variables}}


def _run(script: str, *arguments: str, threads: int) -> dict:
    result = subprocess.run([sys.executable, str(BENCH / script), *arguments], capture_output=True,
                            text=True, env=_environment(threads), check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: bench/{script} {' '.join(arguments)} failed:\n{result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def header(threads: int) -> tuple[list[str], dict[str, float]]:
    machine = _run("machine.py", "--threads", str(threads), threads=threads)
    gemm = machine["gemm_gflops"]
    lines = [f"splitformer sustained benchmark: torch {machine['torch']}, numpy {machine['numpy']}, "
             f"{threads} threads, float32",
             f"cpu: {machine['cpu']}",
             *(f"blas: {entry}" for entry in machine["blas"]),
             f"GEMM limit (1024x512 @ 512x2048, float32): numpy {gemm['numpy']:.1f} GFLOP/s, "
             f"torch {gemm['torch']:.1f} GFLOP/s"]
    return lines, gemm


def measure(figure: str, shape: str, modules: Path, arguments) -> tuple[list[float], dict, dict]:
    """Per-pair ratios and the last reference and candidate results."""
    common = [shape, "--modules", str(modules), "--seconds", str(arguments.seconds), "--threads", str(arguments.threads)]
    ratios, reference, candidate = [], {}, {}
    for _ in range(arguments.pairs):
        reference = _run("figure.py", REFERENCE_FIGURE.get(figure, figure), "reference", *common, threads=arguments.threads)
        candidate = _run("figure.py", figure, "candidate", *common, threads=arguments.threads)
        ratios.append(candidate["median_s"] / reference["median_s"])
    return ratios, reference, candidate


def figure_line(figure: str, shape: str, ratios: list[float], reference: dict, candidate: dict,
                gemm: dict[str, float]) -> str:
    label, target = TARGETS[figure]
    ratio = statistics.median(ratios)
    limit = gemm["numpy" if figure == "numpy-forward" else "torch"]
    verdict = "ok" if ratio <= target else "MISSED"
    return (f"[{shape}] {label:20} {ratio:5.2f}x  spread {min(ratios):.2f}-{max(ratios):.2f} over "
            f"{len(ratios)} pairs  (target <= {target:.2f}, {verdict})  ref {reference['median_s'] * 1e3:7.2f} ms  "
            f"gen {candidate['median_s'] * 1e3:7.2f} ms  {candidate['gflops']:5.1f} GFLOP/s "
            f"= {candidate['gflops'] / limit:4.0%} of the GEMM limit  page faults per call: ref "
            f"{reference['page_faults_per_call']:.0f}, gen {candidate['page_faults_per_call']:.0f}")


def _profiled(figure: str, role: str, shape: str, modules: Path, arguments) -> dict:
    """One short ``--profile`` run of a figure."""
    return _run("figure.py", figure, role, shape, "--modules", str(modules), "--seconds", "0.2",
                "--threads", str(arguments.threads), "--profile", threads=arguments.threads)


def profile_table(figure: str, shape: str, modules: Path, arguments) -> list[str]:
    """Reference and candidate side by side (ms per call, profiler self time): per kind of work
    with the difference (the gap, and where it is), then the top operators."""
    sides = [_profiled(figure, role, shape, modules, arguments) for role in ("reference", "candidate")]
    kinds = [side["kinds"] for side in sides]
    lines = [f"    {'where the time goes':44} {'ref ms':>8} {'gen ms':>8} {'gen - ref':>10}"]
    for label in kinds[0]:
        reference, candidate = kinds[0][label], kinds[1][label]
        lines.append(f"    {label:44} {reference:8.2f} {candidate:8.2f} {candidate - reference:+10.2f}")
    totals = [sum(side.values()) for side in kinds]
    lines.append(f"    {'total (profiled)':44} {totals[0]:8.2f} {totals[1]:8.2f} {totals[1] - totals[0]:+10.2f}")
    lines.append(f"    {'reference op':34} {'ms':>7} {'share':>6}   {'generated op':34} {'ms':>7} {'share':>6}")
    for left, right in zip(sides[0]["profile"], sides[1]["profile"]):
        lines.append(f"    {left['op'][:34]:34} {left['ms_per_call']:7.2f} {left['share']:6.0%}   "
                     f"{right['op'][:34]:34} {right['ms_per_call']:7.2f} {right['share']:6.0%}")
    return lines


def statement_table(shape: str, modules: Path, arguments) -> list[str]:
    """Where a call of the generated NumPy forward spends its time, statement by statement."""
    return _profiled("numpy-forward", "candidate", shape, modules, arguments)["statements"]


def _children_cpu() -> float:
    """User + system time of the finished child processes (their own workers included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def derive_lines(rounds: int = 3) -> list[str]:
    """Cold (empty cache) and warm ``derive`` times, each in a fresh process: wall time (what a
    user waits; several schemes are derived by one worker per core) and CPU time (all processes)."""
    lines = []
    for label, arguments, target in DERIVE_TARGETS:
        cold, warm, cold_cpu, warm_cpu = [], [], [], []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
                for times, cpu in ((cold, cold_cpu), (warm, warm_cpu)):
                    start, start_cpu = time.perf_counter(), _children_cpu()
                    subprocess.run([sys.executable, "-m", "splitformer", "derive", *arguments, "--backend", "all",
                                    "--out", out], check=True, capture_output=True,
                                   env={**os.environ, "SPLITFORMER_CACHE": cache})
                    times.append(time.perf_counter() - start)
                    cpu.append(_children_cpu() - start_cpu)
        verdict = "ok" if statistics.median(cold) <= target else "MISSED"
        lines.append(f"{label:30} cold {statistics.median(cold):5.2f} s (target <= {target:.1f} s, {verdict}; "
                     f"CPU {statistics.median(cold_cpu):5.2f} s)  warm {statistics.median(warm):5.2f} s "
                     f"(CPU {statistics.median(warm_cpu):5.2f} s)  (fresh processes, median of {rounds})")
    return lines


def interleaved(figure: str, shape: str, modules: Path, arguments) -> str:
    """The in-process mode: reference and candidate alternating in this process."""
    import torch

    from figure import build, sustained

    torch.set_num_threads(arguments.threads)
    reference = build(REFERENCE_FIGURE.get(figure, figure), "reference", shape, modules)
    candidate = build(figure, "candidate", shape, modules)
    ratios = [statistics.median(sustained(candidate, arguments.seconds)) /
              statistics.median(sustained(reference, arguments.seconds)) for _ in range(arguments.pairs)]
    label, target = TARGETS[figure]
    return (f"[{shape}] {label:20} {statistics.median(ratios):5.2f}x  spread {min(ratios):.2f}-{max(ratios):.2f} "
            f"(IN-PROCESS interleaved, not the sustained figure; target <= {target:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/benchmark.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="reference/candidate process pairs per figure")
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back time per process")
    parser.add_argument("--shapes", default="N128,N1024", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--figures", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-profile", action="store_true", help="skip the operator and statement tables")
    parser.add_argument("--no-derive", action="store_true", help="skip the derive timings")
    parser.add_argument("--interleaved", action="store_true", help="the older in-process mode (labelled)")
    parser.add_argument("--networks", default=",".join(NETWORKS),
                        help=f"comma-separated, of {', '.join(NETWORKS)}; 'none' for no network rows")
    arguments = parser.parse_args(argv)
    os.environ.update(_environment(arguments.threads))
    from splitformer.codegen.output import write_files
    from splitformer.codegen.pipeline import generate
    from splitformer.symbolic import load_scheme

    lines, gemm = header(arguments.threads)
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as modules:
        write_files(generate(load_scheme("post-ln"), ("numpy", "torch"), Path(modules)))
        from figure import write_inputs

        for shape in arguments.shapes.split(","):
            write_inputs(shape, Path(modules))
        for shape in arguments.shapes.split(","):
            for figure in arguments.figures.split(","):
                if arguments.interleaved:
                    print(interleaved(figure, shape, Path(modules), arguments), flush=True)
                    continue
                print(figure_line(figure, shape, *measure(figure, shape, Path(modules), arguments), gemm), flush=True)
                if not arguments.no_profile:
                    table = (statement_table(shape, Path(modules), arguments) if figure == "numpy-forward"
                             else profile_table(figure, shape, Path(modules), arguments))
                    print("\n".join(table), flush=True)
    if arguments.networks != "none":
        networks.main(["--networks", arguments.networks, "--threads", str(arguments.threads),
                       "--pairs", str(arguments.pairs), "--seconds", str(arguments.seconds)])
    if not arguments.no_derive:
        print("\n".join(derive_lines()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
