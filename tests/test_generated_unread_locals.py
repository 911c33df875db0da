"""The generated modules assign no local that their function never reads (a product read statement by statement:
every parameter, size and flag a function binds is there because a statement reads it)."""

from __future__ import annotations

import ast

import pytest

import splitformer

from conftest import GENERATED, ROOT

MODULES = sorted(path for path in GENERATED.rglob("*.py") if path.name != "__init__.py")
#: User scheme files (rotary pairs with cross-attention, relative-position buckets, RMSNorm with a gated feed-forward):
#: the templates bind for them what they bind for the built-ins.
USER_SCHEMES = ("rotary-cross", "t5-pre-ln", "pre-rms-glu")


def unread_locals(source: str) -> list[str]:
    """``function: name (line n)`` for each name a function assigns alone (``name = …``, or in a parallel assignment
    ``a, b = x, y``; unpacking one value excepted, as Python's linters do) and never reads, nested functions' reads
    included."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigned: dict[str, int] = {}
        read = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, node.lineno)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and _parallel(node.targets[0], node.value):
                for target in node.targets[0].elts:
                    assigned.setdefault(target.id, node.lineno)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                read.add(node.id)
        found += [f"{function.name}: {name} (line {line})" for name, line in assigned.items()
                  if name not in read | {"_"}]
    return found


def _parallel(target: ast.expr, value: ast.expr) -> bool:
    """Whether ``target = value`` binds names to as many values written out (``a, b = x, y``)."""
    return (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts)
            and all(isinstance(element, ast.Name) for element in target.elts))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_generated_function_reads_every_local_it_assigns(path):
    assert unread_locals(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("name", USER_SCHEMES)
def test_a_derived_user_scheme_reads_every_local_it_assigns(name):
    derivation = splitformer.derive(str(ROOT / "tests" / "schemes" / f"{name}.toml"))
    for backend in ("numpy", "torch"):
        assert unread_locals(derivation._source(backend)) == [], backend


def test_the_check_finds_a_binding_nobody_reads():
    """Control: a parameter bound and only deleted, a flag never read; a read in a nested function counts."""
    source = ("def step(p):\n    bias = p['b']\n    inference = True\n    weight = p['W']\n"
              "    def inner():\n        return weight\n    del bias\n    return inner()\n")
    assert unread_locals(source) == ["step: bias (line 2)", "step: inference (line 3)"]
    parallel = "def step(p):\n    n, d = p['n'], p['d']\n    a, b = p['ab']\n    return n\n"  # llama's d_kv (s46)
    assert unread_locals(parallel) == ["step: d (line 2)"]
