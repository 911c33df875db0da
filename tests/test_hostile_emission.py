"""What reaches emitted code from a plug-in or a hand-made ``Derivation`` is data: checked, escaped,
never code (attack2 findings 04 and 06)."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
import sympy as sp

import splitformer
from splitformer import SplitformerError
from splitformer.codegen.api import Derivation
from splitformer.codegen.render import render_module
from splitformer.symbolic.inputs import Constant
from splitformer.symbolic.operator_checks import check_declared

INJECTED = 'tau"""; raise SystemExit("injected"); """x'
TEMPLATES = Path(splitformer.__file__).resolve().parent.parent / "templates"


@pytest.mark.parametrize("constant, message", [
    (Constant(sp.Symbol("tau"), 1.0, INJECTED), "constant 'tau' meaning: must be one printable line"),
    (Constant(sp.Symbol("tau"), 1.0, "a\nb"), "must be one printable line"),
    (Constant(sp.Symbol("tau=1, **{}), print(1)#"), 1.0, "m"), "constant 'tau=1"),
    (Constant(sp.Symbol("lambda"), 1.0, "m"), "is not an identifier"),
    (Constant(sp.Symbol("tau"), "1); import os; (1", "m"), "the default must be a finite number > 0"),
    (Constant(sp.Symbol("tau"), True, "m"), "the default must be a finite number > 0"),
    (Constant(sp.Symbol("tau"), float("nan"), "m"), "the default must be a finite number > 0"),
    (Constant(sp.Symbol("tau"), -1.0, "m"), "the default must be a finite number > 0"),
    (Constant(sp.Symbol("tau"), 10**400, "m"), "the default must be a finite number > 0"),  # attack 23: OverflowError
    (Constant(sp.Symbol("tau"), 1.0, "m", 0.0), "checked_at must be a finite number > 0, got '0.0'"),
    (Constant(sp.Symbol("tau"), 1.0, "m", "2"), "checked_at must be a finite number > 0, got '2'"),
    (Constant("tau", 1.0, "m"), "a constant's symbol must be a SymPy Symbol, got str"),
    ("tau", "constants must be a tuple of Constant, got str"),
])
def test_a_kinds_constants_are_checked_naming_the_kind(constant, message):
    with pytest.raises(SplitformerError, match=re.escape(message)) as caught:
        check_declared((constant,), (), "operator 'f' (qa-tau)")
    assert str(caught.value).startswith("operator 'f' (qa-tau): ") and "\n" not in str(caught.value)


def test_sound_constants_pass():
    """Control: RoPE's own constant and a plain one are accepted."""
    from splitformer.symbolic.rotary_attention import RotaryAttention

    check_declared(RotaryAttention.constants + (Constant(sp.Symbol("tau"), 2, "a temperature"),),
                   RotaryAttention.input_fields, "operator 'attn' (rotary-attention)")


_TAU = '''
from dataclasses import dataclass, replace
from typing import ClassVar
import sympy as sp
from splitformer.symbolic.inputs import Constant
from splitformer.symbolic.operators import Attention, register_operator

@register_operator
@dataclass(frozen=True)
class TauAttention(Attention):
    kind: ClassVar[str] = "qa-tau-attention"
    constants: ClassVar[tuple] = (Constant(sp.Symbol("tau", positive=True), 1.0, {meaning!r}),)

    def definitions(self):  # the scores divided by the temperature
        tau = self.constants[0].symbol
        return tuple(replace(d, rhs=d.rhs / tau) if d.function == "a" else d for d in super().definitions())
'''


@pytest.mark.parametrize("meaning, status", [(INJECTED, 2), ("a temperature", 0)])
def test_a_plugin_constant_with_code_in_its_meaning_is_refused_at_derive(meaning, status, tmp_path, capsys,
                                                                        monkeypatch):
    """The attacker's reproducer (04) through the CLI; the same plug-in with a plain meaning derives."""
    from splitformer.codegen.cli import main
    from splitformer.symbolic.kinds import OPERATOR_KINDS

    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    monkeypatch.setattr("splitformer.symbolic.kinds.OPERATOR_KINDS", OPERATOR_KINDS)
    plugin, scheme = tmp_path / "tau_attention.py", tmp_path / "tau.toml"
    plugin.write_text(_TAU.format(meaning=meaning))
    scheme.write_text('name = "tau"\nsummary = "s"\n[operators]\nattn = "qa-tau-attention"\nnorm1 = "layer-norm"\n'
                      '[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
                      '[[steps]]\noperator = "norm1"\nsolver = "projection"\n')
    try:
        assert main(["derive", "--load", str(plugin), str(scheme), "--backend", "numpy", "--out",
                     str(tmp_path / "out")]) == status
    finally:
        OPERATOR_KINDS.pop("qa-tau-attention", None)
    error = capsys.readouterr().err
    if status:
        assert error.count("\n") == 1 and "qa-tau-attention" in error and "meaning" in error, error
        assert not (tmp_path / "out").exists()
    else:
        assert '"""a temperature: a finite number > 0."""' in (tmp_path / "out" / "numpy" / "tau.py").read_text()


