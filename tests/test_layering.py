"""Layering: no import circles, the symbolic side never imports codegen, emission and reports
never import the verification, the runtime helpers import nothing of the package but each other,
and no module imports another's private names (the runtime helpers share theirs: the generated
code spells them so).

The graph is read from the source (``layering.py``): module-level and deferred imports both
count. Each rule has a negative control: the same checker on a small synthetic package
that breaks it must report the break.
"""

import re
from pathlib import Path

import pytest

from layering import circles, forbidden_imports, private_imports, read_package

ROOT = Path(__file__).resolve().parents[1]
#: The installed names of the repository's folders (pyproject.toml's package-dir).
FOLDERS = {"splitformer": ROOT / "splitformer", "splitformer.symbolic": ROOT / "symbolic",
           "splitformer.codegen": ROOT / "codegen", "splitformer.templates": ROOT / "templates",
           "splitformer.runtime": ROOT / "runtime"}
RUNTIME = "splitformer.runtime"
#: Emission and reports: IR → source and Markdown. Orchestrators (pipeline, api, cli) may
#: call the verification; these modules never do.
EMISSION = [f"splitformer.codegen.{name}" for name in (
    "ir", "lowering", "adjoint", "passes",
    "printers", "backends", "render", "stage_render", "network_render",
    "document", "report", "report_adjoint", "network_report", "initialization")] + ["splitformer.templates"]


@pytest.fixture(scope="module")
def project():
    return read_package(FOLDERS)


def _lines(found) -> str:
    return "\n".join(f"{item.source}:{item.line} imports {item.target}{f' {item.name}' if item.name else ''}"
                     for item in found)


def test_the_graph_sees_the_project(project):
    assert {"splitformer.symbolic.scheme", "splitformer.codegen.render", "splitformer.codegen.adapters",
            "splitformer.codegen.verification.statements.order", "splitformer.codegen.passes.matmul"} <= set(project.modules)
    assert len(project.modules) > 100 and len(project.imports) > 1000
    assert all(name in project.modules for name in EMISSION)
    assert {f"{RUNTIME}.checks", f"{RUNTIME}.numpy_helpers", f"{RUNTIME}.torch_parameters"} <= set(project.modules)


def test_no_import_circles(project):
    assert circles(project) == []


def test_symbolic_never_imports_codegen(project):
    found = forbidden_imports(project, ["splitformer.symbolic"], ["splitformer.codegen", "splitformer.templates"])
    assert not found, _lines(found)


def test_emission_and_reports_never_import_the_verification(project):
    found = forbidden_imports(project, EMISSION, ["splitformer.codegen.verification"])
    assert not found, _lines(found)


def test_runtime_imports_nothing_of_the_package_but_itself(project):
    others = [name for name in FOLDERS if name not in ("splitformer", RUNTIME)]
    found = forbidden_imports(project, [RUNTIME], others) + [
        item for item in project.imports if item.source.startswith(RUNTIME + ".") and item.target == "splitformer"]
    assert not found, _lines(found)
    assert any(item.source.startswith(RUNTIME) for item in project.imports)  # control: its own imports are seen


def _within_runtime(found) -> bool:
    return found.source.startswith(RUNTIME + ".") and found.target.startswith(RUNTIME + ".")


def test_no_private_names_imported_across_modules(project):
    found = [item for item in private_imports(project) if not _within_runtime(item)]
    assert not found, _lines(found)


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")


def test_negative_control_a_broken_package_is_reported(tmp_path):
    """A circle through a deferred import, a private import, an upward import and an emitter
    importing the verifier, in a package laid out as the project is; plus what must not count."""
    _write(tmp_path / "root", {"__init__.py": ""})
    _write(tmp_path / "core", {"__init__.py": "", "a.py": "from .b import helper\n",
                               "b.py": "def helper():\n    from . import a\n",
                               "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n",
                               "d.py": "from .c import __all__\nfrom pkg.gen import render\n"})
    _write(tmp_path / "gen", {"__init__.py": "", "render.py": "from .check import _secret\n",
                              "check.py": "import importlib\n_secret = 1\nimportlib.import_module('pkg.gen.render')\n"})
    graph = read_package({"pkg": tmp_path / "root", "pkg.core": tmp_path / "core", "pkg.gen": tmp_path / "gen"})
    assert circles(graph) == [["pkg.core.a", "pkg.core.b"], ["pkg.gen.check", "pkg.gen.render"]]
    assert [(item.source, item.name) for item in private_imports(graph)] == [("pkg.gen.render", "_secret")]
    assert [item.source for item in forbidden_imports(graph, ["pkg.core"], ["pkg.gen"])] == ["pkg.core.d"]
    assert [item.target for item in forbidden_imports(graph, ["pkg.gen.render"], ["pkg.gen.check"])] == ["pkg.gen.check"]
    # the import under TYPE_CHECKING (c → d) is not counted: with it, c and d would be a circle;
    # the dunder d imports from c (``__all__``) is not a private name
    assert graph.edges()["pkg.core.c"] == set() and graph.edges()["pkg.core.d"] == {"pkg.core.c", "pkg.gen.render"}


#: A comparison of the backend's name: what only the backend (``codegen/backends.py``) and its own templates
#: (``templates/numpy/``, ``templates/torch/``) may do.
_BACKEND_TEST = re.compile(r"""backend\s*(==|!=)|["'](numpy|torch)["']\s*(==|!=)|backend\s+(not\s+)?in\s*[(\[{"']""")


def _names_the_backend(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _BACKEND_TEST.search(line)]


def test_emission_asks_the_backend_object_not_its_name():
    """Render, reports and the shared templates read what differs from ``Backend`` (its methods and attributes) or
    from the backend's own templates; none compares a backend's name."""
    sources = [ROOT / "codegen" / f"{name.rsplit('.', 1)[-1]}.py" for name in EMISSION if "templates" not in name]
    sources = [path for path in sources if path.is_file() and path.name != "backends.py"]
    sources += [ROOT / "codegen" / "passes" / path.name for path in (ROOT / "codegen" / "passes").glob("*.py")]
    sources += [path for path in (ROOT / "templates").rglob("*.j2")
                if path.parent.name not in ("numpy", "torch")]
    assert len(sources) > 30
    found = {str(path.relative_to(ROOT)): _names_the_backend(path.read_text(encoding="utf-8")) for path in sources}
    assert not {path: lines for path, lines in found.items() if lines}


@pytest.mark.parametrize("line", ['{% if backend == "numpy" %}', "if backend != 'torch':", '"torch" == backend',
                                  'x if backend in ("torch",) else y'])
def test_negative_control_a_backend_comparison_is_found(line):
    assert _names_the_backend(f"a = 1\n{line}\n") == [line]
