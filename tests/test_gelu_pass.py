"""The exact GELU recognized as one call (``gelu`` pass): NumPy's in-place ``_gelu``, torch's ``gelu``."""

import numpy as np
import pytest
import sympy as sp
import torch

from splitformer.codegen.ir import Elementwise, ExactGelu as GELU
from splitformer.codegen.lowering import lower
from splitformer.codegen.output import write_files
from splitformer.codegen.passes import PASSES, gelu
from splitformer.codegen.passes.gelu import _argument
from splitformer.codegen.pipeline import generate
from splitformer.codegen.printers import NumpyPrinter
from splitformer.symbolic import derive, load_scheme

from conftest import GENERATED, import_path

WITHOUT_GELU = tuple(rewrite for name, rewrite in PASSES.items() if name != "gelu")


@pytest.fixture(scope="module")
def post_ln_gelu():
    scheme = load_scheme("post-ln").with_activation("gelu")
    return scheme, derive(scheme)


def _activation(module):
    (op,) = [op for op in module.ops if op.out == "ffn_s"]
    return op


def test_the_erf_gelu_becomes_one_call_and_only_with_the_pass(post_ln_gelu):
    _, program = post_ln_gelu
    passed, without = _activation(lower(program)), _activation(lower(program, WITHOUT_GELU))
    (x,) = without.expr.atoms(sp.Indexed)
    assert isinstance(passed, Elementwise) and passed.expr == GELU(x)
    assert without.expr.has(sp.erf) and not without.expr.has(GELU)  # without the pass: the formula as derived
    assert sp.expand(passed.expr.replace(GELU, lambda v: v * (1 + sp.erf(v / sp.sqrt(2))) / 2) - without.expr) == 0
    assert _activation(gelu(lower(program, WITHOUT_GELU))).expr == GELU(x)
    module = lower(program)
    assert NumpyPrinter(module, passed.labels).doprint(passed.expr) == "_gelu(ffn_w)"
    # a user's function of the same name is no GELU: it has no spelling, as before the pass
    with pytest.raises(AssertionError, match="no np spelling for ExactGelu"):
        NumpyPrinter(module, passed.labels).doprint(sp.Function("ExactGelu")(x))


def test_other_activations_are_left_as_derived():
    """Controls: the tanh approximation (gpt2's gelu_new) and an erf form that is no GELU stay."""
    program = derive(load_scheme("gpt2"))
    assert not any(op.expr.has(GELU) for op in lower(program).ops if isinstance(op, Elementwise))
    x = sp.IndexedBase("w")[sp.Idx("i")]
    assert _argument(x * (1 + sp.erf(x / 2)) / 2) is None and _argument(x * (1 + sp.erf(x / sp.sqrt(2)))) is None
    assert _argument(x * (1 + sp.erf(x / sp.sqrt(2))) / 2) == x


def test_parity_with_passes_none_and_what_the_golden_emits(post_ln_gelu, tmp_path, rng):
    scheme, program = post_ln_gelu
    write_files(generate(scheme, ("numpy", "torch"), tmp_path, passes=(), program=program))
    write_files(generate(scheme, ("numpy",), tmp_path / "without", passes=WITHOUT_GELU, program=program))
    numpy_source = (GENERATED / "numpy" / "post_ln_gelu.py").read_text()
    assert "    ffn_s = _gelu(ffn_w, out=ffn_w)\n" in numpy_source  # forward: into the dead product (reuse-buffers)
    assert "    ffn_s = _gelu(ffn_w)\n" in numpy_source  # vjp: its backward reads ffn_w
    assert "torch.nn.functional.gelu(ffn_w)" in (GENERATED / "torch" / "post_ln_gelu.py").read_text()
    assert "_gelu(" not in (tmp_path / "numpy" / "post_ln_gelu.py").read_text()
    numpy_passed = import_path(GENERATED / "numpy" / "post_ln_gelu.py")
    numpy_plain = import_path(tmp_path / "numpy" / "post_ln_gelu.py")
    d, heads, d_ff = 16, 4, 40
    params = {name: rng.standard_normal(shape) * 0.5 for name, shape in
              {name: tuple({"d": d, "d_ff": d_ff}[axis] for axis in axes)
               for name, axes in numpy_passed.PARAMETERS.items() if not name.startswith("final_norm")}.items()}
    u = rng.standard_normal((3, 7, d)) * 4  # GELU's arguments on both sides of erf's |x| = 1 switch
    expected = numpy_plain.forward(u, params, n_heads=heads)
    assert np.abs(numpy_passed.forward(u, params, n_heads=heads) - expected).max() <= 1e-12
    # every other pass on: float64 results bit for bit equal (the formula's operations in its order); float32 ones
    # within 1e-6 (both Eigen's rational erf, _gelu's with the 1/√2 and leading coefficients folded into constants)
    numpy_without = import_path(tmp_path / "without" / "numpy" / "post_ln_gelu.py")
    typed = {name: value.astype(np.float64) for name, value in params.items()}
    np.testing.assert_array_equal(numpy_passed.forward(u, typed, n_heads=heads),
                                  numpy_without.forward(u, typed, n_heads=heads))
    single = {name: value.astype(np.float32) for name, value in params.items()}
    passed_single = numpy_passed.forward(u.astype(np.float32), single, n_heads=heads)
    without_single = numpy_without.forward(u.astype(np.float32), single, n_heads=heads)
    assert passed_single.dtype == np.float32 and np.abs(passed_single - without_single).max() <= 1e-6
    torch_passed = import_path(GENERATED / "torch" / "post_ln_gelu.py")
    block = torch_passed.Block(d, heads, d_ff, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected).max() <= 1e-12
    # negative control: the tanh approximation of GELU is off by more than the tolerance
    w = u.ravel()
    tanh = w * (1 + np.tanh(np.sqrt(2 / np.pi) * (w + 0.044715 * w**3))) / 2
    assert np.abs(numpy_passed._gelu(w) - tanh).max() > 1e-6
