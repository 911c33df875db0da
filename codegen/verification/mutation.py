"""Mutation testing of the scheme pipeline: does ``check`` plus the fast tests notice?

A small driver (mutmut and cosmic-ray expect one source folder per import name, and this
repository maps three folders under ``splitformer``). Each worker copies the repository to a
temporary folder and links the copied ``symbolic/``, ``codegen/``, ``templates/`` into the
copied ``splitformer/`` (which the kill command, run from the copy, imports first); for each
sampled mutant it rewrites one file, runs the kill command and restores the file. The
repository itself is never modified.

Population: ``symbolic/`` and ``codegen/`` except ``EXCLUDED`` (the verification code
itself, wording and file output, demos, adapters, and the whole-model vision pipeline,
which ``splitformer check vit …`` and its own tests verify). Mutation operators (AST):
``+ ↔ −``, ``* ↔ /``, ``** → *``, comparison flips (``< ↔ <=``, ``> ↔ >=``, ``== ↔ !=``),
``and ↔ or``, integer constants ``n → n + 1``, ``True ↔ False``.

Kill command, stopping at the first failure: the fast tests related to the mutated file
(``RELATED``), then the committed ``generated/`` files of ``GOLDEN`` (the suite's golden test,
on a few built-ins), then the checks of ``CHECKED`` (built-ins and the user scheme files of
``tests/schemes``) stopping at the first check that fails, then the core fast tests. A
mutant is killed when the command fails or times out. One thread per process (``*_NUM_THREADS
= 1``), so a mutant's CPU time is what it takes on an idle core; the summary gives the CPU
total and the idle runtime it implies for the number of workers.

    python -m splitformer.codegen.verification.mutation [--sample N] [--seed S] [--jobs J] [--timeout T]
                                                        [--select PATH:LINE …]
"""

from __future__ import annotations

import argparse
import ast
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "mutants", "related_tests", "kill_stages", "main"]

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("symbolic", "codegen")
#: Not mutated: the verification code itself, wording and file output, demos, adapters, and
#: the whole-model (vision) pipeline.
EXCLUDED = ("codegen/verification/", "symbolic/references.py", "symbolic/vision_references.py",
            "symbolic/projection_verifiers.py", "symbolic/evaluate.py",
            "codegen/cli.py", "codegen/report.py", "codegen/report_adjoint.py", "codegen/model_report.py",
            "codegen/output.py", "symbolic/latex.py",
            "symbolic/builtins.py", "symbolic/errors.py", "symbolic/cache.py", "symbolic/expression_json.py",
            "symbolic/scheme_file.py",
            "codegen/demo.py", "codegen/train_demo.py", "codegen/adapters/",
            "symbolic/model.py", "symbolic/model_derivation.py", "symbolic/cnn_operators.py", "symbolic/cvt",
            "symbolic/vision_operators.py", "symbolic/image.py", "codegen/model_")
#: Fast tests that exercise a module directly, by path prefix (the first match wins).
RELATED = {
    "symbolic/projections.py": ("tests/test_projections.py",),
    "symbolic/constraints.py": ("tests/test_projections.py",),
    "symbolic/adjoint.py": ("tests/test_adjoint.py",),
    "codegen/adjoint.py": ("tests/test_adjoint.py",),
    "codegen/parallel.py": ("tests/test_parallel.py",),
    "symbolic/tableaux.py": ("tests/test_tableaux.py",),
    "symbolic/scheme.py": ("tests/test_scheme_file.py", "tests/test_plugins.py"),
    "symbolic/builder.py": ("tests/test_api.py",),
    "symbolic/exact_numbers.py": ("tests/test_scheme_file.py", "tests/test_hostile_input.py"),
    "symbolic/names.py": ("tests/test_scheme_file.py", "tests/test_hostile_input.py"),
    "symbolic/plugins.py": ("tests/test_plugins.py",),
    "symbolic/stack.py": ("tests/test_stacks.py",),
    "symbolic/activations.py": ("tests/test_model.py",),
    "symbolic/rotary_attention.py": ("tests/test_rotary_attention.py", "tests/test_llm_checks.py"),
    "symbolic/cross_attention.py": ("tests/test_decoder.py", "tests/test_llm_checks.py"),
    "symbolic/gated_feed_forward.py": ("tests/test_llama.py",),
    "symbolic/rms_norm.py": ("tests/test_llm_checks.py",),
    "symbolic/": ("tests/test_derivation.py",),
    "codegen/initialization.py": ("tests/test_torch_dropin.py",),
    "codegen/api.py": ("tests/test_api.py",),
    "codegen/compare.py": ("tests/test_compare.py",),
    "codegen/pipeline.py": ("tests/test_variants.py",),
    "codegen/": ("tests/test_lowering.py",),
}
CORE = ("tests/test_derivation.py", "tests/test_lowering.py", "tests/test_projections.py", "tests/test_model.py")
#: The schemes checked for every mutant: a published block, a Runge–Kutta step, the paper's
#: scheme, a causal LLM block, and user files: fractions, a Strang step, parallel weights, operator
#: names that collide with the names of repeated evaluations, RMSNorm with a biased SwiGLU, rotary
#: attention with grouped heads around cross-attention.
CHECKED = ("post-ln", "rk2", "paper-lie", "gpt2", "tests/schemes/strang.toml", "tests/schemes/thirds.toml",
           "tests/schemes/richardson.toml", "tests/schemes/clash.toml", "tests/schemes/swiglu.toml",
           "tests/schemes/rotary-cross.toml")
