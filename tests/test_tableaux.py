"""Solvers as data: Butcher tableaux, their orders, rk4 and a user's SSPRK3 in a scheme file."""

import re

import numpy as np
import pytest
import sympy as sp

from splitformer.codegen.verification.runner import scheme_checks
from splitformer.symbolic import load_scheme, parse_scheme
from splitformer.codegen.verification.statements.order import splitting_order
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Heun, RungeKutta, Scheme, Sequence, Substep
from splitformer.symbolic.tableaux import EULER, HEUN, RK4, TABLEAUX, make_tableau, rooted_trees

import reference
from conftest import GENERATED, ROOT, import_path

SSPRK3 = ROOT / "tests" / "schemes" / "ssprk3.toml"


def test_rooted_tree_counts_and_classical_orders():
    assert [len(rooted_trees(n)) for n in range(1, 7)] == [1, 1, 2, 4, 9, 20]
    assert (EULER.order(), HEUN.order(), RK4.order()) == (1, 2, 4)
    midpoint = make_tableau("midpoint", [[], ["1/2"]], [0, 1])
    assert midpoint.order() == 2
    broken = make_tableau("broken", [[], [1], ["1/2", 0]], ["1/6", "1/6", "2/3"])
    assert broken.order() == 2  # negative control: b·c² = 1/3 holds, b·A·c = 0 ≠ 1/6


@pytest.mark.parametrize("a, b, message", [
    ([[], [1]], [1, 1], "sum to 2"),
    ([[1], [1]], ["1/2", "1/2"], "on or above the diagonal"),
    ([[]], [1, 0], "1 rows for 2 weights"),
    ([[], ["x"]], ["1/2", "1/2"], "not a number"),
    ([[], [None]], ["1/2", "1/2"], "expected a number"),
])
def test_bad_tableaux_are_one_clear_error(a, b, message):
    with pytest.raises(SplitformerError, match=message):
        make_tableau("bad", a, b)


def test_rk2_is_the_heun_tableau_and_explicit_is_euler():
    assert isinstance(load_scheme("rk2").body.steps[0], Heun) and load_scheme("rk2").body.steps[0].tableau == HEUN
    euler = Scheme("e", "s", {"a": "attention"}, Sequence((RungeKutta((Substep("a", "explicit"),), EULER),)))
    plain = Scheme("e", "s", {"a": "attention"}, Sequence((Substep("a", "explicit"),)))
    assert sp.expand(derive(euler).records[0].update.rhs - derive(plain).records[0].update.rhs) == 0


def test_rk4_builtin_orders_and_parity(rng):
    assert "rk4" in TABLEAUX
    result = splitting_order(load_scheme("rk4"))
    assert (result.order, result.splitting_order) == (4, None)
    numpy_module = import_path(GENERATED / "numpy" / "rk4.py")
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    u = rng.standard_normal((2, 5, 8))
    expected = reference.rk4(u, params, 2, 1e-5)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10


def test_user_tableau_in_a_scheme_file_derives_and_reports_order_3():
    scheme = load_scheme(str(SSPRK3))
    assert scheme.body.steps[0].tableau.order() == 3
    assert "ssprk3" not in TABLEAUX  # a scheme file never registers anything
    report = scheme_checks(scheme)
    assert report.orders["ssprk3"]["order"] == 3
    assert all(check.holds for check in report.checks), [c.detail for c in report.checks if not c.holds]
    assert {check.id for check in report.checks} == {"order/ssprk3", "convergence/ssprk3", "semantics/ssprk3/derived",
                                                     "semantics/ssprk3/emitted", "structure/ssprk3/stack",
                                                     "adjoint/ssprk3/finite-difference",
                                                     "adjoint/ssprk3/negative-control", "adjoint-test/ssprk3/dot",
                                                     "adjoint-test/ssprk3/taylor", "adjoint-test/ssprk3/torch",
                                                     "causality/ssprk3/block", "causality/ssprk3/stack",
                                                     "causality/ssprk3/next-token"}


