"""The core imports no operator kind: what a kind reads reaches the emitted code by its declaration.

Rotary attention and cross-attention are built-in kinds registered as a user's plug-in is; the
derivation, the lowering, the adjoint's lowering and the rendering import neither, and no core
module names the arrays they read (``pos``, ``mem``, ``chi_m``) or sniffs emitted code for them.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ["symbolic/derivation.py", "symbolic/program.py", "codegen/lowering.py", "codegen/adjoint.py",
        "codegen/render.py", "codegen/ir.py", "codegen/backends.py", "codegen/printers.py"]
KIND_MODULES = {"rotary_attention", "cross_attention"}
KIND_ARRAYS = {"pos", "mem", "chi_m", "rope_theta"}


def _imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", CORE)
def test_a_core_module_imports_no_operator_kind(path):
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    parts = {part for name in _imported_modules(tree) for part in name.split(".")}
    assert not parts & KIND_MODULES, f"{path} imports {sorted(parts & KIND_MODULES)}"


@pytest.mark.parametrize("path", CORE)
def test_a_core_module_names_no_array_of_a_kind(path):
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & KIND_ARRAYS, f"{path} names {sorted(strings & KIND_ARRAYS)}"


def test_the_templates_name_no_operator_kind():
    for path in (ROOT / "templates").rglob("*.py.j2"):
        text = path.read_text(encoding="utf-8")
        assert "rotary-attention" not in text and "cross-attention" not in text, path
        assert ".rotary" not in text, path


def test_the_negative_control_sees_an_import_of_a_kind():
    tree = ast.parse("from .rotary_attention import POSITIONS\nimport splitformer.symbolic.cross_attention")
    assert {"rotary_attention", "cross_attention"} <= {p for n in _imported_modules(tree) for p in n.split(".")}


def test_the_builtin_kinds_declare_what_they_read():
    from splitformer.symbolic.kinds import OPERATOR_KINDS

    rotary, cross = OPERATOR_KINDS["rotary-attention"], OPERATOR_KINDS["cross-attention"]
    assert [field.role for field in rotary.input_fields] == ["positions"]
    assert [constant.name for constant in rotary.constants] == ["rope_theta"]
    assert [field.role for field in cross.input_fields] == ["memory", "support"]
