"""The Python API under hostile input: ``Scheme`` objects, ``derive``, ``write``, tableaux.

A scheme built in Python goes through the same checks as a scheme file (``Scheme.check``);
text that reaches emitted code is escaped by construction; output never leaves the folder it
was given; every wrong argument is one ``SplitformerError`` (or ``TypeError``) line naming it.
"""

import ast
import os
import re
from dataclasses import replace

import pytest
import sympy as sp

import splitformer
from splitformer import SplitformerError
from splitformer.codegen.api import Derivation
from splitformer.codegen.cli import main
from splitformer.codegen.output import write_files
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from splitformer.symbolic.scheme_file import load_scheme
from splitformer.symbolic.tableaux import HEUN, Tableau, register_tableau

HOSTILE = 'x"""\nraise SystemExit("injected")\n"""'
FFN = {"ffn": "feed-forward"}
ONE_STEP = Sequence((Substep("ffn", "explicit"),))


@pytest.fixture(scope="module")
def post_ln():
    return splitformer.derive("post-ln")


def _scheme(**fields) -> Scheme:
    values = {"name": "tiny", "summary": "one feed-forward", "operators": FFN, "body": ONE_STEP, **fields}
    return Scheme(**values)


@pytest.mark.parametrize("summary, message", [
    (HOSTILE, "summary: must be one printable line"),
    ("a\\b", "without backslashes"),
    ("tab\there", "one printable line"),
    ("x" * 201, "at most 200 characters"),
    (5, "summary: expected str, got int"),
])
def test_a_scheme_objects_summary_is_checked_like_a_files(summary, message):
    with pytest.raises(SplitformerError, match=message):
        splitformer.derive(_scheme(summary=summary))


def test_text_reaches_the_emitted_code_escaped_never_as_code(post_ln):
    """Even text that no check stopped stays text: the docstring and SCHEME hold it, nothing runs."""
    from splitformer.codegen.render import render_module

    hostile = replace(post_ln.scheme, summary=HOSTILE, name='p"; raise SystemExit("injected"); "')
    numpy_source, torch_source = (render_module(hostile, *post_ln.lowered, backend, *post_ln.backward)
                                  for backend in ("numpy", "torch"))
    assert ast.get_docstring(ast.parse(numpy_source), clean=False).startswith(f"{hostile.name}: {HOSTILE}.")
    scheme_literal = next(node.value for node in ast.parse(torch_source).body
                          if isinstance(node, ast.Assign) and node.targets[0].id == "SCHEME")
    assert ast.literal_eval(scheme_literal) == hostile.name
    namespace = {}
    exec(compile(numpy_source, "<hostile>", "exec"), namespace)  # imported: no SystemExit
    assert namespace["__doc__"].startswith(hostile.name)


def test_a_derivation_made_by_hand_is_checked_too(post_ln):
    with pytest.raises(SplitformerError, match="summary: must be one printable line"):
        Derivation(replace(post_ln.scheme, summary=HOSTILE), post_ln.program)
    with pytest.raises(SplitformerError, match="is not derived from the scheme"):
        Derivation(load_scheme("pre-ln"), post_ln.program)
    with pytest.raises(SplitformerError, match="program: expected a Program, got str"):
        Derivation(post_ln.scheme, "post_ln")


def test_a_derivation_cannot_be_edited_after_it_is_checked(post_ln):
    """Attack 20: ``d.program = <pre-ln's program renamed post_ln>`` after ``derive`` gave a module named, labelled and
    digested as post-ln that computed pre-ln (3.05 off), which ``build`` accepted. Refused; control: a replaced copy is
    checked as a new one (refused when it differs, made when it does not)."""
    pre_ln = splitformer.derive("pre-ln").program
    derivation = splitformer.derive("post-ln")
    for name, value in (("program", replace(pre_ln, name="post_ln")), ("scheme", load_scheme("pre-ln")),
                        ("passes", ())):
        with pytest.raises(SplitformerError, match=f"Derivation.{name} cannot be changed once made"):
            setattr(derivation, name, value)
    assert derivation.program == post_ln.program
    with pytest.raises(SplitformerError, match="the program differs from what the scheme 'post-ln' derives"):
        replace(derivation, program=replace(pre_ln, name="post_ln"))
    assert replace(derivation, passes=()).passes == ()
    network = splitformer.derive("vit")
    with pytest.raises(SplitformerError, match="NetworkDerivation.spec cannot be changed once made"):
        network.spec = network.spec


