"""The checks of the vision models hold, and fail on wrongly derived models (negative controls)."""

from __future__ import annotations

import json

import pytest
import sympy as sp

from splitformer.codegen.cli import main
from splitformer.codegen.verification.groups import GROUPS
from splitformer.codegen.verification.statements.equivariance import shift_commutes
from splitformer.codegen.verification.statements.network_recovery import _symbolic_holds, wrong_stride
from splitformer.symbolic.image import X1
from splitformer.symbolic.network_spec import load_network
from splitformer.symbolic.network_derivation import derive_token_network
from splitformer.symbolic.vision_operators import PATCH


#: Every group of checks but the statements that hold for every scheme (``test_checks.py`` runs those once).
_OWN = ",".join(group for group in GROUPS if group != "general")


@pytest.fixture(scope="module")
def vit():
    return derive_token_network(load_network("vit"))


def test_check_vit_passes_from_the_command_line(capsys):
    assert main(["check", "vit", "--format", "json", "--only", _OWN]) == 0
    checks = {check["id"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    for name in ("recovery/vit/symbolic", "recovery/vit/numeric", "vit/negative-controls",
                 "vit/translation-equivariance", "semantics/vit/emitted", "adjoint-test/vit/dot",
                 "adjoint-test/vit/taylor"):
        assert checks[name]["holds"], checks[name]


def test_symbolic_recovery_fails_for_a_wrong_stride(vit):
    """The numeric controls (wrong stride, wrong scale) are asserted by ``vit/negative-controls`` above."""
    holds, detail = _symbolic_holds(wrong_stride(vit))
    assert not holds and "do not vanish" in detail


def test_translation_equivariance_needs_the_right_shift(vit):
    embedding = vit.parts["embedding"][0].assignments[0]
    assert shift_commutes(embedding, X1.index, 1, PATCH)
    assert not shift_commutes(embedding, X1.index, 1, PATCH + 1)
    assert not shift_commutes(embedding, X1.index, 1, sp.Integer(1))


@pytest.mark.parametrize("name", ["resnet-block", "unet-level"])
def test_grid_model_checks_hold(name, capsys):
    assert main(["check", name, "--format", "json", "--only", _OWN]) == 0
    checks = {check["id"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    for check in ("translation-equivariance", "batch-norm-affine"):
        assert checks[f"{name}/{check}"]["holds"], checks[f"{name}/{check}"]
    for check in (f"semantics/{name}/emitted", f"adjoint-test/{name}/dot", f"adjoint-test/{name}/taylor"):
        assert checks[check]["holds"], checks[check]


def test_cvt_checks_hold(capsys):
    assert main(["check", "cvt", "--format", "json", "--only", _OWN]) == 0
    checks = {check["id"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    for name in ("cvt/translation-equivariance", "cvt/batch-norm-affine", "cvt/key-spacing", "cvt/score-scale",
                 "recovery/cvt/symbolic", "recovery/cvt/numeric", "adjoint/cvt/finite-difference",
                 "adjoint/cvt/negative-control", "semantics/cvt/emitted", "adjoint-test/cvt/dot",
                 "adjoint-test/cvt/taylor"):
        assert checks[name]["holds"], checks[name]
    # the whole of each program, the chaining included, and negative controls in the chaining
    for program in ("embedding", "embedding_cls", "step", "step_cls", "grid", "grid_cls", "node", "readout"):
        assert f"{program} " in checks["adjoint/cvt/finite-difference"]["detail"]
    for control in ("step_cls: norm1_out_bar", "step_cls: u1_bar", "embedding_cls: embed_norm_out_bar"):
        assert control in checks["adjoint/cvt/negative-control"]["detail"]


def test_cvt_recovery_fails_with_the_head_scale():
    from splitformer.codegen.verification.statements.cvt_recovery import _head_scale, _numeric_error
    from splitformer.symbolic.cvt import derive_cvt

    model = derive_cvt()
    assert _numeric_error(model) < 1e-40 and _numeric_error(_head_scale(model)) > 1e-3
