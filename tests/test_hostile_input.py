"""What a hostile or careless user does beyond test_bad_input.py: faulty ``--load`` files and kinds,
a demo without its inputs. Each ends in one ``error: …`` line and status 2, nothing written."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from splitformer.codegen.cli import main
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.tableaux import TABLEAUX


@pytest.fixture(autouse=True)
def _registry_restored():
    """The faulty kinds these tests load must not stay registered (nor their files loaded) for other tests."""
    kinds, tableaux, modules = dict(OPERATOR_KINDS), dict(TABLEAUX), set(sys.modules)
    yield
    own = {kind: cls for kind, cls in OPERATOR_KINDS.items() if cls.__module__.startswith("splitformer.")}
    OPERATOR_KINDS.clear()
    OPERATOR_KINDS.update(kinds)
    OPERATOR_KINDS.update(own)  # kinds splitformer's modules registered on their first import (the vision kinds)
    TABLEAUX.clear()
    TABLEAUX.update(tableaux)
    for name in set(sys.modules) - modules:
        if name.startswith("splitformer_plugin_"):
            del sys.modules[name]

_KIND = """
from dataclasses import dataclass
from typing import ClassVar
from splitformer.symbolic.domains import FEATURES, XI, X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator

@register_operator
@dataclass(frozen=True)
class Faulty(Operator):
    kind: ClassVar[str] = {kind!r}
    symbol: ClassVar[str] = "L"
{body}
"""


def _plugin_and_scheme(tmp_path, kind, body):
    plugin = tmp_path / f"{kind.replace('-', '_')[:20] or 'empty'}.py"
    plugin.write_text(_KIND.format(kind=kind, body=textwrap.indent(textwrap.dedent(body), "    ")))
    scheme = tmp_path / "faulty.toml"
    scheme.write_text(f'name = "faulty"\nsummary = "s"\n[operators]\nf = "{kind}"\n'
                      '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    return plugin, scheme


@pytest.mark.parametrize("kind, body, message", [
    ("qa-raises", "def parameters(self): raise RuntimeError('nope')\ndef definitions(self): return ()",
     "operator 'f' (qa-raises): RuntimeError: nope"),
    ("qa-garbage", "def parameters(self): return 42\ndef definitions(self): return ()",
     "parameters() must return a tuple of Parameter, got int"),
    ("qa-strings", "def parameters(self): return ()\ndef definitions(self): return ('out',)",
     "definitions() must return a tuple of Definition, got str"),
    ("qa-empty", "def parameters(self): return ()\ndef definitions(self): return ()",
     "definitions() is empty"),
    ("qa-init", "def __post_init__(self): raise KeyError('x')\n"
                "def parameters(self): return ()\ndef definitions(self): return ()",
     "operator 'f' (qa-init): KeyError"),
    # a tester (s43): sys.exit in a kind's method ended every command with status 0, nothing done or said
    ("qa-exits", "def parameters(self):\n    import sys; sys.exit(0)\ndef definitions(self): return ()",
     "operator 'f' (qa-exits): SystemExit: 0"),
])
@pytest.mark.parametrize("command", ["derive", "check"])
def test_a_faulty_users_kind_is_one_line(kind, body, message, command, tmp_path, capsys):
    plugin, scheme = _plugin_and_scheme(tmp_path, kind, body)
    out = ["--out", str(tmp_path / "out")] if command == "derive" else []
    assert main([command, "--load", str(plugin), str(scheme), *out]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and message in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["Bad", "x y\nz", "with_underscore", "-lead", "a" * 65])
def test_a_kind_name_must_be_lower_case_words(kind, tmp_path, capsys):
    plugin, _ = _plugin_and_scheme(tmp_path, kind, "def parameters(self): return ()\ndef definitions(self): return ()")
    assert main(["show", "--load", str(plugin), "post-ln"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is not a kind name" in error, error


@pytest.mark.parametrize("code, shown", [("raise SystemExit(7)", "SystemExit: 7"),
                                         ("import sys; sys.exit('boom')", "SystemExit: boom")])
def test_a_load_file_that_exits_is_one_line(code, shown, tmp_path, capsys):
    plugin = tmp_path / "exits.py"
    plugin.write_text(code)
    assert main(["show", "--load", str(plugin), "post-ln"]) == 2
    assert capsys.readouterr().err == f"error: --load {plugin}: {shown}\n"


def test_the_demo_without_generated_files_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "post-ln", "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no ") and result.stderr.count("\n") == 1, result.stderr


_RK_SCHEME = """name = "labelled"
summary = "s"
[operators]
attn = "attention"
norm1 = "layer-norm"
[tableaux.mine]
label = {label}
a = [[], [1]]
b = ["1/2", "1/2"]
[[steps]]
rk = "mine"
fields = [{{ operator = "attn", on = "norm1" }}]
"""


@pytest.mark.parametrize("label", [
    r'"Heun\n    __import__(\"os\").system(\"echo pwned\")\n    #"',  # would run when forward() is called
    r'"x \"\"\" y"', r'"a\\b"', r'"tab\there"',
    '"Heun <img src=x onerror=alert(12)>"', '"Heun [click](http://evil.example/)"', '"Heun $x$"',  # attack 18: reports
])
def test_a_tableau_label_cannot_reach_the_generated_code_as_code(label, tmp_path, capsys):
    scheme = tmp_path / "labelled.toml"
    scheme.write_text(_RK_SCHEME.format(label=label))
    assert main(["derive", str(scheme), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "label must be one printable line" in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["Bad", "two words", "x\nimport os", ""])
def test_a_registered_tableau_needs_a_tableau_name(name):
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.tableaux import make_tableau

    with pytest.raises(SplitformerError, match="is not a tableau name"):
        make_tableau(name, [[], [1]], ["1/2", "1/2"])


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_an_option_that_is_not_finite_is_refused(value, tmp_path, capsys):
    from conftest import ROOT

    scheme = tmp_path / "scaled.toml"
    scheme.write_text(f'name = "scaled"\nsummary = "s"\n[operators]\nf = {{ kind = "scaled-field", scale = {value} }}\n'
                      '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    plugin = ROOT / "tests" / "plugins" / "my_kinds.py"
    assert main(["derive", "--load", str(plugin), str(scheme), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "operators.f.scale" in error and "is not a finite number" in error, error


_DEFINITION = "def parameters(self): return ()\ndef definitions(self):\n    import sympy as sp\n    return ({},)"


@pytest.mark.parametrize("kind, definition, message", [
    ("qa-float", "Definition('out', 'L', (X, Y), 1.5, 'm')", "rhs must be a SymPy expression, got float"),
    ("qa-text", "Definition('out', 'L', (X, Y), 'u', 'm')", "rhs must be a SymPy expression, got str"),
    ("qa-undefined", "Definition('out', 'L', (X, Y), apply('nosuch', X, Y), 'm')", "applies 'nosuch'"),
    ("qa-code", "Definition('out', 'L', (X, Y), apply(STATE, X, Y) * sp.Symbol(\"__import__('os').system('true')\"), "
                "'m')", "the symbol \"__import__('os')"),
    ("qa-free", "Definition('out', 'L', (X, Y), sp.Symbol('zz') * apply(STATE, X, Y), 'm')", "the symbol 'zz'"),
    ("qa-function", "Definition('out; import os', 'L', (X, Y), apply(STATE, X, Y), 'm')", "is not an identifier"),
    ("qa-latex", "Definition('out', 'L\\nimport os', (X, Y), apply(STATE, X, Y), 'm')",
     "latex: must be one printable line"),
    ("qa-arguments", "Definition('out', 'L', (X,), apply(STATE, X, Y), 'm')",
     "its last definition, 'out', is its output, but it is on (x): a block step's operator is a field of the state "
     "u(x, y)"),
])
def test_a_malformed_definition_is_one_line_naming_the_kind_and_nothing_is_written(kind, definition, message,
                                                                                    tmp_path, capsys):
    """Never a traceback, never exit 0 with modules that fail at import (or run a plug-in's text as code)."""
    plugin, scheme = _plugin_and_scheme(tmp_path, kind, _DEFINITION.format(definition))
    assert main(["derive", "--load", str(plugin), str(scheme), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and message in error and kind in error, error
    assert not (tmp_path / "out").exists()


def test_a_well_formed_definition_derives(tmp_path, capsys):
    """Control for the test above: the same plug-in with a sound definition is written and imports."""
    import importlib.util

    plugin, scheme = _plugin_and_scheme(tmp_path, "qa-sound", _DEFINITION.format(
        "Definition('out', 'L', (X, Y), 2 * apply(STATE, X, Y), 'm')"))
    assert main(["derive", "--load", str(plugin), str(scheme), "--out", str(tmp_path / "out"), "--backend", "numpy"]) == 0
    spec = importlib.util.spec_from_file_location("faulty", tmp_path / "out" / "numpy" / "faulty.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.mark.parametrize("late", ["raise RuntimeError('late')", "import sys; sys.exit(3)",
                                  "register_operator(Faulty)\nregister_operator(42)"])
def test_a_plugin_that_fails_after_registering_leaves_no_registration(late, tmp_path, capsys):
    plugin, _ = _plugin_and_scheme(tmp_path, "qa-late", "def parameters(self): return ()\n"
                                                        "def definitions(self): return ()")
    plugin.write_text(plugin.read_text() + "\nfrom splitformer.symbolic.tableaux import make_tableau, register_tableau\n"
                      "register_tableau(make_tableau('qa-late', [[]], [1]))\n" + late + "\n")
    assert main(["show", "--load", str(plugin), "post-ln"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert "qa-late" not in OPERATOR_KINDS and "qa-late" not in TABLEAUX
    assert not any(name.startswith("splitformer_plugin_qa_late") for name in sys.modules)


_REPEATED = """
from dataclasses import dataclass
from typing import ClassVar
from splitformer.symbolic.constraints import U, Bound, ConstraintSet
from splitformer.symbolic.operators import ProjectionOperator, register_operator

@register_operator
@dataclass(frozen=True)
class Repeated(ProjectionOperator):
    kind: ClassVar[str] = "qa-repeated"
    symbol: ClassVar[str] = "P"
    constraint: ClassVar[str] = "S_r"
    constraints: ClassVar[ConstraintSet] = ConstraintSet(name="S_r", latex="S_r", bounds=(Bound(U), Bound(U)))
    affine: ClassVar[tuple[str, ...]] = ()
    projection_meaning: ClassVar[str] = "repeated bounds"
"""


def test_a_projection_whose_constraints_repeat_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    plugin, scheme = tmp_path / "repeated.py", tmp_path / "repeated.toml"
    plugin.write_text(_REPEATED)
    scheme.write_text('name = "repeated"\nsummary = "s"\n[operators]\nattn = "attention"\np = "qa-repeated"\n'
                      '[[steps]]\noperator = "attn"\nsolver = "explicit"\non = "p"\n')
    assert main(["derive", "--load", str(plugin), str(scheme), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "projection onto S_r: bound 2 repeats bound 1" in error, error


_MARKED_SET = """
from dataclasses import dataclass
from typing import ClassVar
import sympy as sp
from splitformer.symbolic.constraints import SYMBOLS, G, U, ConstraintSet, Moment, Statistic
from splitformer.symbolic.operators import ProjectionOperator, register_operator

RADIUS = sp.Symbol({radius!r}, positive=True)
SPHERE = ConstraintSet(name={name!r}, latex={latex!r}, moments=(Moment(U**2, RADIUS**2, G**2),), ghost=True,
                       statistics=(Statistic("rho", sp.Symbol({rho!r}, positive=True), {rho_latex!r}, SYMBOLS.v**2,
                                             {meaning!r}),))

@register_operator
@dataclass(frozen=True)
class Marked(ProjectionOperator):
    kind: ClassVar[str] = "qa-marked"
    symbol: ClassVar[str] = {symbol!r}
    constraint: ClassVar[str] = {constraint!r}
    constraints: ClassVar[ConstraintSet] = SPHERE
    values: ClassVar[dict] = {{RADIUS: 1}}
    affine: ClassVar[tuple[str, ...]] = ("gain",)
"""
_SOUND_SET = {"radius": r"\sigma", "latex": r"S_{\mathrm{sphere}}(\sigma)", "rho": "rho", "rho_latex": r"\rho",
              "meaning": "mean square over features", "name": "S_sphere", "symbol": "P", "constraint": "S"}


@pytest.mark.parametrize("field, text, message", [
    ("rho", "rho$$\n\n<img src=x onerror=alert(1)>\n\n$$", "constraint set symbol"),  # attack 18: closed the math
    ("rho", "rho <img src=x onerror=alert(1)>", "constraint set symbol"),
    ("radius", r"\href{javascript:alert(1)}{r}", "constraint set symbol"),
    ("latex", "S$$ <img src=x onerror=alert(8)> $$", "constraint set latex"),
    ("rho_latex", r"\rho $x$", "definition 'rho' latex"),
    ("meaning", "mean [click](http://evil.example/)", "definition 'rho' meaning"),
    # attack 19: the kind's symbol and constraint (its LaTeX in equations), the set's name (in check statements)
    ("symbol", r"P$$ <img src=x onerror=alert(1)> $$", "symbol: must hold no markup"),
    ("symbol", r"\href{javascript:alert(3)}{P}", "symbol: must hold no markup"),
    ("constraint", "S [click](javascript:alert(2))", "constraint: must hold no markup"),
    ("name", "S_0$$ <img src=x onerror=alert(1)> $$", "constraint set name"),
])
def test_a_projection_whose_constraint_set_holds_markup_is_one_line(field, text, message, tmp_path, capsys,
                                                                     monkeypatch):
    """Attack 18: a plug-in projection's statistic symbol name (printed by name in the report's math) and its set's
    LaTeX closed the report's display math, and raw HTML and links followed. Control: the sound set derives."""
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    scheme = tmp_path / "marked.toml"
    scheme.write_text('name = "marked"\nsummary = "s"\n[operators]\nattn = "attention"\np = "qa-marked"\n'
                      '[[steps]]\noperator = "attn"\nsolver = "explicit"\non = "p"\n')
    for name, fields, status in (("sound", _SOUND_SET, 0), ("marked", {**_SOUND_SET, field: text}, 2)):
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(_MARKED_SET.format(**fields))
        out = tmp_path / name
        assert main(["derive", "--load", str(plugin), str(scheme), "--backend", "numpy", "--out", str(out)]) == status
        error = capsys.readouterr().err
        OPERATOR_KINDS.pop("qa-marked", None)
    assert error.count("\n") == 1 and message in error and "must" in error and "qa-marked" in error, error
    assert not out.exists()


def test_a_failed_plugin_keeps_the_kinds_splitformer_registered_while_it_loaded(tmp_path):
    """The vision kinds register when their module is first imported; a plug-in that imports it and
    then fails is rolled back without them disappearing (a fresh process: nothing imported before)."""
    plugin = tmp_path / "imports_then_fails.py"
    plugin.write_text("import splitformer.symbolic.vision_operators\nraise RuntimeError('late failure')\n")
    code = (f"from splitformer.symbolic.plugins import load_plugin\n"
            f"from splitformer.symbolic.kinds import OPERATOR_KINDS\n"
            f"import sys\n"
            f"assert 'splitformer.symbolic.vision_operators' not in sys.modules\n"
            f"from splitformer import SplitformerError\n"
            f"try:\n    load_plugin({str(plugin)!r})\nexcept SplitformerError as error:\n    print('SplitformerError')\n"
            f"print('patch-embedding' in OPERATOR_KINDS)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["SplitformerError", "True"], result.stdout + result.stderr


def test_the_demo_passes_on_the_generated_folder(capsys):
    from demo import main as demo  # tools/demo.py

    assert demo(["post-ln", "--out", str(Path(__file__).parent.parent / "generated")]) == 0
    shown = capsys.readouterr().out
    assert "all checks hold" in shown and shown.count(" ok\n") == 8, shown


def test_what_a_plugin_prints_goes_to_stderr_leaving_the_json_whole(tmp_path, capsys):
    """A tester (s43): a kind whose ``definitions()`` printed broke ``check --format json``'s output; what plug-in code
    prints, at load and while the command runs, goes to stderr, and stdout is the command's text alone."""
    import json

    plugin = tmp_path / "noisy.py"
    plugin.write_text("from dataclasses import dataclass\nfrom typing import ClassVar\n"
                      "from splitformer.symbolic.operators import FeedForward, register_operator\n"
                      "print('NOISE at load')\n\n@register_operator\n@dataclass(frozen=True)\n"
                      "class Noisy(FeedForward):\n    kind: ClassVar[str] = 'qa-noisy'\n\n"
                      "    def definitions(self):\n        print('NOISE from definitions')\n"
                      "        return super().definitions()\n")
    scheme = tmp_path / "noisy.toml"
    scheme.write_text('name = "noisy"\nsummary = "s"\n[operators]\nf = "qa-noisy"\n[[steps]]\noperator = "f"\n'
                      'solver = "explicit"\n')
    status = main(["check", "--load", str(plugin), str(scheme), "--only", "semantics", "--format", "json"])
    captured = capsys.readouterr()
    assert status in (0, 1) and json.loads(captured.out)["checks"], captured.err
    assert "NOISE at load" in captured.err and "NOISE" not in captured.out
