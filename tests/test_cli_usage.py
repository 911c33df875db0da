"""The command line for a new user: help texts, bare usage, plain-text output, check progress."""

import io
import json
import re

import pytest

from splitformer.codegen.verification.runner import CheckReport
from splitformer.codegen.cli import main
from splitformer.codegen.passes import PASSES
from splitformer.symbolic.activations import ACTIVATIONS
from splitformer.symbolic.builtins import builtin_names
from splitformer.codegen.verification.statements import SKIPPED, Check

from latex_sanity import assert_renderable_align

#: The activations built in (taken when the file is collected: a plug-in test in the same process may
#: register more, which the help text, written for the built-ins, does not list).
BUILT_IN_ACTIVATIONS = tuple(ACTIVATIONS)


def help_text(capsys, *command):
    with pytest.raises(SystemExit) as leaving:
        main([*command, "--help"])
    assert leaving.value.code == 0
    return capsys.readouterr().out


def flat(text):
    """Help text as one line (argparse wraps lines, also after a hyphen)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


@pytest.mark.parametrize("command", ["list", "show", "derive", "check", "compare"])
def test_each_command_explains_its_options_and_shows_an_example(command, capsys):
    text = help_text(capsys, command)
    assert re.search(rf"^  splitformer {command}\b", text, re.M), "an example of the command"
    assert "SPLITFORMER_CACHE" in text and "~/.cache/splitformer" in text and "'off'" in text
    options = re.findall(r"^  (--[a-z-]+)", text, re.M)
    for option in options:  # every option has a sentence, not only its name
        assert re.search(rf"^  {option}[^\n]*\S+\s+\S", text, re.M), option


def test_help_names_every_choice(capsys):
    show, derive, check = (help_text(capsys, command) for command in ("show", "derive", "check"))
    for choice in ("text (default):", "latex:", "markdown:", "toml:"):
        assert choice in flat(show)
    for name in (*BUILT_IN_ACTIVATIONS, *PASSES, "numpy", "torch", "all", "none"):
        assert name in flat(derive), name
    for choice in ("text (default):", "json:", "markdown:"):
        assert choice in flat(check)


def test_bare_splitformer_prints_usage(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: splitformer") and all(name in out for name in ("list", "show", "derive", "check"))
    assert "SPLITFORMER_CACHE" in out


@pytest.mark.parametrize("name", builtin_names())
def test_show_text_has_no_latex(name, capsys):
    assert main(["show", name]) == 0
    out = capsys.readouterr().out
    assert "\\" not in out and "$" not in out
    assert "Δt*" in out


@pytest.mark.parametrize("name", builtin_names())
def test_show_latex_is_one_renderable_align_environment(name, capsys):
    assert main(["show", name, "--format", "latex"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.isascii()
    assert out.startswith(r"\begin{align*}") and out.endswith(r"\end{align*}")
    assert out.count(r"\begin{") == out.count(r"\end{") == 1
    assert_renderable_align(out)


def fake_report(progress=None):
    report = CheckReport(progress=progress)
    report.add(Check("a/first", None, "first claim", "symbolic", True, "holds"),
               Check("b/second", "x", "second claim", "numeric", False, "fails"))
    return report


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_check_shows_progress_only_on_a_terminal(terminal, monkeypatch, capsys):
    monkeypatch.setattr("splitformer.symbolic.network_spec.load_scheme_or_network", lambda name: name)
    monkeypatch.setattr("splitformer.codegen.verification.runner.run_checks",
                        lambda schemes, plots, progress=None, networks=(), only=None: fake_report(progress))
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    assert main(["check", "x", "--format", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [check["id"] for check in document["checks"]] == ["a/first", "b/second"]
    lines = stderr.getvalue().splitlines()
    if terminal:
        assert len(lines) == 2 and "ok    a/first" in lines[0] and "FAIL  b/second" in lines[1]
        assert lines[0].startswith("[") and " s] " in lines[0]
    else:
        assert lines == []


def test_json_says_which_checks_were_skipped(monkeypatch, capsys):
    """A skipped check counts as holding (``holds``: true); ``status`` tells it from one that held."""
    report = fake_report()
    report.add(Check("c/third", None, "third claim", SKIPPED, True, "not run here"))
    monkeypatch.setattr("splitformer.symbolic.network_spec.load_scheme_or_network", lambda name: name)
    monkeypatch.setattr("splitformer.codegen.verification.runner.run_checks",
                        lambda schemes, plots, progress=None, networks=(), only=None: report)
    assert main(["check", "x", "--format", "json"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [(check["holds"], check["status"]) for check in checks] == [(True, "ok"), (False, "fail"), (True, "skip")]
    assert [check.label for check in report.checks] == ["ok  ", "FAIL", "skip"]


def test_progress_sees_every_check_as_it_is_added():
    seen = []
    report = fake_report(seen.append)
    assert seen == report.checks


@pytest.mark.parametrize("broken", [r"\begin{align*} x &= \frac{1}{2 \end{align*}", r"\begin{align*} x &= \foo \end{align*}",
                                    r"\begin{align*} x &= y & z \end{align*}", r"\begin{align*} x &= \left( y \end{align*}"])
def test_the_latex_sanity_check_catches_broken_math(broken):
    with pytest.raises(AssertionError):
        assert_renderable_align(broken)


def test_report_math_is_renderable():
    from splitformer.codegen.report import render_report
    from splitformer.codegen.verification.statements.order import splitting_order
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.scheme_file import load_scheme

    from latex_sanity import assert_renderable_math

    scheme = load_scheme("rk2")
    report = render_report(scheme, derive(scheme), order=splitting_order(scheme))
    display = re.findall(r"\$\$\n(.*?)\n\$\$", report, re.S)
    inline = re.findall(r"(?<!\$)\$([^$\n]+)\$(?!\$)", re.sub(r"\$\$\n.*?\n\$\$", "", report, flags=re.S))
    assert len(display) > 20 and len(inline) > 10
    assert_renderable_math(display + inline)
    assert "MODEL.md" not in report and "docs/model.md §" in report


def test_compare_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    plot = tmp_path / "all.png"
    assert main(["compare", "post-ln", "rk2", "--sizes", "d=24,d_ff=40", "--plot", str(plot)]) == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines[0].split()[:5] == ["scheme", "order", "splitting", "evaluations", "parameters"]
    assert lines[2].split()[:5] == ["rk2", "2", "—", "8", "4480"]  # TransformerEncoderLayer(24, 4, 40)
    assert len(lines) == 3 and printed.err == f"wrote {plot}\n"  # stdout holds the table alone
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("arguments, message", [
    (["compare", "post-ln", "--sizes", "d=x"], "--sizes: expected NAME=N,… (NAME among d, d_ff, "),
    (["compare", "post-ln", "--format", "pdf"], "invalid choice: 'pdf'"),
    (["compare"], "required: SCHEME"),
])
def test_compare_bad_input_is_one_error_line(arguments, message, capsys):
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and message in captured.err