@pytest.mark.parametrize("edit", ["operators", "options", "program name"])
def test_a_derivation_edited_in_place_emits_nothing(edit, tmp_path):
    """Attack 21: ``d.scheme.operators["norm2"] = "rms-norm"`` after ``derive`` gave a hybrid module whose COMPUTES
    digest was rms-norm's while its steps computed LayerNorm (0.955 off); ``d.program.name = '<text>'`` reached the
    module's docstring and ran. Every output is refused after an edit in place; control: the unedited derivation
    emits, and the check does not fire on what derive itself caches."""
    derivation = splitformer.derive("pre-ln")
    assert "def forward" in derivation.source("numpy") and derivation.report  # control
    assert derivation.order.order == 1 and derivation.equation.latex  # control: read before the edit, then cached
    if edit == "operators":
        derivation.scheme.operators["norm2"] = "rms-norm"
    elif edit == "options":
        derivation.scheme.options["ffn"] = {"bias": False}
    else:
        derivation.program.name = 'x"""\nimport os\n"""'
    # attack 24: the views (the equation, the orders, the notebook's) showed the edited scheme
    for emit in (lambda: derivation.source("numpy"), lambda: derivation.source("torch"),
                 lambda: derivation.write(tmp_path / "out"), lambda: derivation.check(), lambda: derivation.equation,
                 lambda: derivation.order, derivation._repr_markdown_):
        with pytest.raises(SplitformerError, match="Derivation of .* was edited in place after it was checked"):
            emit()
    assert not (tmp_path / "out").exists()


def test_a_number_subclass_is_not_written_as_the_text_it_prints():
    """Attack 20: ``splitformer.scheme`` wrote a Fraction subclass by its own ``__str__`` (``1/3`` for a 1/2).
    Refused; control: Fraction and SymPy's rationals are written exactly."""
    from fractions import Fraction

    class Lying(Fraction):
        def __str__(self):
            return "1/3"

    steps = lambda fraction: [{"operator": "attn", "solver": "explicit", "fraction": fraction},
                              {"operator": "attn", "solver": "explicit", "fraction": fraction}]
    operators = {"attn": "attention"}
    with pytest.raises(SplitformerError, match="a number of type Lying"):
        splitformer.scheme("lying", "s", operators, steps(Lying(1, 2)))
    for half in (Fraction(1, 2), sp.Rational(1, 2), sp.S.Half):
        assert 'fraction = "1/2"' in splitformer.scheme("half", "s", operators, steps(half)).source


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "..", "Post-LN", "x" * 65, "class", 7])
def test_a_scheme_object_with_a_path_for_a_name_is_refused(name, tmp_path):
    with pytest.raises(SplitformerError, match="scheme name|Python keyword"):
        splitformer.derive(_scheme(name=name)).write(tmp_path / "a" / "b" / "out")
    assert list(tmp_path.iterdir()) == []


def test_write_never_leaves_its_folder_through_dot_dot(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SplitformerError, match="outside the output folder"):
        write_files({out / "numpy" / "m.py": "x", out / ".." / "escaped.py": "y"}, root=out)
    assert list(tmp_path.iterdir()) == []


def test_write_never_follows_a_symbolic_link_out_of_its_folder(post_ln, tmp_path):
    outside, out = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    out.mkdir()
    (out / "numpy").symlink_to(outside)
    with pytest.raises(SplitformerError, match="outside the output folder"):
        post_ln.write(out)
    assert list(outside.iterdir()) == [] and sorted(path.name for path in out.iterdir()) == ["numpy"]


def test_write_follows_a_link_that_stays_inside(post_ln, tmp_path):
    """Control for the test above: a symbolic link is not refused as such, only where it leads."""
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "numpy").symlink_to(out / "real")
    post_ln.write(out, backend="numpy")
    assert (out / "real" / f"{post_ln.name}.py").is_file()


def test_write_to_an_over_long_folder_name_is_one_line(post_ln, tmp_path):
    for out in (tmp_path / ("a" * 300), tmp_path / ("a" * 300) / "b"):
        with pytest.raises(SplitformerError, match="File name too long|longer than 255 bytes") as error:
            post_ln.write(out)
        assert "\n" not in str(error.value) and len(str(error.value)) < 300
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arguments", [["derive", "post-ln", "--out", "a" * 300],
                                       ["derive", "post-ln", "--load", "a" * 300 + ".py"],
                                       ["derive", "a" * 300 + ".toml"]])
