"""``make bench``: every row of the performance issue, generated code against the module a user
would pick instead, in one table.

    python bench/benchmark.py [--rows 'post-ln/*,cvt/*'] [--pairs 5] [--seconds 1] [--list]

Every figure runs in its own process (``bench/figure.py``): a warm-up, then back-to-back calls
for at least ``--seconds`` (and ``--min-calls``), the median per call. Reference and candidate
processes alternate for ``--pairs`` pairs (the order swapped every other pair); the ratio of
each pair is the figure, printed as the median with its spread and judged against the row's
target (a target inside the spread counts as missed). The header records the CPU, the BLAS
libraries and the measured GEMM rate, the physical limit each row's GFLOP/s is compared with;
the training rows add the memory one forward keeps for the backward pass. ``--interleaved``
runs reference and candidate alternating in this process instead, labelled as such;
``--profile`` prints where the time goes after each row; ``--derive`` adds ``derive`` timings.
The rows are those of ``bench/rows.py`` (``--list`` prints them).
"""

from __future__ import annotations

import argparse
import fnmatch
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

import rows  # noqa: E402
from table import Measured, table  # noqa: E402

DERIVE_TARGETS = (("derive post-ln --backend all", ["post-ln"], 1.5),
                  ("derive all built-ins", ["--all-builtins"], 4.0))


def _environment(threads: int) -> dict[str, str]:
    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return {**os.environ, **{name: str(threads) for name in variables}}


