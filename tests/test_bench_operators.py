"""The benchmark's profile groups every operator's time into one kind of work."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import figure  # noqa: E402
import operators  # noqa: E402
from splitformer.codegen.output import write_files  # noqa: E402
from splitformer.codegen.pipeline import generate  # noqa: E402
from splitformer.symbolic import load_scheme  # noqa: E402


def test_operators_fall_into_their_kind_and_the_rest_into_other():
    assert operators.kind("aten::addmm") == operators.kind("aten::_addmm_activation") == "GEMM (projections, feed-forward)"
    assert operators.kind("aten::native_layer_norm_backward") == "LayerNorm"
    assert operators.kind("aten::view") == operators.OTHER
    totals = operators.by_kind([("aten::mm", 2.0), ("aten::cat", 1.0), ("aten::view", 0.5), ("aten::mm", 1.0)])
    assert totals["GEMM (projections, feed-forward)"] == 3.0 and totals[operators.OTHER] == 0.5
    assert list(totals)[-1] == operators.OTHER and sum(totals.values()) == 4.5


@pytest.mark.parametrize("name", ["torch-inference", "torch-training"])
def test_profile_kinds_add_up_to_the_profiled_time(tmp_path, name):
    write_files(generate(load_scheme("post-ln"), ("torch",), tmp_path))
    figure.write_inputs("tiny", tmp_path)
    for role in figure.ROLES:
        top, kinds = figure.profile(figure.build(name, role, "tiny", tmp_path))
        assert kinds["GEMM (projections, feed-forward)"] > 0 and kinds["LayerNorm"] > 0
        assert sum(kinds.values()) >= sum(row["ms_per_call"] for row in top) * (1 - 1e-9)
