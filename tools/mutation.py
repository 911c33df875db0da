"""Mutation testing of splitformer: does ``check`` plus the fast tests of each area notice?

A small driver (mutmut and cosmic-ray expect one source folder per import name, and this
repository maps three folders under ``splitformer``). Each worker copies the repository to a
temporary folder and links the copied ``symbolic/``, ``codegen/``, ``templates/``, ``runtime/`` into the
copied ``splitformer/`` (which the kill command, run from the copy, imports first); for each
mutant it rewrites one file, runs the kill command and restores the file. The repository
itself is never modified. Mutants: ``mutants.py``.

Population: every Python module of ``symbolic/``, ``codegen/`` and ``runtime/`` (the helpers inlined into
the emitted code, in the templates' area) and every code template (``templates/**/*.py.j2``) but the verification code itself (``VERIFICATION``), in the areas of
``AREAS``. A sample of ``--sample`` mutants per seed is drawn area by area in turn, so every
area is measured; several ``--seeds`` share one run (a mutant drawn twice runs once).

Kill command of a mutant, stopping at the first failure: the fast tests of its file
(``TESTS``, first matching prefix), then ``check`` of the area (``CHECKED`` schemes stopping at
the first failing check; the networks of ``NETWORKS`` through ``splitformer check``), then
the core tests of the symbolic and codegen areas. Adapters are not checked by ``check`` (it
never imports them): their tests alone run. No golden file is compared: a mutant must change
behaviour that a test or a check asserts. A mutant is killed when the command fails, killed
by timeout when it runs past the timeout (reported apart); it survives otherwise.

Survivors judged equivalent are listed in ``mutation_equivalent.toml`` (one reason each); the
report gives the kill rate raw and over the mutants not judged equivalent, per area, seed and
overall, with each survivor's diff. One thread per process (``*_NUM_THREADS = 1``).

    python tools/mutation.py [--sample N] [--seeds S …] [--jobs J] [--timeout T] [--report PREFIX]
                             [--select PATH:LINE …]
"""

from __future__ import annotations

import argparse
import json
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
import tomllib
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from mutants import Mutant, apply, diff, file_mutants

__all__ = ["AREAS", "VERIFICATION", "area_of", "population", "sample", "kill_stages", "equivalents", "main"]

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = Path(__file__).with_name("mutation_equivalent.toml")
#: Not mutated: the verification code itself (checks, the independent evaluators, the
#: published references) and a module kept only for old imports.
VERIFICATION = ("codegen/verification/", "symbolic/references.py", "symbolic/vision_references.py",
                "symbolic/projection_verifiers.py", "symbolic/evaluate.py", "codegen/convergence.py")
_NETWORK_CODEGEN = tuple(f"codegen/{name}" for name in ("network_", "stage_render.py", "nn", "study.py"))
#: Area → path prefixes (the first area whose prefix matches wins; templates are ``*.py.j2``).
AREAS = {
    "passes": ("codegen/passes/",),
    "adapters": ("codegen/adapters/",),
    "network": _NETWORK_CODEGEN,
    "codegen": ("codegen/",),
    "symbolic": ("symbolic/",),
    "templates": ("templates/", "runtime/"),
}
_NETWORK_SYMBOLIC = tuple(f"symbolic/{name}" for name in ("network", "stages.py", "cnn_operators.py", "cvt",
                                                           "vision_operators.py", "image.py"))
#: Templates of the networks' modules only (their own and what only they include).
_NETWORK_TEMPLATES = tuple(f"templates/{name}" for name in ("cvt_config", "programs", "network", "torch/derived")) + (
    "runtime/numpy_grids.py", "runtime/numpy_parameters.py", "runtime/torch_grids.py", "runtime/torch_parameters.py")