def test_over_long_paths_on_the_command_line_are_one_line(arguments, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and "Traceback" not in error


@pytest.mark.parametrize("call, message", [
    (lambda d, out: splitformer.derive(123), "expected a Scheme, a built-in name or a scheme file, got int"),
    (lambda d, out: splitformer.derive("post-ln", activation=5), "activation: expected a name"),
    (lambda d, out: splitformer.derive("post-ln", passes=5), "passes: expected"),
    (lambda d, out: splitformer.derive("post-ln", passes=(1,)), "passes: a tuple of passes"),
    (lambda d, out: d.write(5), "out: expected a folder path"),
    (lambda d, out: d.write(b"out"), "out: expected a folder path"),
    (lambda d, out: d.write(out, backend=5), "unknown backend"),
    (lambda d, out: d.write(out, force="yes"), "force: expected bool"),
    (lambda d, out: d.source(["numpy"]), "unknown backend"),
    (lambda d, out: d.check(plots=3), "plots: expected a folder path"),
    (lambda d, out: splitformer.load_plugin(5), "load_plugin: expected the path of a .py file"),
    (lambda d, out: splitformer.parse_scheme(b"name = 'x'"), "expected the text of a scheme file"),
    (lambda d, out: splitformer.load_scheme(5), "expected a scheme name or a path"),
])
def test_api_calls_with_wrong_types_name_the_argument(call, message, post_ln, tmp_path):
    with pytest.raises(SplitformerError, match=message):
        call(post_ln, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _tampered(fraction) -> Substep:
    """A substep whose fraction was set past its constructor (which makes every number exact)."""
    step = Substep("ffn", "explicit")
    object.__setattr__(step, "fraction", fraction)
    return step


@pytest.mark.parametrize("fields, message", [
    ({"operators": [("ffn", "feed-forward")]}, "operators: expected dict, got list"),
    ({"operators": {"ffn": 3}}, r"operators.ffn: expected a kind name"),
    ({"operators": {"Bad Name": "feed-forward"}}, "is not an operator name"),
    ({"options": {"ffn": {"bias": [1]}}}, "options.ffn.bias: expected a number"),
    ({"options": {"ffn": {"bias": float("nan")}}}, "is not a finite number"),
    ({"options": {"nobody": {}}}, "'nobody' is not a declared operator"),
    ({"body": [Substep("ffn", "explicit")]}, "expected a Sequence"),
    ({"body": Sequence([Substep("ffn", "explicit")])}, "expected a Sequence of a tuple"),
    ({"body": Sequence((_tampered(0.5),))}, "fraction: expected an exact rational"),
    ({"body": Sequence((Substep("ffn", "explicit", 0),))}, "fraction: must not be 0"),
    ({"body": Sequence((Substep(3, "explicit"),))}, "operator: expected str"),
    ({"body": Sequence((Parallel((ONE_STEP,), (sp.Rational(1, 2),)),))}, "weights must sum to 1"),
    ({"body": Sequence((Parallel((ONE_STEP,), (sp.Integer(1), sp.Integer(0))),))}, "2 weights for 1 branches"),
    ({"body": Sequence((RungeKutta((Substep("ffn", "explicit"),), "rk4"),))}, "tableau: expected a Tableau"),
    ({"body": Sequence((RungeKutta((), HEUN),))}, "fields: a Runge–Kutta step needs a non-empty tuple"),
    ({"body": Sequence((RungeKutta([Substep("ffn", "explicit")], HEUN),))}, "fields: a Runge–Kutta step needs a non-empty"),
    ({"body": Sequence(("ffn",))}, "expected a Substep, Parallel or RungeKutta, got str"),
    ({"activation": "swish"}, "activation: unknown activation 'swish'"),
    ({"activation": None}, "activation: unknown activation None"),
    ({"claims": {"order": True}}, "claims: order must be a positive integer"),
    ({"claims": {"speed": 2}}, "unknown claim 'speed'"),
    ({"causal": "yes"}, "causal: expected bool"),
    ({"description": None}, "description: expected str"),
])
def test_every_field_of_a_scheme_object_is_checked(fields, message):
    with pytest.raises(SplitformerError, match=message):
        splitformer.derive(_scheme(**fields))


def test_parallel_steps_nest_boundedly_in_objects_too():
    body = ONE_STEP
    for _ in range(40):
        body = Sequence((Parallel((body,), (sp.Integer(1),)),))
    with pytest.raises(SplitformerError, match="nest deeper than 32"):
        _scheme(body=body).check()


@pytest.mark.parametrize("a, b, message", [
    (((sp.Integer(1),),), (sp.Integer(1),), "on or above the diagonal"),  # backward Euler: implicit
    (((sp.Integer(0), sp.Rational(1, 2)), (sp.Integer(1), sp.Integer(0))), (sp.Rational(1, 2),) * 2,
     "on or above the diagonal"),
    (((sp.Integer(0),),), (sp.Rational(1, 2),), "sum to 1/2"),
    (((0,),), (1,), "exact rationals"),
    ((), (), "non-empty"),
])
def test_a_tableau_is_explicit_and_consistent_however_it_is_built(a, b, message):
    with pytest.raises(SplitformerError, match=message):
        register_tableau(Tableau("hand-made", a, b))


def test_a_utf8_byte_order_mark_is_accepted(tmp_path, capsys):
    path = tmp_path / "bom.toml"
    text = splitformer.load_scheme("post-ln").source.replace('name = "post-ln"', 'name = "bom"')
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_scheme(str(path)).name == "bom"
    assert splitformer.parse_scheme("\ufeff" + text).name == "bom"


@pytest.mark.parametrize("order", ["file-first", "model-first"])
def test_a_scheme_file_and_a_model_with_one_module_name_are_refused_in_either_order(order, tmp_path, capsys):
    path = tmp_path / "vit.toml"
    path.write_text(splitformer.load_scheme("post-ln").source.replace('name = "post-ln"', 'name = "vit"'))
    names = [str(path), "vit"] if order == "file-first" else ["vit", str(path)]
    assert main(["derive", *names, "--out", str(tmp_path / "out")]) == 2
    assert "would both be written as vit.py" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_same_model_twice_is_one(tmp_path, capsys, monkeypatch):
    """Control for the test above: a model named twice is not a clash (nothing derived here)."""
    from splitformer.codegen import cli

    seen = []
    monkeypatch.setattr("splitformer.codegen.parallel.ordered_map", lambda function, items: seen.extend(items) or [])
    assert cli.main(["derive", "vit", "vit", "--out", str(tmp_path / "out")]) == 0
    assert [name for name, _, _ in seen] == ["vit"]


def test_no_file_outside_out_after_a_write(post_ln, tmp_path):
    out = tmp_path / "out"
    written = post_ln.write(out)
    real = os.path.realpath(out)
    assert all(os.path.realpath(path).startswith(real + os.sep) for path in written)


def test_a_network_derivation_edited_in_place_emits_nothing(tmp_path):
    """Attack 22: a unet-level's operator table edited in place after ``derive`` (a stride given as text) was written
    as code and ran; a vit's step scheme edited in place was written under vit's name computing a gated feed-forward.
    Refused at every output; control: the unedited derivation emits."""
    from dataclasses import replace as replaced

    network = splitformer.derive("unet-level")
    fresh = splitformer.derive("vit")
    assert "def forward" in fresh.source("numpy")  # control
    network.spec.operators["down"] = replaced(network.spec.operators["down"], padding=7)
    fresh.spec.scheme.operators["ffn"] = "gated-feed-forward"
    for derivation in (network, fresh):
        for emit in (lambda: derivation.write(tmp_path / "out"), lambda: derivation.check()):
            with pytest.raises(SplitformerError, match="NetworkDerivation of .* was edited in place"):
                emit()
    with pytest.raises(SplitformerError, match="was edited in place"):
        network.source("numpy")
    assert not (tmp_path / "out").exists()


def test_a_hand_made_derivation_checks_its_passes(post_ln):
    """Attack 22: ``Derivation(..., passes=("layer-norm",))`` was accepted and failed later with a raw TypeError.
    One line naming it; control: the passes ``derive`` selects by name."""
    chosen = splitformer.derive("post-ln", passes="layer-norm,matmul").passes
    with pytest.raises(SplitformerError, match="Derivation: passes must be None or a tuple"):
        Derivation(post_ln.scheme, post_ln.program, passes=("layer-norm",))
    assert Derivation(post_ln.scheme, post_ln.program, passes=chosen).passes == chosen


@pytest.mark.parametrize("fraction, message", [
    (10**30, "steps.fraction: an int of 100 bits is out of range (a scheme file holds 64-bit integers)"),
    (10**5000, "steps.fraction: an int of 16610 bits is out of range (a scheme file holds 64-bit integers)"),
    (2**62, "steps[0].fraction: 4611686018427387904 is out of range"),
    (sp.Integer(10)**5000, "a number of 16610 bits is out of range (a scheme file holds 64-bit integers)"),
    (sp.Rational(1, 10**5000), "a number of 16610 bits is out of range (a scheme file holds 64-bit integers)"),
], ids=["30-digits", "5001-digits", "2**62", "sympy-5001-digits", "sympy-fraction-5001-digits"])
def test_a_long_int_is_out_of_range_not_a_misspelt_number(fraction, message):
    """Attack 24: ``fraction=10**30`` was "not a number"; 10**5000 raised Python's own ValueError on printing it."""
    with pytest.raises(SplitformerError, match=re.escape(message)):
        splitformer.scheme("x", "y", operators={"attn": "attention"}, steps=[splitformer.substep("attn", fraction=fraction)])


def test_arguments_of_the_wrong_kind_are_named():
    """Attack 24: Python's own messages ("'int' object is not iterable", "expected str, bytes or os.PathLike object"),
    and a NumPy module handed to ``build`` gave an AttributeError."""
    with pytest.raises(SplitformerError, match="runge_kutta: method must be a tableau name or a mapping"):
        splitformer.runge_kutta(3, "attn")
    with pytest.raises(SplitformerError, match="plot: path must be a file path"):
        splitformer.compare(["post-ln"]).plot(3)
    import transformers

    bert = transformers.BertModel(transformers.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=40,
                                                          num_hidden_layers=2)).eval()
    adapted = splitformer.adapters.from_hf(bert)
    derivation = splitformer.derive(adapted.scheme, adapted.activation)
    with pytest.raises(SplitformerError, match="build takes the generated torch module .* which defines no Stack"):
        adapted.build(derivation.numpy_module())
    assert adapted.build(derivation.torch_module()).layers  # control

def test_python_schemes_nested_without_end_or_holding_huge_numbers_are_one_error_naming_the_place():
    """Attacker s39 L2, L6: parallel steps nested 200 deep, or a list or dict holding itself, raised a bare
    RecursionError; a Fraction past 64 bits named neither the scheme nor the field. Control: 33 levels, the scheme's
    own refusal."""
    from fractions import Fraction

    from splitformer import substep

    operators = {"attn": "attention", "norm": "layer-norm", "ffn": "feed-forward"}

    def nested(depth):
        step = substep("attn", on="norm")
        for _ in range(depth):
            step = {"parallel": [[step], [substep("ffn", on="norm")]], "weights": ["1/2", "1/2"]}
        return step

    looped_list, looped_dict = [], {}
    looped_list.append(looped_list)
    looped_dict["x"] = looped_dict
    for steps, message in (([nested(33)], "parallel steps nest deeper than 32 levels"),
                           ([nested(200)], r"^Python scheme 'a': steps\[0\]\.parallel.{30,60}…: nested deeper than"),
                           ([looped_list], r"^Python scheme 'a': steps\[0\]\[0\]\[0\].*nested deeper than"),
                           ([looped_dict], r"^Python scheme 'a': steps\[0\]\.x\.x.*a list or dict that holds itself"),
                           ([substep("attn", on="norm", fraction=Fraction(10**20, 3)), substep("ffn", on="norm")],
                            r"^Python scheme 'a': steps\[0\]\.fraction: a number of 67 bits is out of range")):
        with pytest.raises(SplitformerError, match=message):
            splitformer.scheme("a", "s", operators=operators, steps=steps)
    from splitformer.symbolic.builder import to_toml  # the helper alone too (reviewer s39: a RecursionError)

    with pytest.raises(SplitformerError, match=r"^to_toml: steps\[0\]\[0\].*a list or dict that holds itself"):
        to_toml({"name": "a", "steps": [looped_list]})


@pytest.mark.parametrize("character", ["\x1b", "\x07", "\x9b", "\u202e"])
def test_a_description_holding_control_characters_is_refused(character):
    """Attacker s39 L3: ESC and BEL in a description reached reports and `show --format markdown` raw (a terminal obeys
    them), where a summary refuses them. New lines and tabs are a description's own; the control reads them."""
    from splitformer import substep

    operators = {"attn": "attention", "norm": "layer-norm", "ffn": "feed-forward"}
    steps = [substep("attn", on="norm"), substep("ffn", on="norm")]
    for text in ("a\n\tb", "a\u00a0b\u2009c\u00add", "a\r\nb"):  # no-break and thin spaces, a soft hyphen: text
        assert splitformer.scheme("a", "s", operators=operators, steps=steps, description=text).description == text
    with pytest.raises(SplitformerError, match=r"^Python scheme 'a': scheme 'a': description: holds the control"):
        splitformer.scheme("a", "s", operators=operators, steps=steps, description=f"x {character}[2J y")
