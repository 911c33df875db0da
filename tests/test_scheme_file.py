"""Scheme files: the built-ins round-trip, every malformed file ends in one clear error."""

import tomllib
from fractions import Fraction

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitformer.symbolic import SplitformerError, builtin_names, load_scheme, parse_scheme
from splitformer.symbolic.scheme_file import is_builtin
from splitformer.symbolic.exact_numbers import MAX_TERM, exact_number
from splitformer.symbolic.scheme import Heun, Parallel

from conftest import ROOT

VALID = load_scheme("post-ln").source


def test_builtins_are_scheme_files_that_show_themselves():
    for name in builtin_names():
        scheme = load_scheme(name)
        assert parse_scheme(scheme.source).name == name
        assert tomllib.loads(scheme.source)["name"] == name


def test_a_scheme_is_built_in_only_under_a_built_in_name_with_its_operators_and_steps():
    assert all(is_builtin(load_scheme(name)) for name in builtin_names())
    thirds = load_scheme(ROOT / "tests" / "schemes" / "thirds.toml")
    assert not is_builtin(thirds)  # a user file, named as no built-in
    assert not is_builtin(parse_scheme(thirds.source.replace('name = "thirds"', 'name = "pre-ln"')))  # other steps


def test_structure_of_parallel_and_rk2_builtins():
    assert isinstance(load_scheme("parallel").body.steps[0], Parallel)
    assert isinstance(load_scheme("rk2").body.steps[0], Heun)


def _replace(old, new):
    assert old in VALID
    return VALID.replace(old, new, 1)


@pytest.mark.parametrize("text, message", [
    (_replace('attn = "attention"', 'attn = "convolution"'), "operators.attn: 'convolution' is a network's operator, and this "
                                                             "file has no [step] applying it"),
    (_replace('attn = "attention"', 'attn = "convolutoin"'), "operators.attn: unknown operator 'convolutoin'"),
    (_replace('operator = "attn"', 'operator = "atn"'), "steps[0].operator: unknown operator 'atn'"),
    (_replace('name = "post-ln"\n', ""), "missing field 'name'"),
    (_replace('solver = "explicit"', "solver = 3"), "steps[0].solver: expected str, got int"),
    (_replace('solver = "explicit"', 'solver = "implicit"'), "unknown solver 'implicit'"),
    (_replace("fraction = 2", "fraction = 0"), "steps[2].parallel[0][0].fraction: must not be 0"),
    (_replace("fraction = 2", 'fraction = "-0/3"'), "must not be 0"),
    # new user, s32: "expected float", though fractions are written "1/2"
    (_replace("fraction = 2", "fraction = true"),
     "steps[2].parallel[0][0].fraction: expected a number or a fraction string, got bool"),
    (_replace('weights = ["1/2", "1/2"]', 'weights = ["1/2", "1/3"]'), "weights must sum to 1, they sum to 5/6"),
    (_replace('weights = ["1/2", "1/2"]', 'weights = [1]'), "1 weights for 2 branches"),
    (_replace('weights = ["1/2", "1/2"]', 'weights = ["half", "1/2"]'), "steps[2].weights[0]: not a number"),
    (_replace('operator = "norm1"\nsolver = "projection"', 'operator = "norm1"\nsolver = "explicit"'),
     "'norm1' is a projection and cannot be used as a vector field"),
    (_replace('operator = "attn"\nsolver = "explicit"', 'operator = "attn"\nsolver = "projection"'),
     "'attn' is a vector field, not a projection"),
    ('name = "x"\nsummary = "s"\nsteps = []\n[operators]\nattn = "attention"\n', "steps: empty composition"),
    ('name = "x"\nsummary = "s"\nsteps = [{parallel = []}]\n[operators]\nattn = "attention"\n',
     "steps[0].parallel: empty composition"),
    ('name = "x"\nsummary = "s"\nsteps = [{operator = "attn", solver = "explicit"}]\n', "missing field 'operators'"),
    ('name = "Bad Name"\nsummary = "s"\n', "is not a scheme name"),
    (_replace('summary = "', 'summary = "\\"\\"\\" '), "without backslashes or triple quotes"),
    (_replace('activation = "relu"', 'activation = "swish"'), "unknown activation 'swish'"),
    (_replace('activation = "relu"', 'colour = "red"'), "unknown field 'colour'"),
    ("name = ", "invalid TOML"),
    (_replace('operator = "norm2"\nsolver = "projection"', 'operator = "norm2"\nsolver = "projection"\nfraction = 2'),
     "a projection has no fraction"),
    (_replace('operator = "attn"\nsolver = "explicit"', 'operator = "attn"\nsolver = "explicit"\non = "ffn"'),
     "'on' must name a projection"),
])
def test_malformed_scheme_is_one_line_naming_file_and_key(text, message):
    with pytest.raises(SplitformerError) as error:
        parse_scheme(text, "my.toml")
    text = str(error.value)
    assert "\n" not in text and text.startswith("my.toml")
    assert message in text


