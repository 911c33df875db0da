"""The Python API: schemes built in Python, derive(), modules in memory, write(), notebook reprs."""

import re

import numpy as np
import pytest
import torch

import splitformer
from splitformer import SplitformerError, parallel, projection, rk2, scheme, substep
from splitformer.adapters import from_torch
from splitformer.symbolic.scheme import Scheme, Sequence, Substep
from splitformer.symbolic.scheme_file import load_scheme, parse_scheme

from conftest import random_encoder_layer
from latex_sanity import assert_renderable_math

OPERATORS = {"attn": "attention", "norm1": "layer-norm", "ffn": "feed-forward", "norm2": "layer-norm"}


@pytest.fixture(scope="module")
def post_ln():
    return splitformer.derive("post-ln")


def test_a_python_scheme_equals_the_same_scheme_file():
    built = scheme("my-post-ln", "post-LN written in Python", OPERATORS, [
        substep("attn"), projection("norm1"),
        parallel([substep("ffn", fraction=2)], [], weights=["1/2", "1/2"]), projection("norm2"),
    ], order=1, splitting_order=1)
    from_file = load_scheme("post-ln")
    assert (built.operators, built.body, built.claims) == (from_file.operators, from_file.body, from_file.claims)
    assert parse_scheme(built.source).body == built.body  # its TOML text is the same scheme


@pytest.mark.parametrize("steps, message", [
    ([projection("attn")], "'attn' is a vector field, not a projection"),
    ([substep("attn", "rk7")], "steps[0].solver: unknown solver 'rk7'"),
    ([substep("attn", on="nowhere")], "steps[0].on: unknown operator 'nowhere'"),
    ([substep("attn", on="ffn")], "'on' must name a projection, not 'ffn'"),
    ([substep("attn", fraction=0)], "steps[0].fraction: must not be 0"),
    ([parallel([substep("ffn")], [], weights=[1, 1])], "weights must sum to 1"),
    ([rk2("attn", "nothing")], "steps[0].rk2[1].operator: unknown operator 'nothing'"),
    ([], "empty composition"),
    ("attn", "steps: expected list, got str"),
])
def test_a_python_scheme_is_checked_like_a_scheme_file(steps, message):
    with pytest.raises(SplitformerError) as error:
        scheme("bad", "x", OPERATORS, steps)
    assert message in str(error.value) and str(error.value).startswith("Python scheme 'bad': ")


@pytest.mark.parametrize("fields, message", [
    ({"activation": "swish"}, "unknown activation 'swish'"),
    ({"colour": "red"}, "unknown field 'colour'"),
    ({"order": 0}, "an order is a positive integer"),
])
def test_python_scheme_fields_are_checked(fields, message):
    with pytest.raises(SplitformerError, match=message):
        scheme("bad", "x", OPERATORS, [substep("attn")], **fields)


def test_unknown_operator_kind_in_python_is_one_clear_error():
    with pytest.raises(SplitformerError, match="operators.attn: unknown operator 'spline'"):
        scheme("bad", "x", {"attn": "spline"}, [substep("attn")])


@pytest.mark.parametrize("body, operators, message", [
    (Sequence((Substep("attn", "projection"),)), {"attn": "attention"}, "is a vector field, not a projection"),
    (Sequence((Substep("attn", "leapfrog"),)), {"attn": "attention"}, "unknown solver 'leapfrog'"),
    (Sequence((Substep("attn", "explicit", on="nowhere"),)), {"attn": "attention"}, "unknown operator 'nowhere'"),
    (Sequence((Substep("attn", "explicit"),)), {"attn": "spline"}, "unknown operator kind 'spline'"),
])
def test_a_hand_made_scheme_object_is_rejected_by_derive_not_with_a_key_error(body, operators, message):
    with pytest.raises(SplitformerError, match=message):
        splitformer.derive(Scheme("hand-made", "x", operators, body))


def test_derive_accepts_names_and_rejects_other_objects():
    with pytest.raises(SplitformerError, match="unknown scheme 'no-such'"):
        splitformer.derive("no-such")
    with pytest.raises(SplitformerError, match="expected a Scheme"):
        splitformer.derive(42)


def test_derivation_holds_program_records_order_and_report(post_ln):
    assert post_ln.name == "post_ln" and post_ln.program.output == "u4"
    assert [record.title for record in post_ln.records][1] == "substep 2: norm1, projection"
    assert (post_ln.order.order, post_ln.order.splitting_order) == (1, 1)
    assert post_ln.report.startswith("# `post-ln`: derivation report")
    assert str(post_ln.equation) == "u_t = attn(u) − ∂I_S1[norm1](u) + ffn(u) − ∂I_S1[norm2](u)"


