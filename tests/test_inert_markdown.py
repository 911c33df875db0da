"""The last guard on rendered Markdown (``symbolic.markdown.inert``): whatever a check upstream misses, a report, a
check table or a notebook view that would render raw HTML, a link or an image is refused, never written. Code is
scanned like the rest (attack 21: where a renderer starts and ends code is subtle)."""

import subprocess
import sys

import pytest

from conftest import ROOT
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.markdown import inert, markdown_text


@pytest.mark.parametrize("text", [
    "x <img src=x onerror=alert(1)>", "<script>alert(1)</script>", "<!-- a comment -->", "<http://evil.example/>",
    "[click](http://evil.example/)", "![p](http://evil.example/p.png)", "[click][ref]", "[ref]: http://evil.example/",
    r"$\href{javascript:alert(1)}{x}$", r"$\htmlClass{c}{x}$", "`a` <b>bold</b>",
    "\\`<b>`",  # an escaped backquote opens no code span: the tag is live
    "```\ncode\n````\n<i>live</i>\n```",  # a longer run closes the fence: the line after it is text
    "`x\n\n<b>`",  # a code span ends at its paragraph
    # attack 20: a link definition in a list item (a plug-in meaning, a cache's narrative step), Python-Markdown's
    # attr_list (mkdocs.yml enables it), MathJax's \mmlToken with href and style attributes
    "- [x]: javascript:alert(1)\n- click [x] for details", "1. [x]: javascript:alert(1):", "> [x]: http://evil.example/",
    "*a hover*{: onmouseover=alert(1) }", "{: onclick=alert(document.cookie) }", "x{style=position:fixed}",
    r"$\mmlToken{mi}[href='javascript:alert(1)']{m}$", r"$\bbox[border:1px]{x}$", r"$\require{html}$",
    # attack 21: where a renderer starts and ends code is subtle, so code is scanned too; definitions in any container
    "`<b>` in code", "```\n<b>\n```", "~~~\n[x](y)\n~~~", ">[x]: https://e.x/\n\n[x]", "  >  >[x]: https://e.x/\n\n[x]",
    "[x\ny]: https://e.x/\n\n[x y]", "``` a`b\n[x](https://e.x/)\n```", "    ```\n[x](https://e.x/)\n```",
    "\t```\n[x](https://e.x/)\n```",
    # attack 23: email autolinks; a description's \href, which Markdown shows as \href for MathJax to read
    "<1@evil.example>", "<_x@evil.example>", r"\\href as text", markdown_text(r"\(\href{javascript:alert(1)}{x}\)"),
])
def test_live_markup_is_refused(text):
    with pytest.raises(SplitformerError, match="would render"):
        inert(text, "t")


@pytest.mark.parametrize("text", [
    "a < b and c > d", "$a < b$ and [0, 1] (the box)",
    "see http://example.org", r"\<b> and \[x\](y)", r"$\mathcal{R}[u(T)]: $ and attn[ffn]: 0 ≠ 1/2",
    r"$\sum_{k=1}^{N} u_k$", "![Convergence of post-ln: error against Δt](../plots/post_ln_"
    "convergence.png)",
])
def test_inert_text_passes_unchanged(text):
    assert inert(text, "t") == text


@pytest.mark.parametrize("text", ["<img src=x onerror=alert(1)> [click](http://evil.example/) ![i](x.png)",
                                  "```", "[ref]: http://evil.example/",
                                  "post-LN with *a hover*{: onmouseover=alert(document.domain) } on its summary",
                                  "- [x]: javascript:alert(1)"])
def test_escaped_user_text_is_inert(text):
    """Control: what ``markdown_text`` makes of hostile text passes the guard (the guard refuses only what renders)."""
    assert inert(markdown_text(text), "t")


def test_every_committed_report_is_inert():
    """Positive control: every report splitformer writes passes (else ``derive`` would refuse its own output)."""
    reports = sorted((ROOT / "generated" / "reports").glob("*.md"))
    assert len(reports) >= 15
    for report in reports:
        inert(report.read_text(), report.name)


_BYPASS = """
import sys
import splitformer
from splitformer.symbolic import operator_checks
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.plugins import load_plugin

operator_checks._text = lambda *arguments, **options: None  # the check upstream misses the markup
load_plugin(sys.argv[1])
try:
    splitformer.derive(sys.argv[2]).report
except SplitformerError as error:
    print(error)
"""