def test_a_constant_no_check_stopped_is_emitted_as_text(monkeypatch):
    """Escaping by construction: a meaning with triple quotes stays inside the docstring of both backends."""
    derivation = splitformer.derive("llama")
    block, final_norm = derivation.lowered
    hostile = (Constant(block.constants[0].symbol, 10000.0, INJECTED),)
    for backend in ("numpy", "torch"):
        source = render_module(derivation.scheme, replace(block, constants=hostile), final_norm, backend,
                               *derivation.backward)
        namespace = {}
        exec(compile(source, "<hostile>", "exec"), namespace)  # no SystemExit
        assert namespace["_rope_theta"].__doc__.startswith('tau"""; raise SystemExit')


_TEXT_FIELDS = re.compile(r"\b(meaning|summary|latex|title|description|notes?|label|comment|rule|default|method|start_note)\b")
_FILTERS = re.compile(r"\|\s*(pystr|doc|comment|text|pytuple|pyfloat)\b")


def _unfiltered(folder: Path) -> list[str]:
    """``file:line: {{ … }}`` for each expression of the templates under ``folder`` that prints a text field
    (a meaning, summary, latex, title, note, label, comment, rule, a default) through no escaping filter."""
    raw = []
    for template in sorted(folder.rglob("*.py.j2")):
        for number, line in enumerate(template.read_text().splitlines(), 1):
            for expression in re.findall(r"{{(.*?)}}", line):
                if _TEXT_FIELDS.search(expression) and not _FILTERS.search(expression):
                    raw.append(f"{template.relative_to(folder)}:{number}: {{{{{expression}}}}}")
    return raw


def test_no_template_renders_a_text_field_unfiltered():
    """Text from a scheme, a plug-in or a model reaches code only through ``pystr``, ``doc``, ``comment``,
    ``text`` (numbers through ``pyfloat``): a template that printed one raw would let it end a string."""
    assert not _unfiltered(TEMPLATES), "\n".join(_unfiltered(TEMPLATES))


def test_the_template_scan_sees_an_unfiltered_meaning(tmp_path):
    """Negative control of the scan: the NumPy template line as it was before the fix is caught."""
    (tmp_path / "old.py.j2").write_text('def _{{ name }}({{ name }}):\n    """{{ constant.meaning }}: > 0."""\n')
    assert _unfiltered(tmp_path) == ["old.py.j2:2: {{ constant.meaning }}"]


def test_the_template_scan_sees_an_unfiltered_across_method(tmp_path):
    """Negative control: the across-layers comment as it was before attack5 01 is caught."""
    (tmp_path / "old.py.j2").write_text("# {{ across.method }} across layers\n")
    assert _unfiltered(tmp_path) == ["old.py.j2:1: {{ across.method }}"]


EVIL_PARAMETER = "attn.W_q if getattr(__import__(chr(111)), chr(115)) else u"


@pytest.fixture(scope="module")
def post_ln():
    return splitformer.derive("post-ln")


def _with_parameter(program, parameter: str):
    tensors = dict(program.tensors)
    tensors["attn_W_q"] = replace(tensors["attn_W_q"], parameter=parameter)
    return replace(program, tensors=tensors)


@pytest.mark.parametrize("change", [
    lambda program: _with_parameter(program, EVIL_PARAMETER),
    lambda program: replace(program, output="u0"),
    lambda program: replace(program, records=program.records[:1]),
])
def test_a_hand_made_derivation_whose_program_differs_from_its_schemes_is_refused(change, post_ln):
    """Finding 06: the program's tensors, expressions and names all become code; only the program the
    scheme derives is accepted."""
    with pytest.raises(SplitformerError, match="the program differs from what the scheme 'post-ln' derives"):
        Derivation(post_ln.scheme, change(post_ln.program))


def test_a_hand_made_derivation_of_the_schemes_own_program_is_accepted(post_ln):
    """Control: the same program, made again by hand (a copy, not the object derive returned)."""
    derivation = Derivation(post_ln.scheme, replace(post_ln.program, tensors=dict(post_ln.program.tensors)))
    assert derivation.source("torch") == post_ln.source("torch")


@pytest.mark.parametrize("parameter, message", [
    (EVIL_PARAMETER, "parameter attribute 'W_q if getattr("),
    ("attn.W.q", "parameter name 'attn.W.q' is not 'group.attribute'"),
    ("attn.W_q if 1 else u", "parameter attribute 'W_q if 1 else u' is not an identifier"),
    ("attn.class", "parameter attribute 'class' is not an identifier"),
    ("x-y.W", "parameter group 'x-y' is not an identifier"),
])
def test_a_parameter_name_that_is_not_two_identifiers_never_reaches_code(parameter, message, post_ln):
    """Defence in depth: rendering refuses it even when no Derivation check ran (a lowered module made by hand)."""
    block, final_norm = post_ln.lowered
    tensors = dict(block.tensors)
    tensors["attn_W_q"] = replace(tensors["attn_W_q"], parameter=parameter)
    for backend in ("numpy", "torch"):
        with pytest.raises(SplitformerError, match=re.escape(message)):
            render_module(post_ln.scheme, replace(block, tensors=tensors), final_norm, backend, *post_ln.backward)
