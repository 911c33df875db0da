"""The one network report: renderable math, each kind's discretization once, references that land."""

from __future__ import annotations

import re

import pytest

from conftest import derived_now
from latex_sanity import assert_renderable_math

NETWORKS = ("vit", "cvt", "resnet-block", "unet-level")


def _math(report: str) -> list[str]:
    display = re.findall(r"\$\$\n(.*?)\n\$\$", report, re.S)
    inline = re.findall(r"(?<!\$)\$([^$\n]+)\$(?!\$)", re.sub(r"\$\$\n.*?\n\$\$", "", report, flags=re.S))
    return display + inline


@pytest.mark.parametrize("name", NETWORKS)
def test_the_report_math_renders_and_no_inline_math_spans_lines(name):
    report = derived_now(name).report
    assert_renderable_math(_math(report))
    prose = re.sub(r"\$\$\n.*?\n\$\$", "", report, flags=re.S)
    assert all(line.count("$") % 2 == 0 for line in prose.splitlines()), "inline math broken over a line"


@pytest.mark.parametrize("name", NETWORKS)
def test_report_section_references_of_the_emitted_code_land_on_the_adjoint(name):
    network = derived_now(name)
    titles = dict(re.findall(r"^## (\d+)\. (.*)$", network.report, re.M))
    cited = {number for backend in ("numpy", "torch") for number in re.findall(r"report §(\d+)", network.source(backend))}
    assert all(titles[number].startswith("Training as optimal control") for number in cited), (cited, titles)
    assert cited or name not in ("vit", "cvt")


def test_an_operator_kind_is_explained_once_and_a_repeated_definition_points_back():
    report = derived_now("cvt").report
    assert report.count("BatchNorm in inference mode is not a projection") == 1
    assert report.count(r"a(y) = \frac{\gamma(y)}{\sqrt{\varepsilon + v(y)}}") == 1  # qbn's, not kbn's, vbn's
    assert "(as in `qbn`)" in report and "{a^{\\mathrm{vbn}}}_{l}" in report  # every discrete formula stays
    assert "Softmax" in report and "The score scale" in report
