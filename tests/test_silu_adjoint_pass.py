"""The ``silu-adjoint`` pass: llama's derived costate of the gate pre-activation, ``(w̃/(1 + e^{−w}) + e^{−w} s/(1 +
e^{−w})) s̄``, becomes ``SiluBackward(w̃ s̄, w)`` (torch ``silu_backward``, NumPy ``_silu_backward``).

The references are torch's autograd through ``w̃ · silu(w)`` and the SiLU's derivative written here; the controls are
a statement that is not a SiLU's adjoint (left alone) and the module derived without the pass (the formula as
derived, its quotients by ``1 + e^{−w}`` logistic functions: finite too where ``e^{−w}`` overflows)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

import splitformer
from splitformer.codegen.adjoint import lower_adjoint
from splitformer.codegen.ir import Elementwise, Silu, SiluBackward
from splitformer.codegen.passes import PASSES
from splitformer.codegen.passes.activation_adjoint import costate_of as recognized_costate
from splitformer.codegen.passes.silu_adjoint import SILU
from splitformer.runtime.numpy_helpers import _silu_backward
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint

_WITHOUT_PASS = ",".join(name for name in PASSES if name != "silu-adjoint")


def test_llamas_gate_costate_is_one_silu_backward():
    backward = lower_adjoint(derive_adjoint(derive(load_scheme("llama"))))
    (op,) = [op for op in backward.adjoint.ops if op.out == "ffn_w_bar"]
    w, gate, bar = (sp.IndexedBase(name)[op.expr.args[1].indices] for name in ("ffn_w", "ffn_gate", "ffn_s_bar"))
    assert op.expr == SiluBackward(gate * bar, w)
    assert not any(isinstance(op, Elementwise) and op.expr.has(sp.exp) for op in backward.adjoint.ops)


def costate_of(expr, x, formulas):
    return recognized_costate(expr, x, formulas, SILU)


def test_a_statement_that_is_no_silu_adjoint_is_left_alone():
    x, lam, y = (sp.IndexedBase(name)[sp.Idx("i")] for name in ("x", "lam", "y"))
    sigma = 1 / (1 + sp.exp(-x))
    assert costate_of(lam * sigma, x, {}) is None  # a sigmoid gate, not the SiLU's derivative
    assert costate_of(lam * x * sigma, x, {}) is None  # the SiLU itself
    assert costate_of(lam * (sigma + x * sp.exp(-x) * sigma**2) + y, x, {}) is None  # plus a term free of the SiLU
    assert costate_of(lam * (sigma + x * sp.exp(-x) * sigma**2), x, {}) == lam
    # the kept forward value s = y Silu(x) written out, as in llama's adjoint, at the indices it is read
    i, j = sp.Idx("i"), sp.Idx("j")
    s = sp.IndexedBase("s")
    formulas = {"s": (("i",), y * Silu(x))}
    assert costate_of((y * sigma + sp.exp(-x) * s[i] * sigma) * lam, x, formulas) == lam * y
    at_j = {item: item.base[j] for item in (x, y, lam)}
    x_j, y_j, lam_j = (at_j[item] for item in (x, y, lam))
    sigma_j = 1 / (1 + sp.exp(-x_j))
    assert costate_of((y_j * sigma_j + sp.exp(-x_j) * s[j] * sigma_j) * lam_j, x_j, formulas) == lam_j * y_j
    # control: s read at other indices than x is not written out (it is another entry of s)
    assert costate_of((y_j * sigma_j + sp.exp(-x_j) * s[i] * sigma_j) * lam_j, x_j, formulas) is None


def test_numpy_silu_backward_is_the_derivative_of_the_silu():
    x = np.linspace(-30, 30, 3 * 2**15 + 601)  # several of the routine's blocks, the last one short
    costate = np.cos(x)
    sigma = 1 / (1 + np.exp(-x))
    expected = costate * (sigma + x * sigma * (1 - sigma))  # d/dx (x σ) = σ + x σ'
    assert np.abs(_silu_backward(costate, x) - expected).max() <= 1e-14
    step = 1e-6
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    assert np.abs(_silu_backward(costate, x) - costate * (silu(x + step) - silu(x - step)) / (2 * step)).max() <= 1e-7
    with np.errstate(over="ignore"):
        assert np.array_equal(_silu_backward(np.ones(2, np.float32), np.float32([-100, -1e4])), [0, 0])
    # float32 as torch's silu_backward, a costate row broadcast over x's rows, a Python number taking x's type
    rows = x[:7 * 2**13].reshape(-1, 7).astype(np.float32)
    expected = torch.ops.aten.silu_backward(torch.from_numpy(costate[:7].astype(np.float32)).expand(rows.shape).contiguous(),
                                            torch.from_numpy(rows)).numpy()
    value = _silu_backward(costate[:7].astype(np.float32), rows)
    assert value.dtype == np.float32 and np.abs(value - expected).max() <= 1e-6
    assert _silu_backward(2.0, np.float32([1.5])).dtype == np.float32


def _gradients(module, weights_scale: float):
    """Input and parameter gradients of a float32 llama block (derived backward) against autograd's, with the gate's
    weights scaled by ``weights_scale`` (large: pre-activations far below −88.7)."""
    results = {}
    for backward in ("autograd", "derived"):
        torch.manual_seed(0)
        block = module.Block(16, 4, 24, n_kv_heads=2, bias=False, backward=backward)
        with torch.no_grad():
            for name, parameter in block.named_parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
            block.ffn.W_1.mul_(weights_scale)
        x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
        block(x).square().sum().backward()
        results[backward] = [x.grad] + [parameter.grad for parameter in block.parameters()]
    return results


@pytest.mark.parametrize("scale", [1.0, 400.0], ids=["moderate", "overflowing-exp"])
def test_torch_derived_backward_equals_autograd(scale):
    results = _gradients(splitformer.derive("llama").torch_module(), scale)
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert torch.isfinite(derived).all()
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-4


def test_control_without_the_pass_the_formula_as_derived_is_finite_too():
    """Without the pass the statement is the derived formula, with its quotients by ``1 + e^{−w}`` as logistic
    functions (``codegen.logistic``, never switched off): no ``silu_backward``, and finite where ``e^{−w}`` overflows
    (before that rewrite it was NaN there, and the pass was the only cure)."""
    derivation = splitformer.derive("llama", passes=_WITHOUT_PASS)
    assert "silu_backward" not in derivation.source("torch") and "torch.sigmoid(" in derivation.source("torch")
    results = _gradients(derivation.torch_module(), 400.0)
    for derived, expected in zip(results["derived"], results["autograd"]):
        assert torch.isfinite(derived).all()
        assert float((derived - expected).abs().max() / expected.abs().max()) <= 1e-4