#: Built-ins whose committed ``generated/`` files (NumPy, torch, report) a mutant must leave
#: unchanged: tableaux, LLM kinds, cross-attention, the paper's scheme, two feed-forwards.
GOLDEN = ("post-ln", "rk4", "llama", "decoder", "paper-lie", "macaron")
_GOLDEN = ("from pathlib import Path; from splitformer.codegen.pipeline import generate; "
           "from splitformer.symbolic import load_scheme; import sys\n"
           "files = {path: text for name in sys.argv[1:] for path, text in "
           "generate(load_scheme(name), (\"numpy\", \"torch\"), Path(\"generated\")).items()}\n"
           "sys.exit(any(not p.exists() or p.read_text(encoding=\"utf-8\") != t for p, t in files.items()))")
#: ``check`` that stops at the first check that fails (exit status 1).
_FAIL_FAST = ("from splitformer.codegen.verification.runner import run_checks; from splitformer.symbolic import load_scheme; "
              "import sys\ndef stop(check):\n    if not check.holds: sys.exit(1)\n"
              "sys.exit(0 if run_checks([load_scheme(n) for n in sys.argv[1:]], progress=stop).holds else 1)")
_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
          ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
          ast.NotEq: ast.Eq, ast.And: ast.Or, ast.Or: ast.And}
_THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


@dataclass(frozen=True)
class Mutant:
    path: str
    index: int  # the index-th mutable node of the file, in ``ast.walk`` order
    line: int
    description: str


def _mutable(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
            yield node, f"{type(node.op).__name__} → {_SWAPS[type(node.op)].__name__}"
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAPS:
            yield node, f"{type(node.ops[0]).__name__} → {_SWAPS[type(node.ops[0])].__name__}"
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, f"{node.value} → {not node.value}"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, f"{node.value} → {node.value + 1}"


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes inside docstrings, ``__all__`` and type annotations are not behaviour."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            skipped |= {id(child) for child in ast.walk(node)}
        if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            skipped |= {id(child) for child in ast.walk(node.annotation)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skipped |= {id(child) for child in ast.walk(node.returns)}
    return skipped


def mutants(root: Path = ROOT) -> list[Mutant]:
    found = []
    for folder in TARGETS:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith(EXCLUDED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skipped = _skipped(tree)
            for index, (node, description) in enumerate(_mutable(tree)):
                if id(node) not in skipped:
                    found.append(Mutant(relative, index, node.lineno, description))
    return found


def apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node, _ = list(_mutable(tree))[mutant.index]
    if isinstance(node, ast.BinOp | ast.BoolOp):
        node.op = _SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_SWAPS[type(node.ops[0])]()]
    elif type(node.value) is bool:
        node.value = not node.value
    else:
        node.value += 1
    return ast.unparse(tree)


def related_tests(path: str) -> tuple[str, ...]:
    """The fast tests that exercise ``path`` directly (``RELATED``, first matching prefix)."""
    return next((tests for prefix, tests in RELATED.items() if path.startswith(prefix)), ())


def kill_stages(paths: list[str]) -> list[tuple[str, str]]:
    """(name, command) of each stage: the tests related to ``paths``, the committed generated files
    of ``GOLDEN``, the fail-fast checks, the remaining core tests.

    One path for a mutant; the unmutated run takes the paths of the whole sample.
    """
    python = sys.executable
    related = tuple(dict.fromkeys(test for path in paths for test in related_tests(path)))
    core = tuple(test for test in CORE if test not in related)
    pytest = f"{python} -m pytest -x -q -p no:cacheprovider"
    stages = [("tests", f"{pytest} {' '.join(related)}")] if related else []
    stages.append(("golden", f"{python} -c '{_GOLDEN}' {' '.join(GOLDEN)}"))
    stages.append(("check", f"{python} -c '{_FAIL_FAST}' {' '.join(CHECKED)}"))
    if core:
        stages.append(("core tests", f"{pytest} {' '.join(core)}"))
    return stages


def _workspace(folder: Path) -> Path:
    """A copy of the repository whose ``splitformer`` package holds the copied folders; returns it."""
    repo = folder / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache",
                                                              ".cache", "*.egg-info"))
    for name in ("symbolic", "codegen", "templates"):
        (repo / "splitformer" / name).symlink_to(repo / name, target_is_directory=True)
    return repo


