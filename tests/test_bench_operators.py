"""The benchmark's profile groups every operator's time into one kind of work."""

from __future__ import annotations

import sys

import pytest

from conftest import GENERATED, ROOT

sys.path.insert(0, str(ROOT / "bench"))

import figure  # noqa: E402
import operators  # noqa: E402
import rows  # noqa: E402


def test_operators_fall_into_their_kind_and_the_rest_into_other():
    assert operators.kind("aten::addmm") == operators.kind("aten::_addmm_activation") == "GEMM (projections, feed-forward)"
    assert operators.kind("aten::native_layer_norm_backward") == "LayerNorm"
    assert operators.kind("aten::view") == operators.OTHER
    totals = operators.by_kind([("aten::mm", 2.0), ("aten::cat", 1.0), ("aten::view", 0.5), ("aten::mm", 1.0)])
    assert totals["GEMM (projections, feed-forward)"] == 3.0 and totals[operators.OTHER] == 0.5
    assert list(totals)[-1] == operators.OTHER and sum(totals.values()) == 4.5


@pytest.mark.parametrize("name", ["post-ln/tiny/torch", "post-ln/tiny/training"])
def test_profile_kinds_add_up_to_the_profiled_time(tmp_path, name):
    for role in figure.ROLES:
        top, kinds = figure.profile(rows.row(name).timed(role, GENERATED, tmp_path).call)
        assert kinds["GEMM (projections, feed-forward)"] > 0 and kinds["LayerNorm"] > 0
        assert sum(kinds.values()) >= sum(row["ms_per_call"] for row in top) * (1 - 1e-9)


def test_the_statement_profile_times_the_generated_forward_and_its_helpers(tmp_path):
    import numpy as np
    import numpy_profile

    numpy_row = rows.row("post-ln/tiny/numpy")
    numpy_row.prepare(tmp_path)
    module = rows.generated(GENERATED, "numpy", "post-ln")
    function = numpy_row.timed("candidate", GENERATED, tmp_path).call
    spent = numpy_profile.line_profile(function, module, calls=2)
    assert {"forward", "_attention", "_exponentials", "_layer_norm"} <= {name for name, _ in spent}
    assert all(seconds >= 0 for seconds in spent.values())
    lines = numpy_profile.profile_lines(function, module, calls=2)
    assert any("_attention(" in line for line in lines) and any("_attention: " in line for line in lines)
    assert "forward, traced (sum of the medians over 2 calls)" in lines[-1]
    # negative control: a function outside the generated module leaves nothing to attribute
    assert numpy_profile.line_profile(lambda: np.ones(3).sum(), module, calls=2) == {}


@pytest.mark.parametrize("name", ["post-ln/tiny/numpy", "unet-level/numpy", "decoding/b1/numpy"])
def test_every_kind_of_numpy_row_profiles_its_statements(tmp_path, name):
    """``--profile`` of a block's, a network's and decoding's NumPy candidate traces the module it runs (decoding runs
    llama's ``forward_stack``; it looked for a module called after the row)."""
    row = rows.row(name, new_tokens=2) if name.startswith("decoding") else rows.row(name)
    row.prepare(tmp_path)
    result = figure.measure(row.name, "candidate", GENERATED, tmp_path, seconds=0.01, min_calls=1,
                            new_tokens=2 if name.startswith("decoding") else None, with_profile=True)
    assert "forward, traced" in result["statements"][-1] and len(result["statements"]) > 3
