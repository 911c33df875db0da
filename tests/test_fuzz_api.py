"""Fuzzing the Python API and plug-in loading: never an exception but ``SplitformerError`` (one line).

The scheme-file and command-line fuzzers are in ``test_bad_input.py``; these reach the pipeline
the other ways: ``Scheme`` objects given to ``splitformer.derive``, folders given to ``write``,
Python files given to ``load_plugin``. The slow stages (the derivation itself, code generation)
are replaced by stand-ins: what is fuzzed is what happens before them and around them.
"""

import ast
import itertools
import os
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import splitformer
from splitformer import SplitformerError
from splitformer.codegen import api
from splitformer.codegen.render import environment, python_string
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from splitformer.symbolic.tableaux import HEUN, RK4, TABLEAUX

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(['"""', "\\", "\n", "x\r", "../../escaped", "a" * 250, "\x00",
                                                         "\u2028", "post-ln", "ffn", "attn", "norm", "relu"]))
_ANY = st.one_of(_TEXT, st.integers(-2, 3), st.floats(allow_nan=True), st.none(), st.booleans(),
                 st.lists(st.integers(), max_size=2), st.dictionaries(_TEXT, st.integers(), max_size=2))
_KEYS = st.one_of(st.sampled_from(["attn", "ffn", "norm", "forward", "class"]), _TEXT)
_KINDS = st.one_of(st.sampled_from(["attention", "feed-forward", "layer-norm", "rms-norm", "nope"]), _ANY)
_RATIONAL = st.one_of(st.sampled_from([sp.Integer(1), sp.Rational(1, 2), sp.Integer(0), sp.Integer(-1)]),
                      st.floats(0, 1), st.integers(-1, 2))


def _built(cls, *arguments, **fields):
    """``cls(...)``; where its constructor refuses a number, the object with the raw value put past it
    (a tampered frozen object must still be refused by ``derive``, in one line)."""
    try:
        return cls(*arguments, **fields)
    except SplitformerError:
        built = cls.__new__(cls)
        for name, value in zip(("branches", "weights") if cls is Parallel else (), arguments):
            object.__setattr__(built, name, value)
        for name, value in {"fraction": 1, "on": None, **fields}.items():
            object.__setattr__(built, name, value)
        return built


_SUBSTEPS = st.builds(partial(_built, Substep), operator=st.one_of(_KEYS, _ANY),
                      solver=st.one_of(st.sampled_from(["explicit", "projection", "rk7"]), _ANY),
                      fraction=_RATIONAL, on=st.one_of(st.none(), _KEYS, _ANY))
_STEPS = st.recursive(
    _SUBSTEPS,
    lambda inner: st.one_of(
        st.builds(partial(_built, Parallel), st.lists(st.builds(Sequence, st.lists(inner, max_size=2).map(tuple)), max_size=3).map(tuple),
                  st.lists(_RATIONAL, max_size=3).map(tuple)),
        st.builds(RungeKutta, st.lists(_SUBSTEPS, max_size=2).map(tuple),
                  st.one_of(st.sampled_from([HEUN, RK4]), _ANY)),
        _ANY,
    ),
    max_leaves=6,
)
_BODIES = st.one_of(st.builds(Sequence, st.lists(_STEPS, max_size=3).map(tuple)), _ANY,
                    st.just(Sequence((Substep("ffn", "explicit"),))))
_SCHEMES = st.builds(
    Scheme,
    name=st.one_of(st.sampled_from(["fuzz", "tiny-one"]), _TEXT, _ANY),
    summary=st.one_of(st.just("a summary"), _TEXT, _ANY),
    operators=st.one_of(st.just({"ffn": "feed-forward"}), st.dictionaries(_KEYS, _KINDS, max_size=3), _ANY),
    body=_BODIES,
    activation=st.one_of(st.sampled_from(["relu", "gelu"]), _ANY),
    final_norm=st.one_of(st.booleans(), _ANY),
    description=st.one_of(st.just(""), _ANY),
    claims=st.one_of(st.just({}), st.dictionaries(st.sampled_from(["order", "splitting_order", "speed"]), _ANY,
                                                  max_size=2), _ANY),
    causal=st.one_of(st.booleans(), _ANY),
    options=st.one_of(st.just({}), st.dictionaries(_KEYS, st.dictionaries(_TEXT, _ANY, max_size=2), max_size=2), _ANY),
)