def test_inline_tableau_and_unknown_names():
    text = SSPRK3.read_text().replace('rk = "ssprk3"', 'rk = { a = [[], ["1/2"]], b = [0, 1] }')
    assert splitting_order(parse_scheme(text)).order == 2
    with pytest.raises(SplitformerError, match="unknown Runge–Kutta tableau 'rk9'"):
        parse_scheme(SSPRK3.read_text().replace('rk = "ssprk3"', 'rk = "rk9"'))
    with pytest.raises(SplitformerError, match=r"tableaux.ssprk3: tableau 'ssprk3': the weights b sum to"):
        parse_scheme(SSPRK3.read_text().replace('b = ["1/6", "1/6", "2/3"]', 'b = ["1/6", "1/6", "1/3"]'))


def test_a_file_tableau_named_like_a_registered_one_must_have_its_coefficients():
    """Attack 24: ``[tableaux.heun]`` holding the midpoint method was used under Heun's name in the report."""
    midpoint = SSPRK3.read_text().replace("[tableaux.ssprk3]", "[tableaux.heun]").replace('rk = "ssprk3"', 'rk = "heun"')
    midpoint = re.sub(r"(?m)^a = .*$", 'a = [[], ["1/2"]]', midpoint)
    midpoint = re.sub(r"(?m)^b = .*$", 'b = [0, 1]', midpoint)
    with pytest.raises(SplitformerError, match="tableaux.heun: 'heun' is a registered method with other coefficients"):
        parse_scheme(midpoint)
    heun = parse_scheme(midpoint.replace('a = [[], ["1/2"]]', "a = [[], [1]]").replace("b = [0, 1]", 'b = ["1/2", "1/2"]'))
    assert heun.body.steps[0].tableau.b == TABLEAUX["heun"].b  # the same method under its own name: accepted


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_entries = st.one_of(st.integers(-2, 2), st.booleans(), st.floats(allow_nan=True), st.sampled_from(["1/2", "x", "1/0", ""]),
                     st.lists(st.integers(0, 1), max_size=2), st.none())
_tables = st.one_of(
    st.sampled_from(["rk4", "heun", "nope", 3]),
    st.fixed_dictionaries({}, optional={"a": st.one_of(st.lists(st.lists(_entries, max_size=3), max_size=3), _entries),
                                        "b": st.one_of(st.lists(_entries, max_size=3), _entries),
                                        "c": _entries}),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=_tables, fields=st.lists(st.fixed_dictionaries({}, optional={
    "operator": st.sampled_from(["attn", "norm1", 3]), "on": st.sampled_from(["norm1", "attn"]),
    "solver": st.sampled_from(["explicit", "projection"])}), max_size=2))
def test_random_runge_kutta_steps_are_schemes_or_one_line_errors(method, fields):
    import json

    def value(v):
        if v is None:
            return '""'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
        if isinstance(v, (int, str)):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"

    text = ('name = "fuzz"\nsummary = "s"\n[operators]\nattn = "attention"\nnorm1 = "layer-norm"\n'
            f"[[steps]]\nrk = {value(method)}\nfields = {value(fields)}\n")
    try:
        parse_scheme(text, "fuzz.toml")
    except SplitformerError as error:
        assert "\n" not in str(error)


@pytest.mark.parametrize("entry, message", [("1e5000", "out of range"), ("1e309", "out of range"),
                                            ("9999999999999/3", "out of range"), (float("inf"), "not a number")])
def test_tableau_entries_are_bounded(entry, message):
    with pytest.raises(SplitformerError, match=message):
        make_tableau("big", [[], [entry]], ["1/2", "1/2"])


def test_tableau_names_have_at_most_64_characters():
    """The name reaches generated comments and reports: 64 characters are accepted, 65 refused."""
    assert make_tableau("a" * 64, [[], [1]], ["1/2", "1/2"]).name == "a" * 64
    with pytest.raises(SplitformerError, match="at most 64 characters"):
        make_tableau("a" * 65, [[], [1]], ["1/2", "1/2"])


def _explicit_euler_steps(stages: int):
    """``stages`` explicit stages, every weight ``1/stages`` (consistent)."""
    return make_tableau(f"s{stages}", [[0] * row for row in range(stages)], [f"1/{stages}"] * stages)


def test_the_stage_limit_admits_exactly_16():
    from splitformer.symbolic.tableaux import MAX_STAGES

    assert _explicit_euler_steps(MAX_STAGES).stages == MAX_STAGES
    with pytest.raises(SplitformerError, match=f"has {MAX_STAGES + 1} stages; at most {MAX_STAGES}"):
        _explicit_euler_steps(MAX_STAGES + 1)
