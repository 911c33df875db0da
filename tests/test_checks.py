"""The proof checker: every check holds, and deliberately wrong claims are caught."""

import json
import random
import subprocess
import sys
from dataclasses import replace

import pytest
import sympy as sp

from splitformer.codegen.verification.runner import order_check, run_checks, scheme_checks
from splitformer.codegen.cli import main
from splitformer.codegen.report import check_ids
from splitformer.symbolic import builtin_names, derive, load_scheme, parse_scheme
from splitformer.codegen.verification.statements.order import splitting_order
from splitformer.codegen.verification.statements.projections import projection_checks
from splitformer.codegen.verification.statements.recovery import recovery_checks
from splitformer.codegen.verification.statements.sign import sign_check
from splitformer.symbolic.program import Assignment, SubstepRecord
from splitformer.symbolic.projections import SYMBOLS as S

from conftest import ROOT


#: Ids that must be in the report: the general checks, then each built-in's own (checked with it).
EXPECTED_IDS = {
    "theorem-3.1/closed-form", "relu/kkt", "layer-norm/eps-ghost", "layer-norm/scale-invariance",
    "subdifferential/sign", "activation/gelu", "recovery/rk2/numeric", "order/macaron",
    "convergence/symmetric-parallel", "semantics/macaron/derived", "semantics/rk2/emitted",
    "structure/attention/permutation", "structure/attention/heads", "structure/attention/causal",
    "structure/attention/padding", "structure/post-ln/stack", "paper-lie/post-ln-exact",
    "semantics/llama/derived", "semantics/llama/emitted", "semantics/decoder/derived",
    "semantics/decoder-pre-ln/emitted", "structure/rotary-attention/relative-positions",
    "structure/cross-attention/memory-permutation", "structure/cross-attention/memory-padding",
    "attention/kernel-rows", "attention/convex-hull", "attention/constant-rows", "attention/circuits",
    "rms-norm/scale-invariance", "causality/gpt2/block", "causality/llama/stack",
    "causality/decoder/next-token", "adjoint-test/rk4/dot", "adjoint-test/paper-lie/taylor"}


def _own(ids: set[str], name: str) -> set[str]:
    return {check_id for check_id in ids
            if f"/{name}/" in check_id or check_id.endswith(f"/{name}") or check_id.startswith(f"{name}/")}


def _holds(report) -> None:
    failing = [(check.id, check.detail) for check in report.checks if not check.holds]
    assert not failing
    assert not [check.id for check in report.checks if check.method == "skipped"]
    assert "\\" not in report.as_text()


@pytest.fixture(scope="module")
def general_report():
    return run_checks([])


def test_every_general_check_holds(general_report):
    _holds(general_report)
    ids = {check.id for check in general_report.checks}
    per_scheme = {check_id for name in builtin_names() for check_id in _own(EXPECTED_IDS, name)}
    assert EXPECTED_IDS - per_scheme <= ids


@pytest.mark.parametrize("name", builtin_names())
def test_every_check_holds_for_the_builtin(name, general_report):
    """One test per built-in, so that the suite's workers share them."""
    scheme = load_scheme(name)
    report = scheme_checks(scheme)
    _holds(report)
    ids = {check.id for check in report.checks}
    assert _own(EXPECTED_IDS, name) <= ids
    # reports name only checks that exist
    assert set(check_ids(scheme)) <= ids | {check.id for check in general_report.checks}


def test_expected_ids_name_builtins_or_general_checks():
    """Control for the test above: an expected per-scheme id is attributed to its scheme."""
    assert _own({"order/macaron", "order/macaron-pre-ln", "semantics/macaron/derived", "paper-lie/post-ln-exact"},
                "macaron") == {"order/macaron", "semantics/macaron/derived"}
    assert _own({"paper-lie/post-ln-exact", "theorem-3.1/kkt"}, "paper-lie") == {"paper-lie/post-ln-exact"}


