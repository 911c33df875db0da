"""RMSNorm and the gated feed-forward, added through the operator API: derivation and parity.

References are written here from the published formulas (``torch.nn.RMSNorm``, the SwiGLU
feed-forward of Shazeer 2020), not from the generator; every parameter is random.
"""

import numpy as np
import pytest
import torch

from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme, parse_scheme
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.kinds import OPERATOR_KINDS

import reference
from conftest import ROOT, import_path

GLU = ROOT / "tests" / "schemes" / "pre-rms-glu.toml"
RMS_ONLY = """
name = "rms-only"
summary = "one RMSNorm projection and its gain"
[operators]
norm = "rms-norm"
[[steps]]
operator = "norm"
solver = "projection"
"""


def _emit(scheme, folder, passes=None):
    write_files(generate(scheme, ("numpy", "torch"), folder, passes))
    name = scheme.module_name
    return import_path(folder / "numpy" / f"{name}.py"), import_path(folder / "torch" / f"{name}.py")


def _rms_norm(x, gain, eps):
    layer = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(gain))
        return layer(torch.tensor(x)).numpy()


def _gated(x, p, prefix="ffn", activation=torch.nn.functional.silu):
    x = torch.tensor(x)
    w = x @ torch.tensor(p[f"{prefix}.W_1"]) + torch.tensor(p.get(f"{prefix}.b_1", 0.0))
    gate = x @ torch.tensor(p[f"{prefix}.W_3"]) + torch.tensor(p.get(f"{prefix}.b_3", 0.0))
    out = (activation(w) * gate) @ torch.tensor(p[f"{prefix}.W_2"]) + torch.tensor(p.get(f"{prefix}.b_2", 0.0))
    return out.numpy()


def _llama_block(x, p, n_heads, eps):
    x = x + reference.attention(_rms_norm(x, p["norm1.gain"], eps), p, n_heads)
    return x + _gated(_rms_norm(x, p["norm2.gain"], eps), p)


def test_kinds_are_registered_by_name():
    assert OPERATOR_KINDS["rms-norm"].is_projection and not OPERATOR_KINDS["gated-feed-forward"].is_projection


def test_rms_norm_is_derived_from_its_sphere():
    formula = OPERATOR_KINDS["rms-norm"].projection().formula
    from splitformer.symbolic.constraints import SYMBOLS
    from splitformer.symbolic.rms_norm import MEAN_SQUARE, RADIUS

    import sympy as sp
    expected = RADIUS * SYMBOLS.v / sp.sqrt(MEAN_SQUARE + SYMBOLS.epsilon)
    assert sp.simplify(formula - expected) == 0


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_matches_torch_in_float64(tmp_path, rng, eps):
    numpy_module, torch_module = _emit(parse_scheme(RMS_ONLY), tmp_path)
    assert set(numpy_module.PARAMETERS) == {"norm.gain"}
    gain = rng.standard_normal(12)
    u = rng.standard_normal((3, 5, 12)) * 3
    expected = _rms_norm(u, gain, eps)
    assert np.abs(numpy_module.forward(u, {"norm.gain": gain}, eps=eps) - expected).max() <= 1e-12
    block = torch_module.Block(12, 1, 4, eps=eps, dtype=torch.float64).load_params({"norm.gain": gain})
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-12


