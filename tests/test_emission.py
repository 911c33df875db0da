"""Emission: golden files, determinism, imports, input validation of generated modules."""

import ast
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from splitformer.codegen.output import check_replaceable, write_files
from splitformer.codegen.pipeline import generate, generate_network
from splitformer.symbolic import builtin_names, load_scheme
from splitformer.symbolic.builtins import network_names
from splitformer.symbolic.network_spec import load_network

from conftest import GENERATED, ROOT, import_path


#: What ``make generate`` commits: every built-in, plus the ViT block (pre-LN with GELU) and
#: the BERT block (post-LN with GELU).
COMMITTED = [load_scheme(name) for name in builtin_names()] + [
    load_scheme("pre-ln").with_activation("gelu"), load_scheme("post-ln").with_activation("gelu")]


def _expected_files():
    files = {}
    for scheme in COMMITTED:
        files.update(generate(scheme, ("numpy", "torch"), GENERATED))
    for name in network_names():  # the networks too: their tests generate fresh modules, so only this ties the files
        files.update(generate_network(load_network(name), ("numpy", "torch"), GENERATED))
    return files


def test_generated_folder_matches_the_generator(update_golden):
    """Refresh with ``python -m pytest tests/test_emission.py --update-golden`` (or ``make generate``)."""
    expected = _expected_files()
    if update_golden:
        write_files(expected)
    stale = [str(path.relative_to(ROOT)) for path, text in expected.items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"generated/ is out of date: {stale}; run make generate"


def test_committed_plots_are_ones_make_generate_may_replace():
    """``make generate`` (``check --plots generated/plots``) refuses to overwrite a plot without splitformer's mark:
    plots committed before the mark made it fail on a fresh clone. Every plot a committed report shows is there."""
    plots = sorted((GENERATED / "plots").glob("*_convergence.png"))
    assert len(plots) >= len(builtin_names())
    for plot in plots:
        check_replaceable(plot)
    for report in (GENERATED / "reports").glob("*.md"):
        for link in re.findall(r"\]\((\.\./plots/[^)]+)\)", report.read_text(encoding="utf-8")):
            assert (report.parent / link).is_file(), (report.name, link)


def test_output_is_byte_identical_across_hash_seeds(tmp_path):
    outputs = []
    for seed in ("1", "987"):
        folder = tmp_path / seed
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-m", "splitformer.codegen.cli", "derive", "post-ln", "--out", str(folder)],
                       check=True, env=env, capture_output=True, cwd=ROOT)
        outputs.append({path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()})
    assert outputs[0] == outputs[1] and len(outputs[0]) >= 3