def _report_bypassing_the_plugin_check(tmp_path, meaning):
    """The report of one ALiBi step, with the plug-in text check off and its meaning replaced by ``meaning`` (the
    shipped one: ``None``), as the process's output."""
    alibi = (ROOT / "tests" / "plugins" / "alibi.py").read_text()
    original = r", plus the head's linear bias in $|p(x) - p(\tilde{x})|$"
    plugin = tmp_path / "alibi_markup.py"
    plugin.write_text(alibi if meaning is None else alibi.replace(original, ", plus " + meaning))
    assert (plugin.read_text() == alibi) == (meaning is None)
    scheme = tmp_path / "s.toml"
    scheme.write_text('name = "s"\nsummary = "ALiBi"\nactivation = "relu"\n[operators]\nnorm1 = "layer-norm"\n'
                      'attn = "alibi-attention"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\non = "norm1"\n')
    return subprocess.run([sys.executable, "-c", _BYPASS, str(plugin), str(scheme)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)


@pytest.mark.parametrize("meaning", ["<img src=x onerror=alert(6)>", "[click](http://evil.example/)"])
def test_a_report_is_refused_when_a_check_upstream_missed_markup(meaning, tmp_path):
    """With the plug-in text check switched off, a definition's meaning holding markup reaches the report renderer,
    which refuses it."""
    refused = _report_bypassing_the_plugin_check(tmp_path, meaning)
    assert refused.returncode == 0 and "the report of 's': would render" in refused.stdout, refused.stderr


def test_the_report_of_the_plugin_as_shipped_renders_with_the_check_off(tmp_path):
    """The control of the test above: the same run with the plug-in as shipped derives its report."""
    shipped = _report_bypassing_the_plugin_check(tmp_path, None)
    assert shipped.returncode == 0 and shipped.stdout == "", shipped.stdout + shipped.stderr


@pytest.mark.parametrize("end", ["\n", "\r", "\r\n"])
def test_a_fence_after_any_line_end_is_escaped(end):
    """Attack 19: CommonMark ends a line at a lone CR too; a description's ``\\r```\\r`` opened a code block that
    swallowed the rest of the report."""
    import re

    shown = markdown_text(f"A description.{end}```{end}The rest of the report.")
    assert not any(line.lstrip(" ").startswith("```") for line in re.split(r"\r\n|\r|\n", shown)), shown


@pytest.mark.parametrize("heading", ["## 7. Generated code", "# Title", "#### x", "Title\n=====", "Title\n---"])
def test_a_heading_in_user_text_is_no_heading_of_the_report(heading):
    """Round 37 F4: a description's ``## 7. …`` line read as a section of the report. Escaped, it renders as a
    paragraph; control: unescaped, it renders as a heading."""
    import markdown

    assert "<h" not in markdown.markdown(markdown_text(f"A description.\n\n{heading}\n\nMore."))
    assert "<h" in markdown.markdown(f"A description.\n\n{heading}\n\nMore.")
    assert markdown_text("- a list item\n- another") == "- a list item\n- another"  # lists stay lists


def test_braces_in_user_text_set_no_attributes():
    """Attack 20: a scheme file's summary ``*a hover*{: onmouseover=…}`` became an ``onmouseover`` attribute under
    Python-Markdown's attr_list (which mkdocs.yml enables). Escaped, it renders as text; control: unescaped, it sets
    the attribute."""
    import markdown

    text = "post-LN with *a hover*{: onmouseover=alert(document.domain) } on its summary"
    shown = markdown.markdown(markdown_text(text), extensions=["attr_list"])
    assert "onmouseover=alert" in shown and 'onmouseover="' not in shown, shown
    assert 'onmouseover="alert(document.domain)"' in markdown.markdown(text, extensions=["attr_list"])


def test_a_parallel_branch_that_is_a_projection_derives_and_its_title_shows_as_text(tmp_path):
    """A fuzzer's finding (s42): a branch of a parallel step that is one projection is titled ``Proj[relu1](u)``,
    which Markdown reads as a link, so the guard refused to write the report of a valid scheme. Substep titles are
    text: escaped, shown as written; control: the title is in the report, and the guard stands."""
    import splitformer
    from splitformer.symbolic import parse_scheme

    scheme = parse_scheme('name = "branch-projection"\nsummary = "s"\n[operators]\nattn = "attention"\n'
                          'relu1 = "nonnegative"\n[[steps]]\nparallel = [[{ operator = "attn", solver = "explicit" }], '
                          '[{ operator = "relu1", solver = "projection" }]]\nweights = ["1/2", "1/2"]\n')
    report = splitformer.derive(scheme).report
    assert "### substep 1: parallel: 1/2·(u + Δt·attn(u)) + 1/2·Proj\\[relu1\\](u)" in report
    with pytest.raises(SplitformerError, match="would render a link"):
        inert(report.replace("Proj\\[relu1\\](u)", "Proj[relu1](u)"), "the report")