@pytest.mark.parametrize("passes", [None, ()], ids=["all-passes", "no-passes"])
@pytest.mark.parametrize("d, n_heads, d_ff", [(8, 2, 12), (12, 3, 20)])
def test_llama_style_block_float64_parity(tmp_path, rng, passes, d, n_heads, d_ff):
    numpy_module, torch_module = _emit(load_scheme(str(GLU)), tmp_path, passes)
    params = reference.random_params(numpy_module.PARAMETERS, d, d_ff, rng)
    assert all(np.all(value != 0) for value in params.values())
    assert list(numpy_module.PARAMETERS)[-6:] == [f"ffn.{n}" for n in ("W_1", "b_1", "W_3", "b_3", "W_2", "b_2")]
    u = rng.standard_normal((2, 6, d))
    expected = _llama_block(u, params, n_heads, 1e-5)
    assert np.abs(numpy_module.forward(u, params, n_heads=n_heads) - expected).max() <= 1e-10
    block = torch_module.Block(d, n_heads, d_ff, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-10


def test_llama_style_block_float32(tmp_path, rng):
    numpy_module, torch_module = _emit(load_scheme(str(GLU)), tmp_path)
    params = reference.random_params(numpy_module.PARAMETERS, 16, 24, rng)
    u = rng.standard_normal((2, 7, 16))
    expected = _llama_block(u, params, 4, 1e-5)
    params32 = {name: value.astype(np.float32) for name, value in params.items()}
    out = numpy_module.forward(u.astype(np.float32), params32, n_heads=4)
    assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
    block = torch_module.Block(16, 4, 24).load_params(params32)
    assert np.abs(block(torch.tensor(u, dtype=torch.float32)).detach().numpy() - expected).max() <= 1e-4


def test_geglu_activation_option_and_no_biases(tmp_path, rng):
    text = GLU.read_text().replace('ffn = "gated-feed-forward"',
                                   'ffn = { kind = "gated-feed-forward", activation = "gelu", bias = false }')
    numpy_module, torch_module = _emit(parse_scheme(text), tmp_path)
    assert not any(name.startswith("ffn.b") for name in numpy_module.PARAMETERS)
    params = reference.random_params(numpy_module.PARAMETERS, 8, 10, rng)
    u = rng.standard_normal((2, 5, 8))
    x = u + reference.attention(_rms_norm(u, params["norm1.gain"], 1e-5), params, 2)
    expected = x + _gated(_rms_norm(x, params["norm2.gain"], 1e-5), params, activation=torch.nn.functional.gelu)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10
    block = torch_module.Block(8, 2, 10, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-10


def test_zero_biases_and_torch_bias_false(tmp_path, rng):
    numpy_module, torch_module = _emit(load_scheme(str(GLU)), tmp_path)
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    zeroed = {name: (0 * value if "." in name and name.split(".")[1].startswith("b") else value)
              for name, value in params.items()}
    u = rng.standard_normal((1, 4, 8))
    expected = _llama_block(u, zeroed, 2, 1e-5)
    assert np.abs(numpy_module.forward(u, zeroed, n_heads=2) - expected).max() <= 1e-10
    weights = {name: value for name, value in params.items() if not name.split(".")[1].startswith("b")}
    block = torch_module.Block(8, 2, 12, bias=False, dtype=torch.float64).load_params(weights)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-10


def test_stack_of_rms_blocks_ends_with_an_rms_norm(tmp_path, rng):
    numpy_module, _ = _emit(load_scheme(str(GLU)), tmp_path)
    assert set(numpy_module.FINAL_NORM_PARAMETERS) == {"final_norm.gain"}
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    gain = rng.standard_normal(8)
    u = rng.standard_normal((1, 4, 8))
    out = numpy_module.forward_stack(u, [params], n_heads=2, final_norm={"gain": gain})
    assert np.abs(out - _rms_norm(_llama_block(u, params, 2, 1e-5), gain, 1e-5)).max() <= 1e-10


@pytest.mark.parametrize("table, message", [
    ('ffn = { kind = "gated-feed-forward", bias = "no" }', "expected bool"),
    ('ffn = { kind = "gated-feed-forward", width = 3 }', "unknown option"),
    ('ffn = { kind = "gated-feed-forward", activation = "swish" }', "unknown activation"),
    ('ffn = { bias = false }', "missing field 'kind'"),
])
def test_bad_operator_options_are_one_clear_error(table, message):
    text = GLU.read_text().replace('ffn = "gated-feed-forward"', table)
    with pytest.raises(SplitformerError, match=message):
        parse_scheme(text)


def test_rms_norm_checks_hold_and_fail_on_a_wrong_formula():
    import sympy as sp

    from splitformer.codegen.verification.statements.projections import rms_norm_check, set_checks
    from splitformer.symbolic.projections import Projection

    assert rms_norm_check().holds
    without_eps = rms_norm_check(lambda x, g, eps: [v / sp.sqrt(sum(w**2 for w in x) / len(x)) * c for v, c in zip(x, g)])
    assert not without_eps.holds  # negative control: the published formula has ε
    assert all(check.holds for check in set_checks(OPERATOR_KINDS["rms-norm"]))

    class Halved(OPERATOR_KINDS["rms-norm"]):
        @classmethod
        def projection(cls):
            derived = super().projection()
            return Projection(derived.formula / 2, derived.steps, derived.distance, derived.theorem / 2, derived.gap)

    assert not set_checks(Halved)[0].holds  # negative control: off the sphere


def test_bias_free_llama_block(tmp_path, rng):
    """``bias = false`` on attention and the gated feed-forward: no bias parameters at all."""
    text = GLU.read_text().replace('attn = "attention"', 'attn = { kind = "attention", bias = false }').replace(
        'ffn = "gated-feed-forward"', 'ffn = { kind = "gated-feed-forward", bias = false }')
    numpy_module, torch_module = _emit(parse_scheme(text), tmp_path)
    assert not any(name.split(".")[1].startswith("b") for name in numpy_module.PARAMETERS)
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    zero = {f"attn.b_{c}": np.zeros(8) for c in "qkvo"}
    u = rng.standard_normal((2, 5, 8))
    expected = _llama_block(u, {**params, **zero}, 2, 1e-5)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-10


def test_rms_norm_pass_fuses_and_can_be_switched_off(tmp_path):
    from splitformer.codegen.lowering import lower
    from splitformer.codegen.ir import Normalize
    from splitformer.codegen.passes import PASSES
    from splitformer.symbolic.derivation import derive

    program = derive(load_scheme(str(GLU)))
    fused = [op for op in lower(program).ops if isinstance(op, Normalize)]
    assert [(op.gain, op.centred) for op in fused] == [("norm1_gain", False), ("norm2_gain", False)]
    without = tuple(p for name, p in PASSES.items() if name != "rms-norm")
    assert not any(isinstance(op, Normalize) for op in lower(program, without).ops)
    write_files(generate(load_scheme(str(GLU)), ("numpy", "torch"), tmp_path))
    assert "_rms_norm(u0, norm1_gain, eps)" in (tmp_path / "numpy" / "pre_rms_glu.py").read_text()
    assert "_rms_norm(u0, norm1_gain, eps)" in (tmp_path / "torch" / "pre_rms_glu.py").read_text()