@pytest.fixture
def no_derivation(monkeypatch):
    """Stand-ins for the derivation and its result: they are not what is fuzzed here."""
    monkeypatch.setattr(api, "derive_program", lambda scheme: None)
    monkeypatch.setattr(api, "Derivation", lambda scheme, program, passes, **_: SimpleNamespace(scheme=scheme))


@FUZZ
@given(scheme=_SCHEMES, activation=st.one_of(st.none(), st.sampled_from(["gelu", "swish"]), _ANY),
       passes=st.one_of(st.none(), st.sampled_from(["all", "none", "matmul", "turbo"]), _ANY))
def test_fuzz_scheme_objects_given_to_derive(scheme, activation, passes, no_derivation):
    """Any ``Scheme`` object, activation and passes: a checked scheme reaches the derivation, or one error line."""
    try:
        derivation = splitformer.derive(scheme, activation=activation, passes=passes)
    except SplitformerError as error:
        assert "\n" not in str(error) and str(error)
    else:
        checked = derivation.scheme
        assert checked.substeps() and isinstance(checked.summary, str) and "\n" not in checked.summary
        assert Path(f"{checked.module_name}.py").name == f"{checked.module_name}.py"  # a plain file name


@FUZZ
@given(text=st.text())
def test_fuzz_text_is_a_literal_of_itself_in_emitted_code(text):
    """The filters that place text in code: a string literal, a docstring and a comment keep it text."""
    assert ast.literal_eval(python_string(text)) == text
    docstring = environment().from_string('"""{{ text | doc }}"""').render(text=text)
    assert ast.literal_eval(docstring) == text
    comment = environment().from_string("# {{ text | comment }}\nx = 1\n").render(text=text)
    assert [type(node) for node in ast.parse(comment).body] == [ast.Assign]


_COMPONENT = st.one_of(st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=12),
                       st.sampled_from(["..", ".", "a" * 300, "link-out", "link-in", "file"]))
_counter = itertools.count()


@FUZZ
@given(parts=st.lists(_COMPONENT, min_size=1, max_size=3))
def test_fuzz_write_folders(parts, monkeypatch):
    """Any folder ``write`` is given, symbolic links and ``..`` included: files land inside it, or one error line."""
    sandbox = Path(tempfile.mkdtemp(prefix="splitformer-fuzz-write-"))
    try:
        outside = sandbox / "outside"
        base = sandbox / "base" / "inner"
        outside.mkdir()
        base.mkdir(parents=True)
        (base / "link-out").symlink_to(outside)
        (base / "link-in").symlink_to(base)
        (base / "file").write_text("a file")
        out = base.joinpath(*parts)
        before = _files(sandbox)
        monkeypatch.setattr(api, "generate", lambda scheme, backends, out, *rest: {
            out / "__init__.py": '"""generated by splitformer"""\n', out / "numpy" / "m.py": '"""generated by splitformer"""\n'})
        monkeypatch.setattr(api.Derivation, "_unchanged", lambda self: None)  # a bare object: nothing was checked
        derivation = object.__new__(api.Derivation)
        derivation.scheme, derivation.passes, derivation.program = None, None, None
        derivation.__dict__["lowered"] = None
        try:
            written = derivation.write(out)
        except SplitformerError as error:
            assert "\n" not in str(error)
            assert _files(sandbox) == before  # nothing half-written
            return
        real = os.path.realpath(out)
        for path in written:
            assert os.path.realpath(path).startswith(real + os.sep)
        created = _files(sandbox) - before
        for path in map(os.path.realpath, created):  # inside ``out``, or a folder made on the way to it
            assert path.startswith(real + os.sep) or (real + os.sep).startswith(path + os.sep), (path, real)
        assert not any(os.path.basename(path).startswith(".splitformer-") for path in created)
    finally:
        shutil.rmtree(sandbox)