def run(script: str, *arguments: str, threads: int) -> dict:
    """The JSON object ``bench/SCRIPT ARGUMENTS`` prints last, run in its own process with ``threads`` threads."""
    result = subprocess.run([sys.executable, str(BENCH / script), *arguments], capture_output=True,
                            text=True, env=_environment(threads), check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: bench/{script} {' '.join(arguments)} failed:\n{result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def header(threads: int) -> tuple[list[str], dict[str, float]]:
    machine = run("machine.py", "--threads", str(threads), threads=threads)
    gemm = machine["gemm_gflops"]
    lines = [f"splitformer sustained benchmark: torch {machine['torch']}, numpy {machine['numpy']}, "
             f"{threads} threads, float32",
             f"cpu: {machine['cpu']}",
             *(f"blas: {entry}" for entry in machine["blas"]),
             f"GEMM limit (1024x512 @ 512x2048, float32): numpy {gemm['numpy']:.1f} GFLOP/s, "
             f"torch {gemm['torch']:.1f} GFLOP/s",
             _state_line(machine, "at the start")]
    return lines, gemm


def closing(threads: int) -> str:
    """The machine's rates again after the rows: a shared machine changes state within a run."""
    machine = run("machine.py", "--threads", str(threads), threads=threads)
    gemm = machine["gemm_gflops"]
    return (f"{_state_line(machine, 'at the end')}; GEMM numpy {gemm['numpy']:.1f}, "
            f"torch {gemm['torch']:.1f} GFLOP/s")


def _state_line(machine: dict, when: str) -> str:
    """The rates a shared machine's state moves (``bench/machine.py``): memory-bound NumPy statements, small GEMMs."""
    return (f"elementwise rate (numpy, x*2 over 8 MB of float32 into another array) {when}: "
            f"{machine['elementwise_gbs']:.1f} GB/s; a 3x3 convolution as nine K=64 GEMMs summed (numpy, 16 images "
            f"32x32, 64 channels): {machine['convolution_ms']:.1f} ms")


def _figure(name: str, role: str, arguments, *extra: str) -> dict:
    """One figure of row ``name``: in its own process, or in this one with ``--interleaved``."""
    if arguments.interleaved:
        import figure

        return figure.measure(name, role, arguments.modules, arguments.inputs, seconds=arguments.seconds,
                              min_calls=arguments.min_calls, threads=arguments.threads,
                              new_tokens=arguments.new_tokens, with_profile="--profile" in extra)
    return run("figure.py", name, role, "--inputs", str(arguments.inputs), "--modules", str(arguments.modules),
                "--seconds", str(arguments.seconds), "--min-calls", str(arguments.min_calls), "--threads",
                str(arguments.threads), "--new-tokens", str(arguments.new_tokens), *extra, threads=arguments.threads)


def measure(name: str, arguments) -> Measured:
    """``--pairs`` alternating reference/candidate figures of row ``name``."""
    measured = Measured(rows.row(name, new_tokens=arguments.new_tokens))
    for pair in range(arguments.pairs):
        roles = ("reference", "candidate") if pair % 2 == 0 else ("candidate", "reference")
        for role in roles:
            getattr(measured, role).append(_figure(name, role, arguments))
    return measured


def _profiled(name: str, role: str, arguments) -> dict:
    """One short ``--profile`` run of a figure."""
    short = argparse.Namespace(**{**vars(arguments), "seconds": 0.2, "min_calls": 1})
    return _figure(name, role, short, "--profile")


def profile_table(name: str, arguments) -> list[str]:
    """Reference and candidate side by side (ms per call, profiler self time): per kind of work
    with the difference (the gap, and where it is), then the top operators (torch candidates);
    the time of each statement of a generated NumPy ``forward``."""
    if not rows.row(name).imports_torch("candidate"):
        return _profiled(name, "candidate", arguments)["statements"]
    sides = [_profiled(name, role, arguments) for role in ("reference", "candidate")]
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


def selected(patterns: str) -> list[str]:
    """The table's rows matching any of the comma-separated patterns (``fnmatch``, or a row's name)."""
    chosen = [name for name in rows.NAMES if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns.split(","))]
    extra = [pattern for pattern in patterns.split(",") if pattern not in rows.NAMES and not any(
        fnmatch.fnmatchcase(name, pattern) for name in rows.NAMES)]
    for name in extra:
        rows.row(name)  # a row outside the table (the tiny shape) or an error naming the rows
    return chosen + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/benchmark.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="*", help="comma-separated row names or patterns (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    parser.add_argument("--pairs", type=int, default=5, help="reference/candidate process pairs per row")
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back time per process")
    parser.add_argument("--min-calls", type=int, default=3, help="at least this many timed calls per process")
    parser.add_argument("--new-tokens", type=int, default=rows.NEW_TOKENS, help="decoding rows: tokens after the prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modules", type=Path, default=ROOT / "generated", help="the generated modules timed")
    parser.add_argument("--profile", action="store_true", help="where the time goes, after each row")
    parser.add_argument("--derive", action="store_true", help="add cold and warm derive timings")
    parser.add_argument("--interleaved", action="store_true", help="reference and candidate in this process (labelled)")
    arguments = parser.parse_args(argv)
    names = selected(arguments.rows)
    if arguments.list:
        print("\n".join(f"{name:24} {rows.row(name).shapes}" for name in names))
        return 0
    os.environ.update(_environment(arguments.threads))
    lines, gemm = header(arguments.threads)
    mode = ("IN-PROCESS interleaved (not the sustained figures)" if arguments.interleaved
            else "each figure in its own process")
    lines.append(f"{arguments.pairs} alternating pairs per row, {mode}, >= {arguments.seconds} s and "
                 f">= {arguments.min_calls} calls each; load average {os.getloadavg()[0]:.1f} at the start")
    print("\n".join(lines), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as inputs:
        arguments.inputs = Path(inputs)
        for name in names:
            rows.row(name, new_tokens=arguments.new_tokens).prepare(arguments.inputs)
            results.append(measure(name, arguments))
            print(table(results[-1:], gemm)[-1], flush=True)
            if arguments.profile:
                print("\n".join(profile_table(name, arguments)), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end", flush=True)
    lines.append(closing(arguments.threads))
    print("\n".join(["", *lines, "", *table(results, gemm)]), flush=True)
    if arguments.derive:
        print("\n".join(derive_lines()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