def test_orders_are_the_true_ones():
    """docs/model.md §9: Euler-based blocks are order 1; Strang/symmetric need exact sub-flows for 2; RK2 is 2."""
    expected = {"post-ln": (1, 1), "pre-ln": (1, 1), "macaron": (1, 1), "macaron-pre-ln": (1, 1), "parallel": (1, 1),
                "symmetric-parallel": (1, 2), "rk2": (2, None), "rk4": (4, None), "gpt2": (1, 1), "llama": (1, 1),
                "decoder": (1, 1), "decoder-pre-ln": (1, 1), "paper-lie": (1, 1)}
    results = {name: splitting_order(load_scheme(name)) for name in builtin_names()}
    assert {name: (result.order, result.splitting_order) for name, result in results.items()} == expected
    # Macaron's F_pre ≠ F_post: ½h²[F_post − F_pre, A] survives; tied, the splitting order is 2 (docs/model.md §9)
    assert results["macaron"].tied_splitting_order == 2


def test_distinct_operators_of_one_kind_are_distinct_generators():
    lie = ('name = "two-ffn"\nsummary = "s"\norder = 1\nsplitting_order = 1\n[operators]\nf = "feed-forward"\n'
           'g = "feed-forward"\n[[steps]]\noperator = "f"\nsolver = "explicit"\n[[steps]]\noperator = "g"\nsolver = "explicit"\n')
    result = splitting_order(parse_scheme(lie))
    assert (result.order, result.splitting_order) == (1, 1)  # not exact: [g, f] ≠ 0
    assert result.tied_splitting_order is None  # merged into one generator, the split is exact
    assert order_check(parse_scheme(lie), result).holds


def test_instances_of_one_kind_with_other_options_stay_two_fields_when_tied():
    """A tester's finding: the tied order merged instances by kind alone, so a Macaron step of a GELU and a tanh
    feed-forward read tied order 2. Sharing W₁, b₁, W₂, b₂ leaves two maps (the tester measured slope 0.97): the
    tied order is 1, as the splitting order; Macaron's own halves (one activation) tie to 2 (control)."""
    text = ('name = "mac-mixed"\nsummary = "s"\n[operators]\nffn_pre = {{ kind = "feed-forward", activation = "gelu" }}\n'
            'attn = "attention"\nffn_post = {{ kind = "feed-forward", activation = "{second}" }}\n'
            '[[steps]]\noperator = "ffn_pre"\nsolver = "explicit"\nfraction = "1/2"\n[[steps]]\noperator = "attn"\n'
            'solver = "explicit"\n[[steps]]\noperator = "ffn_post"\nsolver = "explicit"\nfraction = "1/2"\n')
    assert splitting_order(parse_scheme(text.format(second="tanh"))).tied_splitting_order == 1
    assert splitting_order(parse_scheme(text.format(second="gelu"))).tied_splitting_order == 2


