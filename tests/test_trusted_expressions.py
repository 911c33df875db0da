"""Only SymPy's own classes and plain ``str`` names reach the printers (seventh attacker, F5/F10/F4).

A plug-in kind's definitions, an activation's formula, a tableau's coefficients and a kind's
constants are SymPy objects a user hands over; each mechanism by which such an object printed its
own text into emitted code (a subclass with the printer's method, a ``str`` subclass as a name, a
``Function`` subclass under a known name, a number subclass) is refused in one line naming the
kind and the node, and no file is written. The printers hold the same rule on their own.
"""

import tomllib

import pytest
import sympy as sp

from splitformer import SplitformerError
from splitformer.codegen.ir import Module
from splitformer.codegen.printers import NumpyPrinter, TorchPrinter
from splitformer.symbolic.activations import ACTIVATIONS, V, register_activation
from splitformer.symbolic.inputs import Constant
from splitformer.symbolic.operator_checks import check_declared
from splitformer.symbolic.tableaux import Tableau
from splitformer.symbolic.toml_text import toml_value
from splitformer.symbolic.trusted_expressions import FUNCTIONS, untrusted_node

PAYLOAD = "(__import__('os').system('echo PWNED > {marker}') * 0 + eps)"

_PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar
import sympy as sp
from splitformer.symbolic.domains import FEATURES, XI, X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator

PAYLOAD = {payload!r}

class Eps(sp.Symbol):  # prints itself through the printer's method (F5)
    def _splitformer_code(self, printer, **kwargs):
        return PAYLOAD
    _sympystr = _numpycode = _pythoncode = _splitformer_code

class Sneaky(str):  # a name equal to 'eps' that prints other text (F10)
    def __str__(self):
        return PAYLOAD
    def __format__(self, spec):
        return PAYLOAD

class tanh(sp.tanh):  # a Function subclass under a name the printers know
    def _splitformer_code(self, printer, **kwargs):
        return PAYLOAD
    _sympystr = _splitformer_code

FACTORS = {{
    "symbol-subclass": lambda: Eps("eps", positive=True),
    "str-subclass-name": lambda: sp.Symbol(Sneaky("eps"), positive=True),
    "function-subclass": lambda: tanh(sp.Symbol("eps", positive=True)),
    "plain": lambda: sp.Symbol("eps", positive=True),
}}

@register_operator
@dataclass(frozen=True)
class Field(Operator):
    kind: ClassVar[str] = "qa-trust-field"
    symbol: ClassVar[str] = r"\\mathcal{{E}}"
    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)
    def definitions(self):
        rhs = FACTORS[{mechanism!r}]() * integral(self.parameters()[0].applied() * apply(STATE, X, XI), XI)
        return (Definition("out", r"\\mathcal{{E}}", (X, Y), rhs, "a field"),)
