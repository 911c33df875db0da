"""The ``gelu-adjoint`` pass: the derived costate of a GELU's pre-activation, ``λ`` times the GELU's derivative as SymPy
wrote it (GPT-2's tanh approximation: 28 torch kernels), becomes ``TanhGeluBackward(λ, w)`` or
``ExactGeluBackward(λ, w)``: torch's ``gelu_backward``, NumPy the runtime's ``_gelu_backward`` (its signature).

The references are transformers' ``GPT2Block`` (its ``gelu_new`` is the formula in torch operations, which autograd
differentiates operation by operation) and central differences of the GELUs written here; the controls are
statements that are no GELU's adjoint (left alone), the module derived without the pass, and the tanh backward
spelled as the exact one, which the parity check against ``GPT2Block`` rejects."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import sympy as sp
import torch

import splitformer
from splitformer.codegen.adapters.hf_gpt2 import gpt2_block_config, gpt2_block_params
from splitformer.codegen.adjoint import lower_adjoint
from splitformer.codegen.ir import Elementwise, ExactGeluBackward, TanhGeluBackward
from splitformer.codegen.passes import PASSES
from splitformer.codegen.passes.activation_adjoint import costate_of
from splitformer.codegen.passes.gelu_adjoint import EXACT_GELU, TANH_GELU
from splitformer.codegen.printers import NumpyPrinter, TorchPrinter
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.adjoint import derive_adjoint

from test_adjoint import _assert_close
from test_adjoint_llm import _derived, _gradients
from test_gpt2 import gpt2_config, hf_mask, random_block

_WITHOUT_PASS = ",".join(name for name in PASSES if name != "gelu-adjoint")


def _costate_statement(scheme):
    backward = lower_adjoint(derive_adjoint(derive(scheme)))
    (op,) = [op for op in backward.adjoint.ops if op.out == "ffn_w_bar"]
    return backward, op


@pytest.mark.parametrize("name, call", [("gpt2", TanhGeluBackward), ("post-ln gelu", ExactGeluBackward),
                                        ("pre-ln gelu", ExactGeluBackward)])
def test_the_gelu_costate_is_one_backward_call(name, call):
    scheme = load_scheme(name.split()[0])
    scheme = scheme.with_activation("gelu") if name.endswith("gelu") else scheme
    backward, op = _costate_statement(scheme)
    w, bar = (sp.IndexedBase(array)[op.expr.args[1].indices] for array in ("ffn_w", "ffn_s_bar"))
    assert op.expr == call(bar, w)
    adjoint = [op for op in backward.adjoint.ops if isinstance(op, Elementwise)]
    assert not any(op.expr.has(sp.tanh) or op.expr.has(sp.erf) for op in adjoint)
    option = ', approximate="tanh"' if call is TanhGeluBackward else ""
    assert (TorchPrinter(backward.adjoint, op.labels).doprint(op.expr)
            == f"torch.ops.aten.gelu_backward(ffn_s_bar, ffn_w{option})")


def test_without_the_pass_the_costate_is_the_formula_as_derived():
    source = splitformer.derive("gpt2", passes=_WITHOUT_PASS).source("torch")
    assert "gelu_backward" not in source and "torch.tanh(" in source
    assert "torch.ops.aten.gelu_backward(ffn_s_bar, ffn_w, approximate=\"tanh\")" in splitformer.derive("gpt2").source("torch")
    assert "ffn_w_bar = torch.ops.aten.gelu_backward(ffn_s_bar, ffn_w)" in splitformer.derive("vit").source("torch")


@pytest.mark.parametrize("activation", [EXACT_GELU, TANH_GELU], ids=["exact", "tanh"])
def test_only_a_costate_times_the_gelus_derivative_is_recognized(activation):
    x, lam, y = (sp.IndexedBase(name)[sp.Idx("i")] for name in ("x", "lam", "y"))
    derivative = sp.diff(activation.call.formula(x), x)
    other = TANH_GELU if activation is EXACT_GELU else EXACT_GELU
    assert costate_of(lam * y * derivative, x, {}, activation) == lam * y
    assert costate_of(lam * activation.call.formula(x), x, {}, activation) is None  # the GELU itself
    assert costate_of(lam * derivative + y, x, {}, activation) is None  # plus a term free of the GELU
    assert costate_of(lam * sp.diff(other.call.formula(x), x), x, {}, activation) is None  # the other GELU's derivative
    assert costate_of(lam * derivative.subs(x, 2 * x), x, {}, activation) is None  # at another point
    assert costate_of(2 * derivative, x, {}, activation) is None  # a costate of numbers alone: left as derived
    assert costate_of(sp.exp(y) * derivative, x, {}, activation) is None  # a costate with a function application
    # a kept forward value s = Gelu(x) read at x's indices is written out
    s = sp.IndexedBase("s")[sp.Idx("i")]
    formulas = {"s": (("i",), activation.call(x))}
    assert costate_of(lam * (derivative + s - activation.call.formula(x)), x, formulas, activation) == lam


def _exact(v):
    return v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))) / 2


def _tanh(v):
    return v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) / 2


@pytest.mark.parametrize("call, gelu", [(ExactGeluBackward, _exact), (TanhGeluBackward, _tanh)], ids=["exact", "tanh"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_spells_the_runtimes_gelu_backward_the_derivative_of_the_gelu(call, gelu, dtype):
    """NumPy's spelling (the runtime's ``_gelu_backward``, torch's signature) against central differences of the GELU
    written here (float64) and torch's ``gelu_backward`` (float32); a costate of fewer axes (a bias row) is broadcast.
    Control: the other GELU's derivative is farther off than the tolerance."""
    from splitformer.runtime.numpy_helpers import _gelu_backward

    backward, op = _costate_statement(load_scheme("gpt2"))
    w, bar = op.expr.args[1], op.expr.args[0]
    code = NumpyPrinter(backward.adjoint, op.labels).doprint(call(bar, w))
    option = ', approximate="tanh"' if call is TanhGeluBackward else ""
    assert code == f"_gelu_backward(ffn_s_bar, ffn_w{option})"
    x = np.linspace(-9, 9, 7 * 14045).reshape(-1, 7)  # 3 of the routine's blocks and a short one
    costate = np.cos(3 * x[0])
    values = {"ffn_w": x.astype(dtype), "ffn_s_bar": costate.astype(dtype)}
    value = eval(code, {"_gelu_backward": _gelu_backward, **values})
    other = eval(code.replace(option, "") if option else code[:-1] + ', approximate="tanh")',
                 {"_gelu_backward": _gelu_backward, **values})
    assert value.dtype == dtype and value.shape == x.shape
    if dtype == np.float64:
        step = 1e-6
        expected = costate * (gelu(x + step) - gelu(x - step)) / (2 * step)
        tolerance = 1e-8
    else:
        approximate = "tanh" if option else "none"
        expected = torch.ops.aten.gelu_backward(torch.from_numpy(values["ffn_s_bar"]).expand(x.shape).contiguous(),
                                                torch.from_numpy(values["ffn_w"]), approximate=approximate).numpy()
        tolerance = 2e-6
    assert np.abs(value - expected).max() <= tolerance < np.abs(other - expected).max()