def test_rk2_stages_must_be_vector_fields():
    text = load_scheme("rk2").source.replace('{ operator = "attn", on = "norm1" }', '{ operator = "norm1", solver = "projection" }')
    with pytest.raises(SplitformerError, match=r"rk2\[0\].solver: the stages of an rk2 step evaluate vector fields"):
        parse_scheme(text, "rk2.toml")


toml_scalars = st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=8), st.booleans())
toml_values = st.recursive(
    toml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)),
    max_leaves=8,
)
KEYS = ["name", "summary", "activation", "final_norm", "operators", "steps", "description", "parallel",
        "weights", "operator", "solver", "fraction", "on", "rk2"]


def _document_to_toml(document):
    import json

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if v == v and abs(v) != float("inf") else "nan"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    return "\n".join(f"{json.dumps(k)} = {value(v)}" for k, v in document.items())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), toml_values, max_size=6))
def test_random_documents_never_escape_as_other_exceptions(document):
    try:
        parse_scheme(_document_to_toml(document), "fuzz.toml")
    except SplitformerError as error:
        assert "\n" not in str(error)


step_values = st.fixed_dictionaries({}, optional={
    "operator": st.sampled_from(["attn", "ffn", "norm1", "zzz", 3]),
    "solver": st.sampled_from(["explicit", "projection", "exact"]),
    "fraction": st.one_of(st.integers(-2, 3), st.sampled_from(["1/2", "x", "0", "1/0"])),
    "on": st.sampled_from(["norm1", "attn", "nope"]),
})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(step_values, st.fixed_dictionaries({"parallel": st.lists(st.lists(step_values, max_size=2), max_size=3),
                                                               "weights": st.lists(st.sampled_from(["1/2", "1", "0", 1]), max_size=3)}),
                          st.fixed_dictionaries({"rk2": st.lists(step_values, max_size=2)})), max_size=4))
def test_random_step_lists_are_schemes_or_one_line_errors(steps):
    document = {"name": "fuzz", "summary": "s", "operators": {"attn": "attention", "ffn": "feed-forward", "norm1": "layer-norm"},
                "steps": steps}
    text = _document_to_toml(document)
    try:
        scheme = parse_scheme(text, "fuzz.toml")
    except SplitformerError as error:
        assert "\n" not in str(error)
    else:
        assert scheme.body.steps


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_is_a_scheme_or_one_line_error(text):
    try:
        parse_scheme(text, "any.toml")
    except SplitformerError as error:
        assert "\n" not in str(error)


@pytest.mark.parametrize("key, reason", [("class", "is a Python keyword"), ("final_norm", "clashes with the attribute"),
                                         ("Attn", "not an operator name"), ("2nd", "not an operator name")])
def test_operator_names_must_be_safe_identifiers(key, reason):
    text = VALID.replace('attn = "attention"', f'{key} = "attention"')
    with pytest.raises(SplitformerError, match=f"keys.toml: operators: .*{reason}"):
        parse_scheme(text, "keys.toml")


def test_colliding_array_names_are_reported():
    from splitformer.symbolic import derive

    text = VALID.replace('ffn = "feed-forward"', 'ffn = "feed-forward"\nattn_b = "attention"').replace(
        '[[steps]]\noperator = "norm2"', '[[steps]]\noperator = "attn_b"\nsolver = "explicit"\n\n[[steps]]\noperator = "norm2"')
    with pytest.raises(SplitformerError, match="two arrays would be named 'attn_b_q'"):
        derive(parse_scheme(text, "clash.toml"))


def test_names_of_exactly_the_maximum_length_are_accepted():
    from splitformer.symbolic.names import MAX_NAME, check_operator_name, check_scheme_name

    assert check_scheme_name("a" * MAX_NAME) == "a" * MAX_NAME
    assert check_operator_name("a" * MAX_NAME) == "a" * MAX_NAME
    for check in (check_scheme_name, check_operator_name):
        with pytest.raises(SplitformerError, match=f"at most {MAX_NAME} characters"):
            check("a" * (MAX_NAME + 1))