_VISION = ("tests/test_vit.py", "tests/test_grid_networks.py", "tests/test_cvt.py")
_VISION_ADJOINT = ("tests/test_vit_adjoint.py", "tests/test_grid_adjoint.py", "tests/test_cvt_adjoint.py")
#: Fast tests that exercise a file, by path prefix (the first match wins).
TESTS = {
    "symbolic/projections.py": ("tests/test_projections.py",),
    "symbolic/constraints.py": ("tests/test_projections.py",),
    "symbolic/adjoint.py": ("tests/test_adjoint.py",),
    "symbolic/tableaux.py": ("tests/test_tableaux.py", "tests/test_orders.py"),
    "symbolic/scheme": ("tests/test_scheme_file.py", "tests/test_plugins.py", "tests/test_orders.py",
                        "tests/test_hostile_api.py"),
    "symbolic/builder.py": ("tests/test_api.py",),
    "symbolic/exact_numbers.py": ("tests/test_scheme_file.py", "tests/test_hostile_input.py"),
    "symbolic/names.py": ("tests/test_scheme_file.py", "tests/test_hostile_input.py"),
    "symbolic/plugins.py": ("tests/test_plugins.py",),
    "symbolic/cache.py": ("tests/test_cache.py",),
    "symbolic/expression_json.py": ("tests/test_cache.py",),
    "symbolic/operator_checks.py": ("tests/test_plugins.py", "tests/test_open_operators.py"),
    "symbolic/stack.py": ("tests/test_stacks.py",),
    "symbolic/activations.py": ("tests/test_network_spec.py",),
    "symbolic/rotary_attention.py": ("tests/test_rotary_attention.py", "tests/test_llm_checks.py"),
    "symbolic/cross_attention.py": ("tests/test_decoder.py", "tests/test_llm_checks.py"),
    "symbolic/gated_feed_forward.py": ("tests/test_llama.py",),
    "symbolic/rms_norm.py": ("tests/test_llm_checks.py",),
    "symbolic/cvt_pieces.py": ("tests/test_cvt_adjoint.py",),
    "symbolic/network_pieces.py": ("tests/test_vit_adjoint.py", "tests/test_grid_adjoint.py"),
    **{prefix: _VISION for prefix in _NETWORK_SYMBOLIC},
    "symbolic/": ("tests/test_derivation.py",),
    "codegen/passes/": ("tests/test_lowering.py", "tests/test_numpy_memory.py"),
    "codegen/adapters/timm_vit.py": ("tests/test_adapters_timm.py",),
    "codegen/adapters/xtransformers.py": ("tests/test_xtransformers.py", "tests/test_xtransformers_scores.py"),
    "codegen/adapters/hf_vision.py": ("tests/test_vit.py", "tests/test_cvt.py"),
    "codegen/adapters/hf_": ("tests/test_llm_adapters.py", "tests/test_adapters.py"),
    "codegen/adapters/torch_decoder.py": ("tests/test_decoder.py", "tests/test_adapters.py"),
    "codegen/adapters/": ("tests/test_adapters.py", "tests/test_adapter_refusals.py"),
    "codegen/initialization.py": ("tests/test_torch_dropin.py",),
    "codegen/api.py": ("tests/test_api.py",),
    "codegen/compare.py": ("tests/test_compare.py",),
    "codegen/pipeline.py": ("tests/test_variants.py",),
    "codegen/cli.py": ("tests/test_cli.py",),
    "codegen/output.py": ("tests/test_output_files.py",),
    "codegen/report": ("tests/test_cli_usage.py", "tests/test_lowering.py"),
    "codegen/printers.py": ("tests/test_lowering.py", "tests/test_torch_spellings.py"),
    "codegen/backends.py": ("tests/test_lowering.py", "tests/test_torch_spellings.py"),
    "codegen/adjoint.py": ("tests/test_adjoint.py", *_VISION_ADJOINT),
    "codegen/lowering.py": ("tests/test_lowering.py", "tests/test_network_semantics.py", *_VISION),
    "codegen/parallel.py": ("tests/test_parallel.py",),
    "codegen/nn": ("tests/test_nn.py", "tests/test_nn_hf.py"),
    "codegen/hf_": ("tests/test_hf_native.py",),
    "codegen/study.py": ("tests/test_study.py",),
    "codegen/stage_render.py": ("tests/test_cvt_adjoint.py", "tests/test_vit_adjoint.py", "tests/test_grid_adjoint.py"),
    "codegen/network_": ("tests/test_network_semantics.py", *_VISION),
    "codegen/": ("tests/test_lowering.py",),
    **{prefix: ("tests/test_network_semantics.py", *_VISION, *_VISION_ADJOINT) for prefix in _NETWORK_TEMPLATES},
    "runtime/numpy_helpers.py": ("tests/test_runtime.py", "tests/test_derive_variants.py"),
    "runtime/torch_helpers.py": ("tests/test_runtime.py", "tests/test_parity.py"),
    "runtime/": ("tests/test_runtime.py",),
    "templates/torch/": ("tests/test_parity.py",),
    "templates/": (),
}
CORE = ("tests/test_derivation.py", "tests/test_lowering.py")
#: The schemes checked for a mutant of the scheme pipeline: a published block, a Runge–Kutta step,
#: the paper's scheme, a causal LLM block, and user files: fractions, a Strang step, parallel
#: weights, operator names that collide with the names of repeated evaluations, RMSNorm with a
#: biased SwiGLU, rotary attention with grouped heads around cross-attention.
CHECKED = ("post-ln", "rk2", "paper-lie", "gpt2", "tests/schemes/strang.toml", "tests/schemes/thirds.toml",
           "tests/schemes/richardson.toml", "tests/schemes/clash.toml", "tests/schemes/swiglu.toml",
           "tests/schemes/rotary-cross.toml")
