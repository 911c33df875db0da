"""The benchmark harness times what it claims: reference and candidate compute the same block."""

from __future__ import annotations

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
