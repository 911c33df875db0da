"""The faster PyTorch spellings of derived statements compute what the formulas say.

A product summed over shared axes (a gain's gradient) as ``torch.sum(a * b, dim)``, ReLU's
adjoint ``θ(s, 0) g`` as ``threshold_backward``, an adjoint product with the other costate
terms as ``addmm``, and the derived backward that skips the input's costate when autograd
does not ask for it: each against an independent computation, with a negative control.
"""

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.backends import BACKENDS
from splitformer.codegen.ir import Contraction, Module, Operand
from splitformer.codegen.printers import TorchPrinter

from conftest import GENERATED, import_path

import reference


def _module(output: str) -> Module:
    return Module("spellings", {}, [], output)


def _run(line: str, **arrays) -> torch.Tensor:
    scope = {"torch": torch, **arrays}
    exec(line, scope)  # noqa: S102 (one emitted statement)
    return scope[line.split(" = ")[0]]


def test_a_product_summed_over_shared_axes_is_mul_and_sum_and_equals_einsum():
    rng = np.random.default_rng(0)
    p, g = (torch.tensor(rng.standard_normal((3, 5, 4))) for _ in range(2))
    for labels, spec in ((("l",), "bil,bil->l"), (("b", "i"), "bil,bil->bi")):
        op = Contraction("out", labels, operands=(Operand("p", ("b", "i", "l")), Operand("g", ("b", "i", "l"))),
                         scale=sp.Rational(1, 2))
        (line,) = BACKENDS["torch"].statements(_module("out"), op)
        assert "einsum" not in line and "torch.sum(p * g" in line
        assert torch.allclose(_run(line, p=p, g=g), torch.einsum(spec, p, g) / 2, rtol=0, atol=1e-14)
    # negative control: operands over different axes stay an einsum (a matrix product)
    op = Contraction("out", ("b", "i", "l"), operands=(Operand("p", ("b", "i", "k")), Operand("w", ("k", "l"))))
    assert "torch.einsum" in BACKENDS["torch"].statements(_module("out"), op)[0]


def test_the_relu_adjoint_is_torchs_threshold_backward_and_equals_the_step_times_the_costate():
    s_, g_ = sp.IndexedBase("s"), sp.IndexedBase("g")
    i, z = sp.symbols("i z")
    printer = TorchPrinter(_module("w_bar"), ("b", "i", "z"))
    text = printer.doprint(sp.Heaviside(s_[i, z], 0) * g_[i, z])
    assert text == "torch.ops.aten.threshold_backward(g, s, 0)"
    s = torch.tensor([[-1.0, 0.0, 2.0, 1e-300, -0.0]], dtype=torch.float64)
    g = torch.tensor([[3.0, 5.0, 7.0, 11.0, 13.0]], dtype=torch.float64)
    assert torch.equal(eval(text, {"torch": torch, "s": s, "g": g}), (s > 0) * g)  # noqa: S307
    # negative controls: a broadcast operand, or another factor, keep the plain product
    assert "threshold_backward" not in printer.doprint(sp.Heaviside(s_[i, z], 0) * g_[i])
    assert "threshold_backward" not in printer.doprint(2 * sp.Heaviside(s_[i, z], 0) * g_[i, z])


@pytest.mark.parametrize("scheme", ["post_ln", "pre_ln"])
def test_the_derived_backward_skips_the_input_costate_only_when_it_is_not_asked_for(scheme):
    torch_module = import_path(GENERATED / "torch" / f"{scheme}.py")
    numpy_module = import_path(GENERATED / "numpy" / f"{scheme}.py")
    rng = np.random.default_rng(1)
    d, n_heads, d_ff = 8, 2, 12
    params = reference.random_params(numpy_module.PARAMETERS, d, d_ff, rng)
    u = torch.tensor(rng.standard_normal((2, 5, d)))
    results = {}
    for backward, needs_input in (("autograd", False), ("derived", False), ("derived", True)):
        block = torch_module.Block(d, n_heads, d_ff, dtype=torch.float64, backward=backward).load_params(params)
        x = u.clone().requires_grad_(needs_input)
        block(x).square().sum().backward()
        results[backward, needs_input] = (x.grad, {name: p.grad for name, p in block.named_parameters()})
    expected = results["autograd", False][1]
    for needs_input in (False, True):
        grad_u, grads = results["derived", needs_input]
        assert (grad_u is None) == (not needs_input)
        for name, value in expected.items():
            scale = value.abs().max() if not name.endswith("b_k") else expected[name[:-3] + "W_k"].abs().max()
            assert float((grads[name] - value).abs().max() / scale) <= 1e-10, name
    # the skipped statements are the input's costate: asked for, it is computed
    out, saved = torch_module._vjp_forward(u, {k: torch.tensor(v) for k, v in params.items()}, None, 1e-5, n_heads)
    seed = torch.ones_like(out)
    p = {k: torch.tensor(v) for k, v in params.items()}
    skipped, _ = torch_module._vjp_backward(saved, seed, p, None, 1e-5, n_heads, need_u=False)
    computed, _ = torch_module._vjp_backward(saved, seed, p, None, 1e-5, n_heads)
    assert skipped is None and computed is not None and computed.shape == u.shape