NETWORKS = ("vit", "cvt", "resnet-block", "unet-level")
#: The golden comparisons of the committed ``generated/`` files, deselected: they see any change of text.
_GOLDEN = "committed_files_match_the_generator"
#: ``check`` that stops at the first check that fails (exit status 1).
_FAIL_FAST = ("from splitformer.codegen.verification.runner import run_checks; from splitformer.symbolic import load_scheme; "
              "import sys\ndef stop(check):\n    if not check.holds: sys.exit(1)\n"
              "sys.exit(0 if run_checks([load_scheme(n) for n in sys.argv[1:]], progress=stop).holds else 1)")
#: Process groups of the stages running now; set on SIGINT or SIGTERM.
_RUNNING: set[int] = set()
_STOPPING = threading.Event()
_THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def area_of(path: str) -> str:
    return next(area for area, prefixes in AREAS.items() if path.startswith(prefixes))


def population(root: Path = ROOT) -> list[Mutant]:
    """Every mutant of every area, in path order."""
    paths = [*sorted((root / "symbolic").rglob("*.py")), *sorted((root / "codegen").rglob("*.py")),
             *sorted((root / "runtime").rglob("*.py")), *sorted((root / "templates").rglob("*.py.j2"))]
    relative = [path.relative_to(root).as_posix() for path in paths]
    return [mutant for path in relative if not path.startswith(VERIFICATION) for mutant in file_mutants(root, path)]


def sample(mutants: list[Mutant], size: int, seed: int) -> list[Mutant]:
    """``size`` mutants drawn area by area in turn (each area's mutants shuffled by ``seed``)."""
    rng = random.Random(seed)
    pools = {area: [m for m in mutants if area_of(m.path) == area] for area in AREAS}
    for pool in pools.values():
        rng.shuffle(pool)
    drawn = []
    while len(drawn) < size and any(pools.values()):
        drawn += [pool.pop() for pool in pools.values() if pool][:size - len(drawn)]
    return sorted(drawn, key=lambda m: (m.path, m.line, m.index))


def _tests(path: str) -> tuple[str, ...]:
    return next(tests for prefix, tests in TESTS.items() if path.startswith(prefix))


def _networks(path: str) -> bool:
    return area_of(path) == "network" or path.startswith(_NETWORK_SYMBOLIC + _NETWORK_TEMPLATES)


