"""GELU's tanh approximation recognized as one call (``gelu-tanh`` pass): NumPy's in-place ``_gelu_tanh``,
torch's ``gelu(approximate="tanh")``."""

import math

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.ir import Elementwise, TanhGelu
from splitformer.codegen.lowering import lower
from splitformer.codegen.output import write_files
from splitformer.codegen.passes import PASSES, gelu_tanh
from splitformer.codegen.passes.gelu_tanh import _argument
from splitformer.codegen.pipeline import generate
from splitformer.codegen.printers import NumpyPrinter, TorchPrinter
from splitformer.symbolic import derive, load_scheme

from conftest import GENERATED, import_path

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "gelu-tanh")


@pytest.fixture(scope="module")
def gpt2():
    scheme = load_scheme("gpt2")
    return scheme, derive(scheme)


def _activation(module):
    (op,) = [op for op in module.ops if op.out == "ffn_s"]
    return op


def test_gpt2s_activation_becomes_one_call_and_only_with_the_pass(gpt2):
    _, program = gpt2
    passed, without = _activation(lower(program)), _activation(lower(program, WITHOUT))
    (x,) = without.expr.atoms(sp.Indexed)
    assert isinstance(passed, Elementwise) and passed.expr == TanhGelu(x)
    assert without.expr.has(sp.tanh) and not without.expr.has(TanhGelu)  # without the pass: the formula as derived
    assert sp.expand(passed.expr.replace(TanhGelu, TanhGelu.formula) - without.expr) == 0
    assert _activation(gelu_tanh(lower(program, WITHOUT))).expr == TanhGelu(x)
    module = lower(program)
    assert NumpyPrinter(module, passed.labels).doprint(passed.expr) == "_gelu_tanh(ffn_w)"
    assert TorchPrinter(module, passed.labels).doprint(passed.expr) == 'torch.nn.functional.gelu(ffn_w, approximate="tanh")'
    # a user's function of the same name is no GELU: it has no spelling
    with pytest.raises(AssertionError, match="no np spelling for TanhGelu"):
        NumpyPrinter(module, passed.labels).doprint(sp.Function("TanhGelu")(x))


def test_other_forms_are_left_as_derived():
    """Controls: the exact GELU (post-ln's gelu), another cubic coefficient, a missing half, two arrays."""
    program = derive(load_scheme("post-ln").with_activation("gelu"))
    assert not any(op.expr.has(TanhGelu) for op in lower(program).ops if isinstance(op, Elementwise))
    x, y = sp.IndexedBase("w")[sp.Idx("i")], sp.IndexedBase("v")[sp.Idx("i")]
    root = sp.sqrt(2 / sp.pi)
    assert _argument(x * (1 + sp.tanh(root * (x + sp.Rational(447, 10**4) * x**3))) / 2) is None
    assert _argument(x * (1 + sp.tanh(root * (x + sp.Rational(44715, 10**6) * x**3)))) is None
    assert _argument(y * (1 + sp.tanh(root * (x + sp.Rational(44715, 10**6) * x**3))) / 2) is None
    assert _argument(x * (1 + sp.tanh(root * (x + sp.Rational(44715, 10**6) * x**3))) / 2) == x


def test_parity_with_passes_none_and_what_the_golden_emits(gpt2, tmp_path, rng):
    scheme, program = gpt2
    write_files(generate(scheme, ("numpy", "torch"), tmp_path, passes=(), program=program))
    write_files(generate(scheme, ("numpy",), tmp_path / "without", passes=WITHOUT, program=program))
    assert "    ffn_s = _gelu_tanh(ffn_w, out=ffn_w)\n" in (GENERATED / "numpy" / "gpt2.py").read_text()
    assert "    ffn_s = _gelu_tanh(ffn_w)\n" in (GENERATED / "numpy" / "gpt2.py").read_text()  # vjp: reads ffn_w later
    assert 'torch.nn.functional.gelu(ffn_w, approximate="tanh")' in (GENERATED / "torch" / "gpt2.py").read_text()
    assert "_gelu_tanh(" not in (tmp_path / "numpy" / "gpt2.py").read_text()
    assert "_gelu_tanh(" not in (tmp_path / "without" / "numpy" / "gpt2.py").read_text()
    numpy_passed = import_path(GENERATED / "numpy" / "gpt2.py")
    numpy_plain = import_path(tmp_path / "numpy" / "gpt2.py")
    numpy_without = import_path(tmp_path / "without" / "numpy" / "gpt2.py")
    d, heads, d_ff = 16, 4, 40
    params = {name: rng.standard_normal(tuple({"d": d, "d_ff": d_ff}[axis] for axis in axes)) * 0.5
              for name, axes in numpy_passed.PARAMETERS.items()}
    u = rng.standard_normal((3, 7, d)) * 4  # arguments where tanh saturates and where it does not
    expected = numpy_plain.forward(u, params, n_heads=heads)
    assert np.abs(numpy_passed.forward(u, params, n_heads=heads) - expected).max() <= 1e-12
    assert np.abs(numpy_without.forward(u, params, n_heads=heads) - expected).max() <= 1e-12
    typed = {name: value.astype(np.float32) for name, value in params.items()}
    assert np.abs(numpy_passed.forward(u.astype(np.float32), typed, n_heads=heads)
                  - numpy_without.forward(u.astype(np.float32), typed, n_heads=heads)).max() <= 1e-5
    torch_passed = import_path(GENERATED / "torch" / "gpt2.py")
    block = torch_passed.Block(d, heads, d_ff, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected).max() <= 1e-12
    # the helper over more elements than one block, against the formula in plain NumPy
    w = rng.standard_normal(40_000) * 4
    formula = w * (1 + np.tanh(math.sqrt(2 / math.pi) * (w + 0.044715 * w**3))) / 2
    assert np.abs(numpy_passed._gelu_tanh(w) - formula).max() <= 1e-14
    # negative control: the exact GELU is off by more than the tolerance
    assert np.abs(numpy_passed._gelu_tanh(w) - import_path(GENERATED / "numpy" / "post_ln_gelu.py")._gelu(w)).max() > 1e-5