@pytest.mark.parametrize("text, accepted", [
    (f"{MAX_TERM}", True), (f"1/{MAX_TERM}", True), (f"-{MAX_TERM}/{MAX_TERM}", True),
    (f"{MAX_TERM + 1}", False), (f"1/{MAX_TERM + 1}", False), (f"-{MAX_TERM + 1}/3", False),
])
def test_exact_numbers_up_to_the_largest_term(text, accepted):
    """Numerator and denominator may each reach MAX_TERM, and neither may pass it."""
    if accepted:
        assert exact_number(text) == sp.Rational(*(int(part) for part in text.split("/")))
    else:
        with pytest.raises(ValueError, match="is out of range"):
            exact_number(text)


@pytest.mark.parametrize("text", ["١/٢", "２", "1/２", "0.٥", "1e٣"])
def test_a_number_is_written_in_ascii_digits(text):
    """Python reads other scripts' digits as numbers (``Fraction("١/٢") == 1/2``); a scheme file's number is a decimal
    or p/q in ASCII digits, as documented (a hostile tester's Arabic-Indic and fullwidth digits were read as 1/2 and 2).
    Control: the same numbers in ASCII digits are read."""
    with pytest.raises(ValueError, match="not a number"):
        exact_number(text)
    ascii_text = text.translate({ord(c): str(int(c)) for c in text if c.isdigit() and not c.isascii()})
    assert exact_number(ascii_text) == sp.Rational(Fraction(ascii_text))


@pytest.mark.parametrize("text", ["9" * 30 + "." + "1" * 20, "7" * 30 + "/" + "3" * 25, "x" * 60])
def test_a_bad_number_is_quoted_by_its_first_40_characters(text):
    """Messages stay one short line whatever the file holds: the value is cut at 40 characters."""
    with pytest.raises(ValueError) as refused:
        exact_number(text)
    message = str(refused.value)
    assert text[:40] + "…" in message and text[:41] not in message  # said to be cut (attacker s39 L5)
    assert ("not a number" in message) == text.startswith("x")  # digits past what is read: too many, not "not a number"


@pytest.mark.parametrize("value, message", [
    (True, "expected a number or a fraction string, got bool"),  # a TOML boolean is not the number 1
    (None, "expected a number or a fraction string, got NoneType"),
    ("1e1234567890", "has more digits than a number is read with"),  # an exponent of more than 9 digits
    ("1e41", "is out of range"),
])
def test_what_is_not_an_exact_number_says_why(value, message):
    with pytest.raises(ValueError, match=message):
        exact_number(value)


def test_the_documented_bound_on_numbers_is_the_one_enforced():
    """README: numerator and denominator at most 10⁹ (independent of the constant in the code)."""
    assert exact_number("1000000000") == 10**9 and exact_number("1/1000000000") == sp.Rational(1, 10**9)
    for text in ("1000000001", "1/1000000001"):
        with pytest.raises(ValueError, match="is out of range"):
            exact_number(text)


def _feed_forward_steps(count: int) -> str:
    return ('name = "many"\nsummary = "s"\n[operators]\nffn = "feed-forward"\n'
            + '[[steps]]\noperator = "ffn"\nsolver = "explicit"\n' * count)


def test_evaluations_count_every_stage_branch_and_substep():
    scheme = parse_scheme('name = "x"\nsummary = "s"\n[operators]\nffn = "feed-forward"\nnorm = "layer-norm"\n'
                          '[[steps]]\nrk = "rk4"\nfields = [{ operator = "ffn" }, { operator = "ffn", on = "norm" }]\n'
                          '[[steps]]\nparallel = [[{ operator = "ffn", solver = "explicit" }], '
                          '[{ operator = "norm", solver = "projection" }, { operator = "ffn", solver = "explicit" }]]\n')
    assert scheme.evaluations() == 2 * 4 + 1 + 2  # two fields at four stages, then three substeps


def test_the_evaluation_limit_admits_exactly_64():
    from splitformer.symbolic.scheme import MAX_EVALUATIONS

    assert parse_scheme(_feed_forward_steps(MAX_EVALUATIONS)).evaluations() == MAX_EVALUATIONS
    with pytest.raises(SplitformerError, match=f"evaluates {MAX_EVALUATIONS + 1} operators per step"):
        parse_scheme(_feed_forward_steps(MAX_EVALUATIONS + 1))


def test_a_negative_fraction_is_written_with_its_sign_in_the_equation():
    """Attacker s39 L9: a negative fraction showed as '+ -1/2·ffn(u)'."""
    from splitformer.symbolic.equation import equation_text

    negative = parse_scheme(VALID.replace("fraction = 2", "fraction = -1"))
    assert "∂I_S1[norm1](u) − 1/2·ffn(u) −" in equation_text(negative) and "+ -" not in equation_text(negative)
    assert "∂I_S1[norm1](u) + ffn(u) −" in equation_text(load_scheme("post-ln"))  # the control