'''
_SCHEME = 'name = "trust"\nsummary = "s"\n[operators]\nf = "qa-trust-field"\n[[steps]]\noperator = "f"\nsolver = "explicit"\n'


def _derive(mechanism, tmp_path, capsys, monkeypatch):
    from splitformer.codegen.cli import main
    from splitformer.symbolic.kinds import OPERATOR_KINDS

    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    marker = tmp_path / "pwned"
    plugin, scheme = tmp_path / "trust_kind.py", tmp_path / "trust.toml"
    plugin.write_text(_PLUGIN.format(payload=PAYLOAD.format(marker=marker), mechanism=mechanism))
    scheme.write_text(_SCHEME)
    try:
        status = main(["derive", "--load", str(plugin), str(scheme), "--out", str(tmp_path / "out")])
    finally:
        OPERATOR_KINDS.pop("qa-trust-field", None)
    return status, capsys.readouterr().err, tmp_path / "out", marker


@pytest.mark.parametrize("mechanism, node", [
    ("symbol-subclass", "the node 'eps' of class Eps (module splitformer_plugin_trust_kind"),
    ("str-subclass-name", "the Symbol 'eps': its name is a Sneaky, not a str"),
    ("function-subclass", "a node of class tanh (module splitformer_plugin_trust_kind"),
])
def test_a_plugin_node_that_prints_itself_is_refused_before_any_file(mechanism, node, tmp_path, capsys, monkeypatch):
    """The attacker's reproducers (a07, a16) and a Function subclass: exit 2, one line naming the kind, its
    definition and the node; no folder written, nothing run."""
    status, error, out, marker = _derive(mechanism, tmp_path, capsys, monkeypatch)
    assert status == 2 and error.count("\n") == 1, error
    assert "operator 'f' (qa-trust-field): definition 'out': " + node in error, error
    assert not out.exists() and not marker.exists()


def test_the_same_plugin_with_sympys_own_symbol_derives(tmp_path, capsys, monkeypatch):
    """Control: a plain ``Symbol('eps')`` is emitted as ``eps``."""
    status, error, out, marker = _derive("plain", tmp_path, capsys, monkeypatch)
    assert status == 0, error
    code = (out / "numpy" / "trust.py").read_text()
    assert "f_out = eps * " in code and "PWNED" not in code and not marker.exists()


class _Printing(sp.Symbol):
    def _splitformer_code(self, printer, **kwargs):
        return "PWNED"

    _sympystr = _splitformer_code


class _Text(str):
    def __str__(self):
        return "PWNED"

    __format__ = __repr__ = lambda self, *spec: "PWNED"


class Pi(sp.Symbol):
    """Borrows ``_print_Pi`` by its class name."""


@pytest.mark.parametrize("printer", [NumpyPrinter, TorchPrinter])
@pytest.mark.parametrize("expr", [_Printing("eps"), sp.Symbol(_Text("qa_text")), Pi("eps")],
                         ids=["method", "name", "class-name"])
def test_the_printers_refuse_what_the_checks_would_refuse(printer, expr):
    """By construction, not only at the entry: no ``printmethod``, dispatch on SymPy's own classes only,
    symbols printed by their exact ``str`` names."""
    with pytest.raises(AssertionError):
        printer(Module.__new__(Module)).doprint(2 * expr)
    assert printer(Module.__new__(Module)).doprint(2 * sp.Symbol("qa_plain")) == "2*qa_plain"  # control


@pytest.mark.parametrize("expr, wrong", [
    (sp.Integral(sp.Symbol("u"), (_Printing("x"), 0, 1)), "class _Printing"),  # a bound variable too
    (sp.Function("q", _splitformer_code=lambda *a, **k: "PWNED")(sp.Symbol("x")), "not a function made by"),
    (sp.Function("import")(sp.Symbol("x")), "not a function made by"),
    (sp.sign(sp.Symbol("x")), "class sign"),
    ("eps", "a str, not a SymPy expression"),
])
def test_every_node_is_walked(expr, wrong):
    assert wrong in untrusted_node(expr)


def test_the_printers_spell_every_known_function():
    """The registry the checks allow and the printers' spellings agree (Max, Min, Heaviside,
    KroneckerDelta have their own methods)."""
    for printer in (NumpyPrinter, TorchPrinter):
        methods = {name for name in ("Max", "Min", "Heaviside", "KroneckerDelta") if hasattr(printer, f"_print_{name}")}
        spelled = set(printer.functions) - {"sqrt", "sign"} | methods  # sqrt is a Pow; sign, Abs's derivative, is
        # written by the adjoint only
        assert {function.__name__ for function in FUNCTIONS} == spelled


class _Constant(sp.NumberSymbol):
    """An atom no name check sees."""

    def _splitformer_code(self, printer, **kwargs):
        return "PWNED"


def test_an_activation_atom_that_prints_itself_is_refused():
    with pytest.raises(SplitformerError, match=r"^register_activation 'qa-trust': the formula holds a node of class "
                                               r"_Constant \(module test_trusted_expressions\)"):
        register_activation("qa-trust", V * _Constant(), "a map", proximal=False)
    assert "qa-trust" not in ACTIVATIONS


class _Third(sp.Rational):
    def _sympystr(self, printer):
        return "PWNED"


def _third() -> sp.Rational:
    third = sp.Expr.__new__(_Third)
    third.p, third.q = 1, 3
    return third


def test_a_tableau_coefficient_subclass_is_refused():
    a = ((sp.S.Zero, sp.S.Zero), (sp.Rational(2, 3), sp.S.Zero))
    with pytest.raises(SplitformerError, match="b must be a non-empty tuple of exact rationals"):
        Tableau("qa-trust", a, (_third(), sp.Rational(2, 3)))
    with pytest.raises(SplitformerError, match="a must be 2 rows of 2 exact rationals"):
        Tableau("qa-trust", ((sp.S.Zero, sp.S.Zero), (_third(), sp.S.Zero)), (sp.Rational(1, 4), sp.Rational(3, 4)))
    Tableau("qa-trust", a, (sp.Rational(1, 3), sp.Rational(2, 3)))  # control


class _Float(float):
    def __repr__(self):
        return "1.0; import os"

    __str__ = __format__ = lambda self, *spec: "1.0; import os"


@pytest.mark.parametrize("constant, message", [
    (Constant(sp.Symbol("tau"), _Float(1.0), "a temperature"), "the default must be a finite number > 0"),
    (Constant(_Printing("tau"), 1.0, "a temperature"), "a constant's symbol must be a SymPy Symbol, got _Printing"),
    (Constant(sp.Symbol(_Text("tau")), 1.0, "a temperature"), "a name is a str, got _Text"),
])
def test_a_constant_of_another_type_is_refused(constant, message):
    with pytest.raises(SplitformerError, match=f"^operator 'f': .*{message}"):
        check_declared((constant,), (), "operator 'f'")


class _Int(int):
    def __str__(self):
        return "16, x = 1 }  #"

    __repr__ = __format__ = lambda self, *spec: "16, x = 1 }  #"


def test_toml_values_are_exact_and_escaped():
    """F4's writer: an int subclass is refused by its type's name; strings are escaped (TOML reads back
    exactly what was written)."""
    with pytest.raises(SplitformerError, match=r"^here: max_distance: a _Int cannot be written into a scheme file"):
        toml_value({"max_distance": _Int(128)}, "here")
    text = 'a "quoted" \\ line\nwith\x7f = 1 }'
    table = {"s": text, "n": 128, "x": 0.5, "b": True, "l": [1, "two"]}
    assert tomllib.loads("t = " + toml_value(table, "here"))["t"] == table | {"l": [1, "two"]}


def test_an_xtransformers_max_distance_subclass_is_refused_without_a_scheme_file():
    """F4: x-transformers computes with the object, the scheme file held its ``str()``: refused, naming it."""
    x_transformers = pytest.importorskip("x_transformers")
    from splitformer.adapters import from_xtransformers

    encoder = x_transformers.Encoder(dim=16, depth=1, heads=2, attn_dim_head=8, rel_pos_bias=True, attn_flash=False)
    from_xtransformers(encoder)  # control
    encoder.rel_pos.max_distance = _Int(128)
    with pytest.raises(SplitformerError, match=r"RelativePositionBias.max_distance of type _Int"):
        from_xtransformers(encoder)


def test_a_scheme_objects_numbers_are_exact_types():
    """A ``Scheme`` object edited after construction: a fraction whose class prints itself, an option of an
    int subclass; each refused naming the field (the constructors normalize, ``object.__setattr__`` does not)."""
    import dataclasses

    import splitformer

    scheme = splitformer.load_scheme("pre-ln")
    step = dataclasses.replace(scheme.body.steps[0])
    object.__setattr__(step, "fraction", _third())
    edited = dataclasses.replace(scheme, body=dataclasses.replace(scheme.body, steps=(step,) + scheme.body.steps[1:]))
    with pytest.raises(SplitformerError, match=r"steps\[0\].fraction: expected an exact rational .* got _Third"):
        splitformer.derive(edited)
    with pytest.raises(SplitformerError, match=r"options.ffn.bias: expected a number, string or boolean, got _Int"):
        splitformer.derive(dataclasses.replace(scheme, options={"ffn": {"bias": _Int(1)}}))
    splitformer.derive(dataclasses.replace(scheme, options={"ffn": {"bias": False}}))  # control


def test_a_sympy_function_no_printer_spells_and_an_undefined_value_are_named_for_what_they_are():
    """A researcher's ``Piecewise`` was "not a SymPy class the printers know … only SymPy's own classes", though it is
    SymPy's own; a window of −1 made the weight SymPy's ``nan``, "a node of class NaN". Each now says what it is."""
    from splitformer.symbolic.trusted_expressions import untrusted_node

    x = sp.Symbol("x")
    piecewise = untrusted_node(sp.Piecewise((x, x > 0), (0, True)))
    assert "no printer spells it" in piecewise and "Heaviside" in piecewise and "Max" in piecewise
    assert "the formula is undefined here" in untrusted_node(x + sp.nan)
    assert "the formula is undefined here" in untrusted_node(x * sp.zoo)
    assert untrusted_node(sp.exp(x) + sp.Heaviside(x, 0)) is None  # control