def test_modules_in_memory_match_torch_in_float64(post_ln, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    layer = random_encoder_layer(8, 2, 12, 1e-5)
    params = from_torch(layer)
    u = np.random.default_rng(3).standard_normal((2, 5, 8))
    expected = layer(torch.tensor(u)).detach().numpy()
    numpy_out = post_ln.numpy_module().forward(u, params, n_heads=2, eps=1e-5)
    block = post_ln.torch_module().Block(8, 2, 12, dtype=torch.float64).load_params(params)
    torch_out = block(torch.tensor(u)).detach().numpy()
    assert np.abs(numpy_out - expected).max() < 1e-12
    assert np.abs(torch_out - expected).max() < 1e-12
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_in_memory_module_is_the_written_file(post_ln, tmp_path):
    written = post_ln.write(tmp_path / "out", backend="numpy")
    module = tmp_path / "out" / "numpy" / "post_ln.py"
    assert module in written and (tmp_path / "out" / "reports" / "post_ln.md").is_file()
    assert module.read_text() == post_ln.source("numpy")
    assert post_ln.numpy_module().__doc__.startswith("post-ln: ")
    assert not (tmp_path / "out" / "torch").exists()


def test_write_rejects_a_bad_backend_and_writes_nothing(post_ln, tmp_path):
    with pytest.raises(SplitformerError, match="unknown backend 'cuda'"):
        post_ln.write(tmp_path / "out", backend="cuda")
    assert not (tmp_path / "out").exists()


def test_activation_is_part_of_the_name():
    assert splitformer.derive("pre-ln", activation="gelu").name == "pre_ln_gelu"


def test_every_displayed_object_has_a_notebook_repr(post_ln):
    shown = {
        "scheme": post_ln.scheme._repr_markdown_(),
        "equation": post_ln.equation._repr_latex_(),
        "program": post_ln.program._repr_latex_(),
        "record": post_ln.records[0]._repr_latex_(),
        "order": post_ln.order._repr_markdown_(),
        "derivation": post_ln._repr_markdown_(),
    }
    assert r"\mathcal{A}_{\mathrm{attn}}" in shown["scheme"] and '\n    name = "post-ln"\n' in shown["scheme"]
    assert shown["equation"].startswith("$$") and r"\partial I" in shown["equation"]
    assert shown["program"].startswith(r"\begin{align*}") and shown["program"].endswith(r"\end{align*}")
    assert r"\text{substep 1: attn, explicit}" in shown["record"]
    assert "order 1" in shown["order"] and r"\frac{h^{2}" in shown["order"]
    assert "splitting order 1" in shown["derivation"] and "4 substeps" in shown["derivation"]
    assert_renderable_math([math for text in shown.values() for math in math_of(text)])


def test_a_derived_network_has_a_notebook_view():
    """Tester s39 L7: a NetworkDerivation had no Markdown view where a block's Derivation has one."""
    shown = splitformer.derive("resnet-block")._repr_markdown_()
    assert shown.startswith("**Network `resnet-block`** → `resnet_block`: ResNet basic block")
    assert "\n1. One step of the equation on the 2-D grid\n2. The field $F$, operator by operator\n" in shown
    assert_renderable_math(math_of(shown))


def math_of(text):
    """The math of a notebook view: an environment, ``$$…$$`` and ``$…$`` pieces."""
    if text.startswith(r"\begin{"):
        return [text]
    display = re.findall(r"\$\$(.+?)\$\$", text, re.S)
    inline = re.findall(r"\$([^$]+)\$", re.sub(r"\$\$(.+?)\$\$", "", text, flags=re.S))
    return display + inline


def test_other_displayed_objects_render():
    from splitformer.symbolic.kinds import OPERATOR_KINDS
    from splitformer.symbolic.tableaux import TABLEAUX

    shown = [TABLEAUX["rk4"]._repr_latex_(), OPERATOR_KINDS["rms-norm"].projection()._repr_markdown_(),
             OPERATOR_KINDS["attention"]("attn")._repr_latex_()]
    assert r"\hline" in shown[0] and "Lagrangian" in shown[1]
    assert_renderable_math([math for text in shown for math in math_of(text)])


def test_public_names_resolve():
    for name in splitformer.__all__:
        assert getattr(splitformer, name) is not None, name
    assert set(splitformer.__all__) <= set(dir(splitformer))  # tab completion finds the lazy names


def test_nothing_cites_the_design_notes():
    from conftest import ROOT

    folders = ("symbolic", "codegen", "templates", "generated", "docs", "splitformer")
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".j2", ".toml"):
                assert "MODEL.md" not in path.read_text(encoding="utf-8"), path


