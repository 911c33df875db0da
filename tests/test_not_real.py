"""A plug-in field with no real value at some states (``log u``, ``√u`` of a negative entry): ``check`` said the
semantics and adjoint checks crashed ("float() argument must be … not 'mpc'", "cannot create mpf from mpc"), and blamed
the emitted forward's NaN on the masks' query without keys. Now the exact evaluators refuse a complex value by name,
the checks fail saying the formulas have no real value there, and the NaN is placed where it is (a tester)."""

import json
import subprocess
import sys

import pytest

_PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, register_operator


@register_operator
@dataclass(frozen=True)
class Field(Operator):
    kind: ClassVar[str] = "qa-not-real"
    symbol: ClassVar[str] = r"\\mathcal{{L}}"

    def parameters(self):
        return ()

    def definitions(self):
        return (Definition("out", self.symbol, (X, Y), {formula}, "a field of the state"),)
'''
_SCHEME = ('name = "not-real"\nsummary = "s"\n[operators]\nattn = "attention"\nf = "qa-not-real"\n'
           '[[steps]]\noperator = "attn"\nsolver = "explicit"\n[[steps]]\noperator = "f"\nsolver = "explicit"\n')


@pytest.mark.parametrize("formula, named", [("sp.log(apply(STATE, X, Y))", "log("),
                                            ("apply(STATE, X, Y) ** sp.Rational(1, 2)", "sqrt("),
                                            ("sp.log(1 + apply(STATE, X, Y) ** 2)", None)],  # the control: real
                         ids=["log", "root", "control-real"])
def test_a_field_with_no_real_value_fails_its_checks_saying_so(tmp_path, formula, named):
    (tmp_path / "field.py").write_text(_PLUGIN.format(formula=formula))
    (tmp_path / "s.toml").write_text(_SCHEME)
    result = subprocess.run([sys.executable, "-m", "splitformer", "check", "--load", str(tmp_path / "field.py"),
                             str(tmp_path / "s.toml"), "--only", "semantics,adjoint,adjoint-test", "--format", "json"],
                            capture_output=True, text=True, timeout=900)
    checks = {check["id"]: check for check in json.loads(result.stdout)["checks"]}
    if named is None:
        assert result.returncode == 0 and all(check["holds"] for check in checks.values()), result.stdout
        return
    assert result.returncode == 1, result.stdout + result.stderr
    for name in ("semantics/not-real", "adjoint/not-real"):
        check = checks[name]
        assert (check["method"], check["holds"]) == ("numeric", False), check
        assert "the scheme's formulas have no real value at the check's state: " + named in check["detail"], check
    for name in ("adjoint-test/not-real/dot", "adjoint-test/not-real/taylor"):
        assert "at queries the masks leave keys as well" in checks[name]["detail"], checks[name]