def _gpt2_derived_against_gpt2_block(torch_module):
    """The largest relative gap of the gradients of a derived-backward gpt2 Block of ``torch_module`` from
    ``GPT2Block``'s autograd gradients (float64, random parameters, causal)."""
    rng = np.random.default_rng(4)
    block = random_block(gpt2_config(12, 3, 7, 1e-3), seed=2)
    params, options = gpt2_block_params(block), gpt2_block_config(block)
    u, grad_out = rng.standard_normal((2, 5, 12)) * 2, rng.standard_normal((2, 5, 12))
    x = torch.tensor(u, requires_grad=True)
    block(x, attention_mask=hf_mask(2, 5)).backward(torch.tensor(grad_out))
    expected = _gradients(block, gpt2_block_params)
    derived = torch_module.Block(12, 3, 7, eps=options["eps"], dtype=torch.float64, backward="derived")
    (grad_u,), grads = _derived(torch_module, derived, params, (u,), {}, grad_out)
    return grad_u, grads, x.grad.numpy(), expected


def test_gpt2s_derived_backward_equals_gpt2_blocks_autograd_and_the_exact_spelling_does_not():
    source = splitformer.derive("gpt2").source("torch")
    module = types.ModuleType("gpt2_with_gelu_backward")
    exec(compile(source, "gpt2_torch", "exec"), module.__dict__)
    _assert_close(*_gpt2_derived_against_gpt2_block(module), 1e-10)
    # control: the tanh backward spelled as the exact GELU's is a different derivative, and the check sees it
    mutated = source.replace('gelu_backward(ffn_s_bar, ffn_w, approximate="tanh")', "gelu_backward(ffn_s_bar, ffn_w)")
    assert mutated != source
    control = types.ModuleType("gpt2_exact_backward")
    exec(compile(mutated, "gpt2_torch_mutated", "exec"), control.__dict__)
    with pytest.raises(AssertionError):
        _assert_close(*_gpt2_derived_against_gpt2_block(control), 1e-6)


