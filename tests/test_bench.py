"""The benchmark harness times what it claims: reference and candidate compute the same block."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import figure  # noqa: E402
from splitformer.codegen.output import write_files  # noqa: E402
from splitformer.codegen.pipeline import generate  # noqa: E402
from splitformer.symbolic import load_scheme  # noqa: E402


def test_reference_and_candidates_agree_on_the_stored_inputs(tmp_path):
    write_files(generate(load_scheme("post-ln"), ("numpy", "torch"), tmp_path))
    figure.write_inputs("tiny", tmp_path)
    _, _, d, heads, d_ff = figure.SHAPES["tiny"]
    with np.load(tmp_path / "tiny.npz") as stored:
        params = {name: stored[name] for name in stored.files if name != "u"}
        u = stored["u"]
    reference = figure._reference_layer(params, d, heads, d_ff).eval()
    with torch.inference_mode():
        expected = reference(torch.from_numpy(u)).numpy()
    block = figure._module(tmp_path, "torch").Block(d, heads, d_ff).load_params(params).eval()
    with torch.inference_mode():
        np.testing.assert_allclose(block(torch.from_numpy(u)).numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(figure._module(tmp_path, "numpy").forward(u, params, n_heads=heads), expected, atol=1e-5)
    for name in figure.FIGURES:
        for role in figure.ROLES:
            times = figure.sustained(figure.build(name, role, "tiny", tmp_path), 0.01)
            assert len(times) >= 5 and min(times) > 0


def test_the_statement_profile_times_the_generated_forward_and_its_helpers(tmp_path):
    import numpy_profile

    write_files(generate(load_scheme("post-ln"), ("numpy",), tmp_path))
    figure.write_inputs("tiny", tmp_path)
    module = figure._module(tmp_path, "numpy")
    function = figure.build("numpy-forward", "candidate", "tiny", tmp_path)
    spent = numpy_profile.line_profile(function, module, calls=2)
    assert {"forward", "_attention", "_exponentials", "_layer_norm"} <= {name for name, _ in spent}
    assert all(seconds >= 0 for seconds in spent.values())
    lines = numpy_profile.profile_lines(function, module, calls=2)
    assert any("_attention(" in line for line in lines) and any("_attention: " in line for line in lines)
    assert "forward, traced (sum of the medians over 2 calls)" in lines[-1]
    # negative control: a function outside the generated module leaves nothing to attribute
    assert numpy_profile.line_profile(lambda: np.ones(3).sum(), module, calls=2) == {}


def test_a_figure_counts_the_page_faults_of_its_calls_and_the_line_prints_them(tmp_path, capsys):
    import benchmark

    write_files(generate(load_scheme("post-ln"), ("torch",), tmp_path))
    figure.write_inputs("tiny", tmp_path)
    figure.main(["torch-inference", "candidate", "tiny", "--modules", str(tmp_path), "--seconds", "0.01",
                 "--threads", "1"])
    result = json.loads(capsys.readouterr().out)
    assert result["page_faults_per_call"] >= 0
    reference = {"median_s": 2.0, "page_faults_per_call": 0.0}
    candidate = {"median_s": 1.0, "page_faults_per_call": 4576.0, "gflops": 10.0}
    line = benchmark.figure_line("torch-inference", "N128", [0.5, 0.5], reference, candidate, {"torch": 20.0})
    assert "page faults per call: ref 0, gen 4576" in line and "(target <= 1.00, ok)" in line
