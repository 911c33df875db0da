"""Mutation testing of ``symbolic/`` and ``codegen/``: does ``check`` plus the fast tests notice?

A small driver (mutmut and cosmic-ray expect one source folder per import name, and this
repository maps three folders under ``splitformer``). It copies the repository to a
temporary folder, links the copied ``symbolic/``, ``codegen/``, ``templates/`` into the
copied ``splitformer/`` (which the kill command, run from the copy, imports first), and
for each sampled mutant rewrites one file, runs the kill command and restores the file.
The repository itself is never modified.

Mutation operators (AST): ``+ ↔ −``, ``* ↔ /``, ``** → *``, comparison flips
(``< ↔ <=``, ``> ↔ >=``, ``== ↔ !=``), ``and ↔ or``, integer constants ``n → n + 1``,
``True ↔ False``. A mutant is killed when the command fails or times out.

    python -m splitformer.codegen.verification.mutation [--sample N] [--seed S] [--timeout T]
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "mutants", "main"]

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("symbolic", "codegen")
#: Not mutated: the verification code itself, the CLI's wording, the demo and the adapters.
EXCLUDED = ("codegen/verification/", "codegen/cli.py", "codegen/demo.py", "codegen/adapters/", "codegen/report.py",
            "symbolic/checks/", "symbolic/references.py", "symbolic/latex.py", "symbolic/builtins.py",
            "symbolic/errors.py", "symbolic/cache.py", "codegen/output.py", "symbolic/scheme_file.py",
            "symbolic/evaluate.py", "codegen/convergence.py", "codegen/checking.py")
KILL_COMMAND = (  # the fast tests first: most mutants die there in seconds
    "{python} -m pytest -x -q -p no:cacheprovider tests/test_derivation.py tests/test_lowering.py"
    " tests/test_projections.py tests/test_model.py > /dev/null"
    " && {python} -m splitformer check post-ln rk2 paper-lie tests/schemes/richardson.toml --format json > /dev/null"
)
_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
          ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
          ast.NotEq: ast.Eq, ast.And: ast.Or, ast.Or: ast.And}


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


def _workspace(folder: Path) -> Path:
    """A copy of the repository whose ``splitformer`` package holds the copied folders; returns it."""
    repo = folder / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache"))
    for name in ("symbolic", "codegen", "templates"):
        (repo / "splitformer" / name).symlink_to(repo / name, target_is_directory=True)
    return repo


def _run(repo: Path, env: dict, timeout: float) -> tuple[bool, float]:
    start = time.perf_counter()
    command = KILL_COMMAND.format(python=sys.executable)
    try:
        result = subprocess.run(command, shell=True, cwd=repo, env=env, timeout=timeout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        killed = result.returncode != 0
    except subprocess.TimeoutExpired:
        killed = True
    return killed, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=40, help="mutants to run (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240, help="seconds per mutant; a timeout kills it")
    arguments = parser.parse_args(argv)
    population = mutants()
    sample = sorted(random.Random(arguments.seed).sample(population, min(arguments.sample, len(population))),
                    key=lambda m: (m.path, m.line))
    with tempfile.TemporaryDirectory(prefix="splitformer-mutation-") as folder:
        repo = _workspace(Path(folder))
        env = {**os.environ, "PYTHONPATH": str(repo), "SPLITFORMER_CACHE": "off"}
        baseline, seconds = _run(repo, env, arguments.timeout * 2)
        if baseline:
            print("the unmutated repository fails the kill command; nothing to measure", file=sys.stderr)
            return 2
        print(f"{len(population)} mutants in {', '.join(TARGETS)}; running {len(sample)} (seed {arguments.seed}); "
              f"baseline {seconds:.0f} s", flush=True)
        survivors = []
        for number, mutant in enumerate(sample, 1):
            target = repo / mutant.path
            original = target.read_text(encoding="utf-8")
            target.write_text(apply(original, mutant), encoding="utf-8")
            try:
                killed, seconds = _run(repo, env, arguments.timeout)
            finally:
                target.write_text(original, encoding="utf-8")
            if not killed:
                survivors.append(mutant)
            print(f"[{number}/{len(sample)}] {'killed  ' if killed else 'SURVIVED'} {mutant.path}:{mutant.line} "
                  f"{mutant.description} ({seconds:.0f} s)", flush=True)
    killed = len(sample) - len(survivors)
    print(f"\nkill rate {killed}/{len(sample)} = {killed / max(len(sample), 1):.0%}")
    for mutant in survivors:
        print(f"survivor: {mutant.path}:{mutant.line} {mutant.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