def test_printers_refuse_a_users_function_of_the_same_name():
    backward, op = _costate_statement(load_scheme("gpt2"))
    w, bar = op.expr.args[1], op.expr.args[0]
    for printer in (NumpyPrinter, TorchPrinter):
        with pytest.raises(AssertionError, match="spelling for TanhGeluBackward"):
            printer(backward.adjoint, op.labels).doprint(sp.Function("TanhGeluBackward")(bar, w))


def test_a_networks_derived_backward_recomputes_the_gelu_as_one_call_and_runs_its_backward():
    """CvT's derived backward (a network program's): the forward statement it recomputes and the costate, in both
    backends, only with the passes (``NETWORK_ADJOINT_STAGE``); parity is tests/test_cvt_adjoint.py's."""
    passed = splitformer.derive("cvt")
    without = splitformer.derive("cvt", passes=",".join(name for name in PASSES if name not in ("gelu", "gelu-adjoint")))
    assert passed.source("torch").count("ffn_w_bar = torch.ops.aten.gelu_backward(ffn_s_bar, ffn_w)") == 2
    assert passed.source("numpy").count("ffn_s = _gelu(ffn_w)") == 2  # the run program's is in place: _gelu(…, out=…)
    assert "gelu_backward" not in without.source("torch") and "ffn_s = _gelu(ffn_w)" not in without.source("numpy")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_broadcasts_a_costate_of_another_shape(dtype):
    """A costate read over fewer axes than ``x`` (a bias row): torch's ``gelu_backward`` takes operands of one shape
    (float32 fails on others), so they are broadcast first; a costate read where ``x`` is needs nothing."""
    i, z = sp.Idx("i"), sp.Idx("z")
    w, bar, row = sp.IndexedBase("ffn_w")[i, z], sp.IndexedBase("ffn_s_bar")[i, z], sp.IndexedBase("ffn_b_1")[z]
    backward, op = _costate_statement(load_scheme("gpt2"))
    printer = TorchPrinter(backward.adjoint, ("b", "i", "z"))
    assert printer.doprint(TanhGeluBackward(bar, w)) == 'torch.ops.aten.gelu_backward(ffn_s_bar, ffn_w, approximate="tanh")'
    code = printer.doprint(TanhGeluBackward(row, w))
    assert code.startswith("torch.ops.aten.gelu_backward(*torch.broadcast_tensors(ffn_b_1")
    values = {"ffn_w": torch.randn(2, 3, 4, dtype=dtype), "ffn_b_1": torch.randn(4, dtype=dtype)}
    value = eval(code, {"torch": torch, **values})
    expected = torch.ops.aten.gelu_backward(values["ffn_b_1"].expand(2, 3, 4).contiguous(), values["ffn_w"],
                                            approximate="tanh")
    assert value.shape == (2, 3, 4)
    torch.testing.assert_close(value, expected)