def _run_stage(command: str, repo: Path, timeout: float) -> tuple[bool, float]:
    """(failed, CPU seconds of the command and its children); a command past ``timeout`` fails.

    The output of the last command goes to ``stage.log`` next to ``repo``."""
    env = {**os.environ, **_THREADS, "PYTHONPATH": str(repo), "SPLITFORMER_CACHE": "off"}
    start = time.perf_counter()
    with open(repo.parent / "stage.log", "w") as log:
        process = subprocess.Popen(command, shell=True, cwd=repo, env=env, start_new_session=True,
                                   stdout=log, stderr=subprocess.STDOUT)
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode != 0, usage.ru_utime + usage.ru_stime
        if time.perf_counter() - start > timeout:  # a mutant that hangs is killed
            os.killpg(process.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(process.pid, 0)
            process.returncode = -1
            return True, usage.ru_utime + usage.ru_stime
        time.sleep(0.1)


def _run(stages: list[tuple[str, str]], repo: Path, timeout: float) -> tuple[str | None, float, float]:
    """(the stage that failed or ``None``, wall seconds, CPU seconds); stops at the first failure."""
    start, cpu = time.perf_counter(), 0.0
    for name, command in stages:
        failed, seconds = _run_stage(command, repo, timeout - (time.perf_counter() - start))
        cpu += seconds
        if failed:
            return name, time.perf_counter() - start, cpu
    return None, time.perf_counter() - start, cpu


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    killed_by: str | None  # the stage that failed; ``None``: the mutant survived
    wall: float
    cpu: float


def _worker(folder: Path, jobs: queue.Queue, results: list, timeout: float, total: int, lock: threading.Lock) -> None:
    repo = _workspace(folder)
    while True:
        try:
            mutant = jobs.get_nowait()
        except queue.Empty:
            return
        target = repo / mutant.path
        original = target.read_text(encoding="utf-8")
        target.write_text(apply(original, mutant), encoding="utf-8")
        try:
            killed_by, wall, cpu = _run(kill_stages([mutant.path]), repo, timeout)
        finally:
            target.write_text(original, encoding="utf-8")
        with lock:
            results.append(Result(mutant, killed_by, wall, cpu))
            verdict = f"killed by {killed_by}" if killed_by else "SURVIVED"
            print(f"[{len(results)}/{total}] {verdict:20} {mutant.path}:{mutant.line} {mutant.description} "
                  f"({wall:.0f} s, CPU {cpu:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=40, help="mutants to run (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel workers")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 3 × the unmutated run, at least 120); a timeout kills it")
    parser.add_argument("--select", action="append", default=[], metavar="PATH:LINE",
                        help="run only the sampled mutants at these lines (to re-run survivors)")
    arguments = parser.parse_args(argv)
    population = mutants()
    sample = sorted(random.Random(arguments.seed).sample(population, min(arguments.sample, len(population))),
                    key=lambda m: (m.path, m.line))
    if arguments.select:
        sample = [mutant for mutant in sample if f"{mutant.path}:{mutant.line}" in arguments.select]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="splitformer-mutation-") as folder:
        baseline_repo = _workspace(Path(folder) / "baseline")
        failed, seconds, cpu = _run(kill_stages([mutant.path for mutant in sample]), baseline_repo, 3600)
        if failed:
            output = (baseline_repo.parent / "stage.log").read_text(errors="replace")[-3000:]
            print(f"the unmutated repository fails the kill command ({failed}); nothing to measure\n{output}",
                  file=sys.stderr)
            return 2
        timeout = arguments.timeout or max(120.0, 3 * seconds)
        print(f"{len(population)} mutants in {', '.join(TARGETS)} (excluded: {len(EXCLUDED)} paths); running "
              f"{len(sample)} (seed {arguments.seed}) on {arguments.jobs} workers; unmutated run, the related tests of the "
              f"whole sample included: {seconds:.0f} s (CPU {cpu:.0f} s); timeout {timeout:.0f} s", flush=True)
        jobs: queue.Queue = queue.Queue()
        for mutant in sample:
            jobs.put(mutant)
        results: list[Result] = []
        lock = threading.Lock()
        workers = [threading.Thread(target=_worker, args=(Path(folder) / f"worker{n}", jobs, results, timeout,
                                                          len(sample), lock)) for n in range(arguments.jobs)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    wall = time.perf_counter() - started
    survivors = sorted((r.mutant for r in results if r.killed_by is None), key=lambda m: (m.path, m.line))
    killed = len(results) - len(survivors)
    total_cpu = cpu + sum(r.cpu for r in results)
    print(f"\nkill rate {killed}/{len(results)} = {killed / max(len(results), 1):.0%}")
    print(f"wall {wall / 60:.1f} min; CPU {total_cpu / 60:.1f} min, i.e. about {total_cpu / 60 / arguments.jobs:.1f} "
          f"min on an idle machine with {arguments.jobs} workers")
    for mutant in survivors:
        print(f"survivor: {mutant.path}:{mutant.line} {mutant.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
