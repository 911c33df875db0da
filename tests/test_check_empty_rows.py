"""``check`` of a kind whose weights are 0/0 on a row with an empty support (attention over strictly earlier keys: the
first query sees none). The emitted code takes such a product as 0 (a factor exactly 0 before the reciprocal), and
so must the exact evaluator of the derived program: SymPy's ``0 · zoo`` is NaN, which crashed the ReLU scheme's
semantics check (``Max(nan, 0)``) and, under GELU, compared NaN with NaN and called that agreement."""

import json
import subprocess
import sys

import pytest
import sympy as sp

from splitformer.codegen.verification.scheme_checks import _vanishes
from splitformer.symbolic.evaluate import _substitute

from conftest import post_ln_scheme

_PLUGIN = '''
from dataclasses import dataclass, replace
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, H, X, X_KEY
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import SUPPORT, Attention, apply, integral, register_operator


@register_operator
@dataclass(frozen=True)
class StrictlyEarlierAttention(Attention):
    """Softmax attention over the strictly earlier keys: ``χ H(p(x) − p(x̃), 0) e^a / ∫ χ H(p(x) − p(η), 0) e^a dη``."""

    kind: ClassVar[str] = "qa-strictly-earlier-attention"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def definitions(self):
        definitions = list(super().definitions())
        before = lambda key: sp.Heaviside(apply(POSITIONS.name, X) - apply(POSITIONS.name, key), 0)
        weight = apply(SUPPORT, X, X_KEY) * before(X_KEY) * sp.exp(apply("a", H, X, X_KEY))
        total = integral(apply(SUPPORT, X, ETA) * before(ETA) * sp.exp(apply("a", H, X, ETA)), ETA)
        at = [definition.function for definition in definitions].index("gamma")
        definitions[at] = replace(definitions[at], rhs=weight / total, meaning="softmax over strictly earlier keys")
        return tuple(definitions)
'''



def test_the_exact_evaluator_takes_a_product_with_a_zero_factor_as_zero():
    x, y = sp.IndexedBase("x"), sp.IndexedBase("y")
    entries = {x[0]: sp.Integer(0), y[0]: sp.Integer(0), x[1]: sp.Integer(3), y[1]: sp.Integer(2)}
    assert sp.Mul(sp.Integer(0), 1 / sp.Integer(0)) is sp.nan  # SymPy's own product, the control
    assert _substitute(x[0] * sp.exp(y[1]) / y[0], entries.__getitem__) == 0
    assert _substitute(x[1] * sp.exp(y[1]) / y[1], entries.__getitem__) == sp.Rational(3, 2) * sp.exp(2)
    assert _substitute(x[1] / y[0], entries.__getitem__) is sp.zoo  # no zero factor: the quotient as written


def test_nan_is_no_agreement():
    assert _vanishes(sp.nan) is None
    assert _vanishes(sp.nan * sp.Symbol("a")) is None
    assert _vanishes(sp.Symbol("a") - sp.Symbol("a")) == "structural"


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_semantics_of_a_row_without_keys_is_checked(tmp_path, activation):
    plugin, scheme = tmp_path / "strictly_earlier.py", tmp_path / "strict-post.toml"
    plugin.write_text(_PLUGIN)
    scheme.write_text(post_ln_scheme("strict-post", "qa-strictly-earlier-attention", activation))
    result = subprocess.run([sys.executable, "-m", "splitformer", "check", "--load", str(plugin), str(scheme),
                             "--only", "semantics", "--format", "json"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["id"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["semantics/strict-post/derived"]["holds"] and checks["semantics/strict-post/emitted"]["holds"]
