"""``adjoint-test/<scheme>/torch``: torch's gradients through the emitted Block (autograd and the derived backward)
against the emitted NumPy ``vjp`` at the adjoint tests' point, where a query sees no key."""

import sympy as sp

import splitformer
import splitformer.codegen.bool_values as bool_values
from splitformer.codegen.ir import Where

from conftest import ROOT
from test_support_factor import SCHEME


def _torch_check(tmp_path):
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "support_mean.py")
    (tmp_path / "mean-step.toml").write_text(SCHEME, encoding="utf-8")
    checks = splitformer.derive(str(tmp_path / "mean-step.toml")).check(only="adjoint-test").checks
    return next(check for check in checks if check.id == "adjoint-test/mean-step/torch")


def test_torch_gradients_of_a_mean_over_no_key_equal_the_vjp(tmp_path):
    check = _torch_check(tmp_path)
    assert check.holds and "autograd" in check.detail and "derived" in check.detail, check.detail


def test_control_a_masked_quotient_whose_other_branch_divides_by_zero_fails_it(tmp_path, monkeypatch):
    """``torch.where(count != 0, sum / count, 0)``: the value is right, autograd's gradient is NaN (0 · ∞)."""
    monkeypatch.setattr(bool_values, "_where", lambda mask, value: Where(mask, value, sp.Integer(0)))
    check = _torch_check(tmp_path)
    assert not check.holds and "autograd inf" in check.detail, check.detail