def test_passes_by_name():
    plain = splitformer.derive("post-ln", passes="none").source("numpy")
    assert "np.einsum" in plain or "_einsum(" in plain
    with pytest.raises(SplitformerError, match="unknown pass 'turbo'"):
        splitformer.derive("post-ln", passes="turbo")
    for empty in ("", " ", ",,"):  # an unset variable is not 'none'
        with pytest.raises(SplitformerError, match="names no pass"):
            splitformer.derive("post-ln", passes=empty)


def test_plain_text_forms_for_a_terminal(post_ln):
    assert repr(post_ln) == "<Derivation of 'post-ln' → post_ln: 4 substeps>"
    assert repr(post_ln.program).startswith("<Program post_ln: 4 substeps, ")
    assert str(post_ln.records[1]).splitlines()[0] == "substep 2: norm1, projection"
    assert str(post_ln.order) == "order 1, splitting order 1; leading local error " + post_ln.order.leading_error_text
    for text in (str(post_ln.program), str(post_ln.order), str(post_ln.equation)):
        assert "\\" not in text


def test_a_python_scheme_with_its_own_tableau():
    ssprk3 = {"a": [[], [1], ["1/4", "1/4"]], "b": ["1/6", "1/6", "2/3"]}
    built = scheme("ssp", "SSPRK3 of the pre-LN field", OPERATORS,
                   [splitformer.runge_kutta("ssprk3", substep("attn", on="norm1"), substep("ffn", on="norm2"))],
                   tableaux={"ssprk3": ssprk3}, order=3)
    assert "[tableaux]" in built.source and parse_scheme(built.source).body == built.body
    assert splitformer.derive(built).order.order == 3
    with pytest.raises(SplitformerError, match="unknown Runge–Kutta tableau 'ssprk9'"):
        scheme("ssp", "x", OPERATORS, [splitformer.runge_kutta("ssprk9", "attn")])


def test_load_scheme_takes_names_and_paths_only(tmp_path):
    from conftest import ROOT

    assert splitformer.load_scheme(ROOT / "symbolic" / "schemes" / "rk2.toml").name == "rk2"
    with pytest.raises(SplitformerError, match="expected a scheme name or a path, got int"):
        splitformer.load_scheme(42)


def test_write_leaves_foreign_files_unless_forced(post_ln, tmp_path):
    foreign = tmp_path / "numpy" / "post_ln.py"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("# mine\n")
    with pytest.raises(SplitformerError):
        post_ln.write(tmp_path, backend="numpy")
    assert foreign.read_text() == "# mine\n"
    post_ln.write(tmp_path, backend="numpy", force=True)
    assert foreign.read_text() == post_ln.source("numpy")


def test_check_refuses_a_foreign_plot_before_running_and_names_the_remedy(post_ln, tmp_path, monkeypatch):
    foreign = tmp_path / f"{post_ln.scheme.module_name}_convergence.png"
    foreign.write_text("mine")
    monkeypatch.setattr("splitformer.codegen.verification.runner.scheme_checks", lambda *args: pytest.fail("checks ran"))
    with pytest.raises(SplitformerError, match="choose another plots folder") as refused:
        post_ln.check(plots=tmp_path)
    assert "--force" not in str(refused.value)
    assert foreign.read_text() == "mine"


def test_a_network_name_given_as_a_scheme_says_what_it_is():
    with pytest.raises(SplitformerError, match="'vit' is a built-in network, not a block scheme"):
        splitformer.load_scheme("vit")
    assert isinstance(splitformer.derive("vit"), splitformer.NetworkDerivation)
    with pytest.raises(SplitformerError, match="networks, for derive, show and check: .*vit"):
        splitformer.derive("no-such")


def test_notebook_views_show_a_scheme_files_text_as_text(tmp_path):
    """Attack 16: a scheme file's summary and comments reached the notebook views (``_repr_markdown_``) as Markdown,
    which a notebook renders as trusted HTML (an ``onerror`` handler, a ``javascript:`` link; a comment line of
    backquotes closed the source's fence). Rendered, the views hold no tag and no link; the text is there."""
    import markdown

    path = tmp_path / "innocent.toml"
    path.write_text(load_scheme("pre-ln").source.replace(
        'summary = "', 'summary = "<img src=x onerror=alert(1)> [docs](javascript:alert(2)) ', 1)
        .replace("name = ", '# ```\n# <img src=y onerror="alert(3)">\nname = ', 1))
    scheme = load_scheme(str(path))
    for view in (scheme._repr_markdown_(), splitformer.derive(scheme)._repr_markdown_()):
        html = markdown.markdown(view, extensions=["fenced_code"])
        assert "onerror=alert(1)" in html and "<img" not in html and "<a " not in html, html
    control = markdown.markdown(f"**x**: {scheme.summary}")
    assert "<img" in control and "<a " in control