def test_lie_splitting_leading_terms():
    scheme = parse_scheme('name = "lie"\nsummary = "s"\n[operators]\na = "attention"\nf = "feed-forward"\n'
                          '[[steps]]\noperator = "a"\nsolver = "explicit"\n[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    result = splitting_order(scheme)
    A, B, h = sp.Symbol("a", commutative=False), sp.Symbol("f", commutative=False), sp.Symbol("h", positive=True)
    # exact sub-flows: e^{hB} e^{hA} − e^{h(A+B)} = h²/2 (BA − AB) + O(h³)
    assert sp.expand(result.exact_subflows_leading - h**2 / 2 * (B * A - A * B)) == 0
    # Euler sub-steps: (1 + hB)(1 + hA) − e^{h(A+B)} = h² (BA − (A + B)²/2) + O(h³)
    assert sp.expand(result.leading - h**2 * (B * A - (A + B) ** 2 / 2)) == 0
    assert (result.order, result.splitting_order) == (1, 1)


def test_macarons_exact_sub_flows_leave_the_commutators_its_description_names():
    """e^{hF_post/2} e^{hA} e^{hF_pre/2} − e^{h(F_pre/2 + A + F_post/2)} = h²(¼[F_post − F_pre, A] + ⅛[F_post, F_pre])
    + O(h³) (BCH, docs/model.md §9), what macaron's description says (it said ½h²[F_post − F_pre, A])."""
    from splitformer.symbolic.builtins import builtin_text

    A, pre, post = (sp.Symbol(name, commutative=False) for name in ("attn", "ffn_pre", "ffn_post"))
    h = sp.Symbol("h", positive=True)

    def bracket(x, y):
        return x * y - y * x

    for name in ("macaron", "macaron-pre-ln"):
        result = splitting_order(load_scheme(name))
        expected = h**2 * (bracket(post - pre, A) / 4 + bracket(post, pre) / 8)
        assert sp.expand(result.exact_subflows_leading - expected) == 0, name
        assert "h²(¼[F_post − F_pre, A] + ⅛[F_post, F_pre])" in builtin_text(name).replace("\n", " ")


def test_json_has_the_fixed_shape(capsys):
    code = main(["check", "pre-ln", "--format", "json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and set(document) == {"checks", "orders"}
    for check in document["checks"]:
        assert set(check) == {"id", "scheme", "statement", "method", "holds", "detail", "status"}
        assert check["method"] in ("symbolic", "numeric") and isinstance(check["holds"], bool)
        assert check["status"] == ("ok" if check["holds"] else "fail")
    orders = document["orders"]["pre-ln"]
    assert set(document["orders"]) == {"pre-ln"} and (orders["order"], orders["splitting_order"]) == (1, 1)
    assert {"leading_error", "exact_subflows_error", "tied_splitting_order", "generators", "projections"} <= set(orders)
    assert orders["generators"] == {"attn": "attention attn on Proj(norm1)", "ffn": "feed-forward ffn on Proj(norm2)"}
    assert "projection substeps are excluded" in orders["projections"]
    assert "h^{2}" in orders["leading_error"]
    assert orders["splitting_note"] == ""  # a number; rk2's says why it has none (below)


def test_json_says_why_a_step_is_no_splitting(capsys):
    """A reviewer (s46): the reason for "—" was only in the order check's detail, which a file claiming no order
    lacks."""
    assert main(["check", "rk2", "--only", "order", "--format", "json"]) == 0
    orders = json.loads(capsys.readouterr().out)["orders"]["rk2"]
    assert orders["splitting_order"] is None and orders["splitting_note"].startswith("not a splitting: every sub-flow")


def test_plots_are_written(tmp_path, capsys):
    assert main(["check", "post-ln", "--plots", str(tmp_path), "--format", "markdown",
                 "--only", "recovery,convergence"]) == 0
    assert "| ✅ | `recovery/post-ln/symbolic`" in capsys.readouterr().out
    assert (tmp_path / "post_ln_convergence.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "convergence.png").read_bytes()[:4] == b"\x89PNG"  # every scheme overlaid
    assert main(["check", "post-ln", "--plots", str(tmp_path), "--only", "convergence"]) == 0  # its own are replaced
    assert not [path for path in tmp_path.iterdir() if path.suffix != ".png"]  # no staging leftovers


def test_plots_never_replace_an_image_splitformer_did_not_make(tmp_path, capsys):
    theirs = tmp_path / "convergence.png"
    theirs.write_bytes(b"\x89PNG their own figure")
    assert main(["check", "post-ln", "--plots", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {theirs} exists and was not written by splitformer; remove it or choose another --plots folder\n"
    assert theirs.read_bytes() == b"\x89PNG their own figure" and not (tmp_path / "post_ln_convergence.png").exists()


# -- negative controls --------------------------------------------------------------------

def test_wrong_projection_formula_is_caught():
    wrong = S.sigma_1 + S.sigma_2 * (S.v - S.alpha) / S.beta  # β instead of √β
    checks = {check.id: check for check in projection_checks(wrong)}
    assert not checks["theorem-3.1/closed-form"].holds
    assert "derived − closed form =" in checks["theorem-3.1/closed-form"].detail
    assert not checks["theorem-3.1/constraints"].holds and "variance" in checks["theorem-3.1/constraints"].detail


def test_wrong_sign_is_caught_with_a_counterexample():
    check = sign_check("u - v")
    assert not check.holds
    assert "fails at v = -3" in check.detail and "u = Proj(v) = 0" in check.detail


def test_perturbed_program_is_caught():
    scheme = load_scheme("post-ln")
    program = derive(scheme)
    record = program.records[0]
    scores = next(a for a in record.evaluations[0].assignments if a.target == "attn_a")
    perturbed = Assignment(scores.lhs, scores.rhs * 2, scores.meaning)  # drop the 1/√d_h scale once
    evaluation = replace(record.evaluations[0], assignments=tuple(
        perturbed if a is scores else a for a in record.evaluations[0].assignments))
    program.records[0] = SubstepRecord(record.title, record.rule, (evaluation,), record.update)
    checks = {check.id: check for check in recovery_checks(scheme, program)}
    assert not checks["recovery/post-ln/symbolic"].holds and "do not vanish" in checks["recovery/post-ln/symbolic"].detail
    assert not checks["recovery/post-ln/numeric"].holds


def test_mislabelled_order_fails_the_check_and_exits_1(tmp_path):
    text = load_scheme("pre-ln").source.replace('name = "pre-ln"', 'name = "mislabelled"').replace("order = 1", "order = 2", 1)
    path = tmp_path / "mislabelled.toml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "splitformer.codegen.cli", "check", str(path), "--format", "json",
                             "--only", "order,convergence"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1
    checks = {check["id"]: check for check in json.loads(result.stdout)["checks"]}
    assert not checks["order/mislabelled"]["holds"]
    assert "order: claimed 2, the trees give 1" in checks["order/mislabelled"]["detail"]
    assert checks["convergence/mislabelled"]["holds"]  # the numbers agree with the true order


def test_a_single_field_is_exact_with_exact_subflows():
    scheme = parse_scheme('name = "ff"\nsummary = "s"\n[operators]\nf = "feed-forward"\n'
                          '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    result = splitting_order(scheme)
    assert result.order == 1 and result.splitting_order is None and result.exact_subflows_leading == 0


class _Twice(sp.Function):
    """A function mpmath does not know, evaluated by SymPy alone."""

    def _eval_evalf(self, precision):
        return (2 * self.args[0]).evalf(precision)


def test_a_random_point_is_evaluated_as_sympys_substitution_would():
    from splitformer.codegen.verification.statements.recovery import _at_random_point, vanishes
    x, y, eps = (sp.Symbol(name, real=True) for name in ("u[0,1]", "W[1,0]", "epsilon"))
    expr = sp.exp(x - y) * sp.sqrt(x**2 + eps) - sp.Max(y - x, 0) / (1 + sp.exp(-x))
    point = dict(zip(sorted(expr.free_symbols, key=str), (sp.Float(v, 30) for v in _uniform(3))))
    assert abs(_at_random_point(expr) - sp.N(expr.xreplace(point), 30)) < 1e-28
    assert vanishes((x + y) ** 2 - x**2 - 2 * x * y - y**2) and not vanishes(expr)
    assert not vanishes(sp.Rational(1, 10**18) * x)  # 30 digits see 1e-19
    twice = _Twice(x) - 2 * x  # through substitution: 0 at the point, but no expansion removes it
    assert abs(_at_random_point(twice)) < 1e-28 and not vanishes(twice)
    assert abs(_at_random_point(_Twice(x) - x) - sp.Float(_uniform(1)[0], 30)) < 1e-28  # its one symbol: the first


def _uniform(count):
    generator = random.Random(0)
    return [generator.uniform(0.1, 1) for _ in range(count)]


def test_the_references_product_is_the_matrix_product():
    from splitformer.symbolic.references import product

    a = sp.Matrix(2, 3, lambda i, k: 0 if (i, k) == (1, 1) else sp.Symbol(f"a[{i},{k}]", real=True))
    b = sp.Matrix(3, 2, lambda k, j: sp.exp(sp.Symbol(f"b[{k},{j}]", real=True)) if k != 2 else 0)
    assert product(a, b) == a * b and product(b, a) == b * a
    assert product(a, b) != (b.T * a.T)  # control: the transposed order is another matrix