def _files(folder: Path) -> set[str]:
    """Every file and folder under ``folder``, symbolic links not followed."""
    return {os.path.join(top, name) for top, folders, files in os.walk(folder) for name in folders + files}


_PLUGIN_PARTS = st.lists(st.sampled_from([
    "register_operator(Kind)",
    "register_tableau(make_tableau('fuzz-tableau', [[]], [1]))",
    "register_tableau(Tableau('fuzz-implicit', ((sp.Integer(1),),), (sp.Integer(1),)))",
    "raise RuntimeError('late')",
    "import sys; sys.exit(2)",
    "register_operator(42)",
    "register_operator(Kind)",
    "def broken(:",
    "Kind.kind = 'Bad Name'",
    "OTHER = 1",
]), max_size=4)
_RHS = st.sampled_from(["2 * apply(STATE, X, Y)", "1.5", "'u'", "apply('nosuch', X, Y)", "sp.Symbol('zz') * apply(STATE, X, Y)",
                        "apply(STATE, X, Y) + sp.Symbol(\"__import__('os').system('true')\")", "None",
                        # objects that print themselves (attack7 F5, F10): refused whatever they equal
                        "Printing('eps', positive=True) * apply(STATE, X, Y)",
                        "sp.Symbol(Text('eps'), positive=True) * apply(STATE, X, Y)", "tanh(apply(STATE, X, Y))",
                        "sp.Function(STATE, _splitformer_code=CODE)(X.symbol, Y.symbol)"])
_PLUGIN = """
from dataclasses import dataclass
from typing import ClassVar
import sympy as sp
from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, register_operator
from splitformer.symbolic.tableaux import Tableau, make_tableau, register_tableau

CODE = lambda *arguments, **options: "__import__('os')"
class Printing(sp.Symbol):
    _splitformer_code = _sympystr = CODE
class Text(str):
    __str__ = __format__ = CODE
class tanh(sp.tanh):
    _splitformer_code = _sympystr = CODE

@dataclass(frozen=True)
class Kind(Operator):
    kind: ClassVar[str] = "fuzz-kind"
    symbol: ClassVar[str] = "F"
    def parameters(self):
        return ()
    def definitions(self):
        return (Definition({function!r}, {latex!r}, (X, Y), {rhs}, "m"),)

"""


@FUZZ
@given(parts=_PLUGIN_PARTS, rhs=_RHS, function=st.sampled_from(["out", "out; import os", "9x"]),
       latex=st.sampled_from(["F", "F\nimport os"]))
def test_fuzz_plugin_loading(parts, rhs, function, latex, no_derivation):
    """Any plug-in file: loaded whole or not at all (one error line), and its kinds derive or fail in one line."""
    kinds, tableaux, modules = dict(OPERATOR_KINDS), dict(TABLEAUX), set(sys.modules)
    folder = Path(tempfile.mkdtemp(prefix="splitformer-fuzz-plugin-"))
    try:
        path = folder / f"plugin_{next(_counter)}.py"
        path.write_text(_PLUGIN.format(function=function, latex=latex, rhs=rhs) + "\n".join(parts) + "\n")
        try:
            splitformer.load_plugin(path)
        except SplitformerError as error:
            assert "\n" not in str(error)
            assert OPERATOR_KINDS == kinds and TABLEAUX == tableaux  # nothing of a failed load stays
            return
        assert "fuzz-implicit" not in TABLEAUX
        if "fuzz-kind" in OPERATOR_KINDS:
            scheme = Scheme("fuzz", "s", {"f": "fuzz-kind"}, Sequence((Substep("f", "explicit"),)))
            try:
                splitformer.derive(scheme)
            except SplitformerError as error:
                assert "\n" not in str(error) and "fuzz-kind" in str(error)
            else:
                assert rhs == "2 * apply(STATE, X, Y)" and function == "out" and latex == "F"
    finally:
        OPERATOR_KINDS.clear()
        OPERATOR_KINDS.update(kinds)
        TABLEAUX.clear()
        TABLEAUX.update(tableaux)
        for name in set(sys.modules) - modules:
            if name.startswith("splitformer_plugin_"):
                del sys.modules[name]
        shutil.rmtree(folder)