@pytest.mark.parametrize("path", sorted(GENERATED.glob("*/*.py")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_code_imports_only_stdlib_and_its_backend(path):
    allowed = set(sys.stdlib_module_names) | {path.parent.name}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {alias.name.split(".")[0] for alias in node.names} <= allowed
        elif isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] in allowed


def test_generated_code_carries_the_formulas_and_a_header():
    text = (GENERATED / "numpy" / "post_ln.py").read_text()
    assert text.startswith('"""post-ln:') and "splitformer derive post-ln" in text
    assert "# Q^attn[i, m, e] = b^Q_attn[m, e] + Σ_k(W^Q_attn[k, m, e]*u^(0)[i, k])" in text
    assert "\\mathrm" not in text and "\\frac" not in text  # comments are plain text, not LaTeX
    assert "--- substep 1: attn, explicit ---" in text


@pytest.fixture
def post_ln():
    return import_path(GENERATED / "numpy" / "post_ln.py"), import_path(GENERATED / "torch" / "post_ln.py")


def _params(d=8, d_ff=12, seed=0):
    rng = np.random.default_rng(seed)
    module = import_path(GENERATED / "numpy" / "post_ln.py")
    sizes = {"d": d, "d_ff": d_ff}
    return {name: rng.standard_normal(tuple(sizes[a] for a in axes)) for name, axes in module.PARAMETERS.items()}


def test_missing_parameter_is_named(post_ln):
    params = _params()
    del params["ffn.b_1"]
    with pytest.raises(ValueError, match=r"missing parameter 'ffn.b_1' of shape \(12,\)"):
        post_ln[0].forward(np.zeros((2, 3, 8)), params)


def test_misshaped_parameter_names_both_shapes(post_ln):
    params = _params()
    params["attn.W_o"] = np.zeros((8, 7))
    with pytest.raises(ValueError, match=r"'attn.W_o' has shape \(8, 7\), expected \(8, 8\)"):
        post_ln[0].forward(np.zeros((2, 3, 8)), params)
    block = post_ln[1].Block(8, 2, 12)
    with pytest.raises(ValueError, match=r"'attn.W_o' has shape \(8, 7\), expected \(8, 8\)"):
        block.load_params(params)


def test_wrong_dtypes_are_rejected(post_ln):
    params = _params()
    with pytest.raises(ValueError, match="u must be float32 or float64"):
        post_ln[0].forward(np.zeros((2, 3, 8), dtype=int), params)
    params["norm1.gain"] = np.array(["a"] * 8)
    with pytest.raises(ValueError, match="'norm1.gain' has dtype"):
        post_ln[0].forward(np.zeros((2, 3, 8)), params)


def test_torch_block_rejects_a_dtype_other_than_its_parameters(post_ln):
    block = post_ln[1].Block(8, 2, 12)
    with pytest.raises(ValueError, match="u has dtype torch.float64, the block's parameters torch.float32"):
        block(torch.zeros(1, 3, 8, dtype=torch.float64))


def test_heads_must_divide_the_width(post_ln):
    with pytest.raises(ValueError, match="d = 8 is not divisible by n_heads = 3"):
        post_ln[0].forward(np.zeros((2, 3, 8)), _params(), n_heads=3)
    with pytest.raises(ValueError, match="d_model = 8 is not divisible by n_heads = 3"):
        post_ln[1].Block(8, 3, 12)


def test_torch_block_has_canonical_state_dict_names_and_bias_switch(post_ln):
    block = post_ln[1].Block(8, 2, 12)
    assert set(block.state_dict()) == set(post_ln[1].PARAMETERS)
    no_bias = post_ln[1].Block(8, 2, 12, bias=False)
    trainable = {name for name, _ in no_bias.named_parameters()}
    assert "attn.b_q" not in trainable and "attn.W_q" in trainable and "norm1.gain" in trainable
    without = {k: v for k, v in _params().items() if post_ln[1]._KINDS[k] != "bias"}
    no_bias.load_params(without)
    assert no_bias(torch.zeros(1, 3, 8)).shape == (1, 3, 8)
    with pytest.raises(ValueError, match="unexpected parameter 'attn.W_x'"):
        block.load_params({"attn.W_x": np.zeros(3)})


def test_comments_are_plain_text_of_the_formulas():
    from splitformer.symbolic.latex import plain_equation
    import sympy as sp
    u, g, beta = sp.IndexedBase("u"), sp.IndexedBase("g"), sp.IndexedBase("beta")
    i, l, k = sp.symbols("i l k")
    names = {"u": "u^{(1)}", "g": r"\overline{\mathrm{LN}^{\mathrm{norm\_2}}}", "beta": r"\hat{\beta}_{1}",
             "N_y": "N_{y}"}
    text = plain_equation(g[i, l], sp.Sum(u[i, k] ** 2, (k, 0, 3)) / sp.sqrt(sp.Symbol("eps") + beta[i]) / sp.pi, names)
    assert text == "L̅N̅^norm_2[i, l] = Σ_k(u^(1)[i, k]**2)/(π*sqrt(ε + β̂_1[i]))"
    assert "\\" not in text and "{" not in text