def kill_stages(paths: list[str]) -> list[tuple[str, str]]:
    """(name, command) of each stage for a mutant of one of ``paths`` (the baseline gives several)."""
    python = sys.executable
    tests = tuple(dict.fromkeys(test for path in paths for test in _tests(path)))
    pytest = f"{python} -m pytest -x -q -p no:cacheprovider -k 'not {_GOLDEN}'"
    stages = [("tests", f"{pytest} {' '.join(tests)}")] if tests else []
    areas = {area_of(path) for path in paths}
    if any(not _networks(path) and area_of(path) != "adapters" for path in paths):
        stages.append(("check", f"{python} -c '{_FAIL_FAST}' {' '.join(CHECKED)}"))
    if any(_networks(path) for path in paths):
        stages.append(("check networks", f"{python} -m splitformer check {' '.join(NETWORKS)}"))
    core = tuple(test for test in CORE if test not in tests)
    if areas & {"symbolic", "codegen"} and core:
        stages.append(("core tests", f"{pytest} {' '.join(core)}"))
    return stages


def equivalents(path: Path = EQUIVALENTS) -> dict[tuple[str, str, str], str]:
    """Mutant identity (file, line text, mutation) → the reason it is judged equivalent."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", []) if path.exists() else []
    return {(entry["file"], entry["line"], entry["mutation"]): entry["reason"] for entry in entries}


# -- running ----------------------------------------------------------------------------------

def _workspace(folder: Path) -> Path:
    """A copy of the repository whose ``splitformer`` package holds the copied folders; returns it."""
    repo = folder / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache",
                                                              ".cache", "*.egg-info", "site"))
    for name in ("symbolic", "codegen", "templates", "runtime"):
        (repo / "splitformer" / name).symlink_to(repo / name, target_is_directory=True)
    return repo


def _run_stage(command: str, repo: Path, timeout: float) -> tuple[str, float]:
    """("passed" | "failed" | "timeout", CPU seconds of the command and its children).

    The output goes to ``stage.log`` next to ``repo``."""
    env = {**os.environ, **_THREADS, "PYTHONPATH": str(repo), "SPLITFORMER_CACHE": "off",  # the console script too
           "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))}
    start = time.perf_counter()
    with open(repo.parent / "stage.log", "w") as log:
        process = subprocess.Popen(command, shell=True, cwd=repo, env=env, start_new_session=True,
                                   stdout=log, stderr=subprocess.STDOUT)
    _RUNNING.add(process.pid)
    try:
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                return "failed" if os.waitstatus_to_exitcode(status) else "passed", usage.ru_utime + usage.ru_stime
            if time.perf_counter() - start > timeout:
                os.killpg(process.pid, signal.SIGKILL)
                _, _, usage = os.wait4(process.pid, 0)
                return "timeout", usage.ru_utime + usage.ru_stime
            time.sleep(0.2)
    finally:
        _RUNNING.discard(process.pid)


def _stop(signum: int, folder: str) -> None:
    """On SIGINT or SIGTERM: start no stage, end those running (their process groups), remove the copies, exit."""
    _STOPPING.set()
    for group in list(_RUNNING):
        os.killpg(group, signal.SIGKILL)
    time.sleep(1)  # the workers see the flag before their copies go
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(128 + signum)


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    area: str
    verdict: str  # "killed", "timeout" (killed by the timeout) or "survived"
    stage: str | None  # the stage that failed or ran out of time
    wall: float
    cpu: float
    diff: str


def _run(stages: list[tuple[str, str]], repo: Path, timeout: float) -> tuple[str, str | None, float, float]:
    """(verdict, stage, wall seconds, CPU seconds); stops at the first stage that does not pass."""
    start, cpu = time.perf_counter(), 0.0
    for name, command in stages:
        if _STOPPING.is_set():
            raise SystemExit  # this worker thread ends
        outcome, seconds = _run_stage(command, repo, timeout - (time.perf_counter() - start))
        cpu += seconds
        if outcome != "passed":
            return ("killed" if outcome == "failed" else "timeout"), name, time.perf_counter() - start, cpu
    return "survived", None, time.perf_counter() - start, cpu


def _worker(folder: Path, jobs: queue.Queue, timeouts: dict[str, float], results: list, total: int,
            lock: threading.Lock, written: Callable[[], None]) -> None:
    repo = _workspace(folder)
    while True:
        try:
            mutant = jobs.get_nowait()
        except queue.Empty:
            return
        target = repo / mutant.path
        original = target.read_text(encoding="utf-8")
        target.write_text(apply(original, mutant), encoding="utf-8")
        area = area_of(mutant.path)
        try:
            verdict, stage, wall, cpu = _run(kill_stages([mutant.path]), repo, timeouts[area])
        finally:
            target.write_text(original, encoding="utf-8")
        with lock:
            results.append(Result(mutant, area, verdict, stage, wall, cpu, diff(original, mutant)))
            shown = f"{verdict} by {stage}" if stage else verdict.upper()
            print(f"[{len(results)}/{total}] {shown:24} {mutant.key} ({wall:.0f} s, CPU {cpu:.0f} s)", flush=True)
            written()


def _baseline(folder: Path, drawn: list[Mutant], jobs: int) -> dict[str, tuple[str | None, float, float]]:
    """Area → (the stage that fails unmutated or ``None``, wall, CPU) of the kill command of all its
    drawn files; ``jobs`` areas at a time, as the mutants will run."""
    by_area: dict[str, set[str]] = {}
    for mutant in drawn:
        by_area.setdefault(area_of(mutant.path), set()).add(mutant.path)

    def unmutated(area: str) -> tuple[str | None, float, float]:
        repo = _workspace(folder / area)
        verdict, stage, wall, cpu = _run(kill_stages(sorted(by_area[area])), repo, 3600)
        print(f"unmutated {area}: {'fails at ' + stage if stage else 'passes'} ({wall:.0f} s, "
              f"CPU {cpu:.0f} s)", flush=True)
        if stage:
            print((repo.parent / "stage.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        return stage, wall, cpu

    with ThreadPoolExecutor(jobs) as pool:
        return dict(zip(by_area, pool.map(unmutated, by_area)))


# -- report -----------------------------------------------------------------------------------

def _rates(results: list[Result], judged: dict[tuple[str, str, str], str]) -> dict:
    killed = sum(r.verdict == "killed" for r in results)
    timeouts = sum(r.verdict == "timeout" for r in results)
    equivalent = sum(r.verdict == "survived" and r.mutant.identity in judged for r in results)
    real = len(results) - equivalent
    return {"mutants": len(results), "killed": killed, "timeout": timeouts, "equivalent": equivalent,
            "survived": len(results) - killed - timeouts - equivalent,
            "raw": (killed + timeouts) / len(results) if results else None,
            "non_equivalent": (killed + timeouts) / real if real else None}


def _percent(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.0%}"


def report(by_seed: dict[int, list[Result]], judged: dict[tuple[str, str, str], str], wall: float, cpu: float, jobs: int,
           drawn: int) -> tuple[str, dict]:
    """The markdown report and its JSON document (``drawn``: the distinct mutants of the run, run or not yet)."""
    everything = list({r.mutant: r for results in by_seed.values() for r in results}.values())
    table = {f"seed {seed}": {area: _rates([r for r in results if r.area == area], judged) for area in AREAS}
             | {"all": _rates(results, judged)} for seed, results in by_seed.items()}
    pooled = [r for results in by_seed.values() for r in results]
    table["all seeds"] = {area: _rates([r for r in pooled if r.area == area], judged) for area in AREAS} \
        | {"all": _rates(pooled, judged)}
    lines = ["# Mutation report", "",
             f"Seeds {', '.join(map(str, by_seed))}; {len(everything)} of {drawn} distinct mutants run; wall {wall / 60:.1f} min, "
             f"CPU {cpu / 60:.1f} min on {jobs} workers. Cell: killed (timeouts included) / mutants = raw rate; "
             "over the mutants not judged equivalent.", "",
             "| sample | " + " | ".join([*AREAS, "all"]) + " |", "|---" * (len(AREAS) + 2) + "|"]
    for name, row in table.items():
        cells = [f"{c['killed'] + c['timeout']}/{c['mutants']} = {_percent(c['raw'])}; {_percent(c['non_equivalent'])}"
                 if c["mutants"] else "–" for c in row.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    timeouts = [r for r in everything if r.verdict == "timeout"]
    lines += ["", f"Killed by timeout: {len(timeouts)}" + "".join(f"\n- `{r.mutant.key}`" for r in timeouts)]
    for title, chosen in (("Survivors (not judged equivalent)", False), ("Survivors judged equivalent", True)):
        survivors = sorted((r for r in everything if r.verdict == "survived" and (r.mutant.identity in judged) == chosen),
                           key=lambda r: r.mutant.key)
        lines += ["", f"## {title}: {len(survivors)}"]
        for r in survivors:
            reason = f" — {judged[r.mutant.identity]}" if chosen else ""
            lines += ["", f"`{r.mutant.key}` ({r.area}){reason}", "", "```diff", r.diff, "```"]
    document = {"seeds": list(by_seed), "drawn": drawn, "wall_s": wall, "cpu_s": cpu, "jobs": jobs, "table": table,
                "results": [asdict(r) | {"key": r.mutant.key, "equivalent": r.mutant.identity in judged,
                                         "seeds": [s for s, rs in by_seed.items() if r in rs]} for r in everything]}
    return "\n".join(lines) + "\n", document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=40, help="mutants per seed (default 40)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel workers")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 2.5 × the area's unmutated run, at least 90)")
    parser.add_argument("--report", type=Path, default=ROOT / ".cache" / "mutation" / "report",
                        help="writes PREFIX.md and PREFIX.json (default .cache/mutation/report)")
    parser.add_argument("--select", action="append", default=[], metavar="PATH:LINE",
                        help="run only the sampled mutants at these lines (to re-run survivors)")
    arguments = parser.parse_args(argv)
    mutants = population()
    seeds = {seed: sample(mutants, arguments.sample, seed) for seed in arguments.seeds}
    if arguments.select:
        seeds = {seed: [m for m in drawn if f"{m.path}:{m.line}" in arguments.select] for seed, drawn in seeds.items()}
    distinct = list(dict.fromkeys(m for drawn in seeds.values() for m in drawn))  # seed by seed
    counts = {area: sum(area_of(m.path) == area for m in mutants) for area in AREAS}
    print(f"{len(mutants)} mutants ({', '.join(f'{a} {n}' for a, n in counts.items())}); seeds {arguments.seeds}: "
          f"{len(distinct)} distinct mutants on {arguments.jobs} workers", flush=True)
    started = time.perf_counter()
    results: list[Result] = []
    lock = threading.Lock()

    def written() -> None:  # the report so far, rewritten after each mutant (an interrupted run keeps it)
        by_mutant = {r.mutant: r for r in results}
        cpu = sum(c for _, _, c in baseline.values()) + sum(r.cpu for r in results)
        text, document = report({seed: [by_mutant[m] for m in drawn if m in by_mutant] for seed, drawn in seeds.items()},
                                equivalents(), time.perf_counter() - started, cpu, arguments.jobs, len(distinct))
        arguments.report.with_suffix(".md").write_text(text, encoding="utf-8")
        arguments.report.with_suffix(".json").write_text(json.dumps(document, indent=1, ensure_ascii=False),
                                                          encoding="utf-8")

    arguments.report.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="splitformer-mutation-") as folder:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda signum, _: _stop(signum, folder))
        baseline = _baseline(Path(folder) / "baseline", distinct, arguments.jobs)
        if any(stage for stage, _, _ in baseline.values()):
            print("the unmutated repository fails a kill command; nothing to measure", file=sys.stderr)
            return 2
        timeouts = {area: arguments.timeout or max(90.0, 2.5 * wall) for area, (_, wall, _) in baseline.items()}
        jobs: queue.Queue = queue.Queue()
        for mutant in distinct:
            jobs.put(mutant)
        workers = [threading.Thread(target=_worker, args=(Path(folder) / f"worker{n}", jobs, timeouts, results,
                                                          len(distinct), lock, written)) for n in range(arguments.jobs)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    text = arguments.report.with_suffix(".md").read_text(encoding="utf-8")
    print("\n" + text.split("\n## ")[0] + f"\nreport: {arguments.report.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
