"""The derived LayerNorm adjoint recognized as one operation (``layer-norm-adjoint`` pass): torch's fused
LayerNorm backward read at the kept ``P``. Parity with ``--passes none``: tests/test_adjoint_passes_parity.py."""

from dataclasses import replace

import sympy as sp

from splitformer.codegen.ir import Elementwise, NormalizeAdjoint, Reduction
from splitformer.codegen.passes import DEFAULT, PASSES, inline_elementwise, layer_norm_adjoint

from conftest import lowered_backward, unfused_backward

WITHOUT = tuple(rewrite for name, rewrite in PASSES.items() if name != "layer-norm-adjoint")


def _fused(module) -> dict[str, NormalizeAdjoint]:
    return {op.out: op for op in module.ops if isinstance(op, NormalizeAdjoint)}


def test_each_layer_norm_adjoint_is_one_operation():
    passed, without = lowered_backward("post-ln", DEFAULT), lowered_backward("post-ln", WITHOUT)
    fused = _fused(passed.adjoint)
    assert {name: (op.costate, op.p, op.variance, op.gain, op.gradients) for name, op in fused.items()} == {
        "u3_bar": ("u4_bar", "norm2_p", "norm2_beta", "norm2_gain", ("norm2_gain_bar", "norm2_bias_bar")),
        "u1_bar": ("u2_bar", "norm1_p", "norm1_beta", "norm1_gain", ("norm1_gain_bar", "norm1_bias_bar"))}
    # ḡ, c̄, P̄, β̄, ᾱ, x̄: each formula; not the row sums t₁, t₂, t₃, written out in β̄'s and ᾱ's (no array of theirs)
    assert all(op.comment.count("\n") == 5 and "# t" not in op.comment for op in fused.values())
    assert {"norm2_gain_bar", "norm2_bias_bar"} <= {op.out for op in without.adjoint.ops}
    # the row sums over P and P̄ are gone with the pass, there without it
    sums = [op for op in without.adjoint.ops if isinstance(op, Reduction) and not op.mean]
    assert len(sums) == 4 and not _fused(without.adjoint)
    assert not any(isinstance(op, Reduction) and not op.mean for op in passed.adjoint.ops)


def test_a_residual_term_of_the_costate_stays_a_sum():
    """pre-ln: λ⁽⁰⁾ is the residual's λ⁽¹⁾ plus the LayerNorm's x̄."""
    adjoint = lowered_backward("pre-ln", DEFAULT).adjoint
    assert set(_fused(adjoint)) == {"norm1_x_bar", "norm2_x_bar"}
    (total,) = [op for op in adjoint.ops if op.out == "u0_bar"]
    assert isinstance(total, Elementwise) and set(total.reads()) == {"norm1_x_bar", "u1_bar"}


def test_the_pass_matches_the_derived_statements_and_nothing_else():
    module = inline_elementwise(unfused_backward("post-ln"))  # the passes before it (ᾱ inlined into x̄)
    assert len(_fused(layer_norm_adjoint(module))) == 2
    # controls: β̄ with the wrong sign; a P that is not centred (Σ_k P ≠ 0: the t₂ term may not be dropped)
    beta_bar = next(op for op in module.ops if op.out == "norm2_beta_bar")
    flipped = replace(beta_bar, expr=-beta_bar.expr)
    p = next(op for op in module.ops if op.out == "norm2_p")
    alpha = next(item for item in p.expr.atoms(sp.Indexed) if str(item.base.label) == "norm2_alpha")
    uncentred = replace(p, expr=p.expr.xreplace({alpha: alpha / 2}))
    for changed in (flipped, uncentred):
        ops = [changed if op.out == changed.out else op for op in module.ops]
        assert set(_fused(layer_norm_adjoint(replace(module, ops=ops)))) == {"u1_bar"}


def test_rms_norm_is_left_alone():
    """Control: llama's RMSNorm (no mean) keeps its derived adjoint statements."""
    assert not _fused(lowered_backward("llama", DEFAULT).adjoint)


def test_a_costate_holding_two_layer_norm_adjoints_gets_both():
    """rk2: the second stage's LayerNorms both read u⁽¹⁾, so its costate sums two LayerNorm adjoints."""
    adjoint = lowered_backward("rk2", DEFAULT).adjoint
    assert set(_fused(adjoint)) == {"norm1_x_bar", "norm2_x_bar", "norm12_x_bar", "norm22_x_bar"}
    # each gain is shared by two LayerNorms: its gradient's terms are summed apart, not written by the fused op
    assert all(op.gradients is None for op in _fused(adjoint).values())
    (total,) = [op for op in adjoint.ops if op.out == "u1_bar"]
    assert set(total.reads()) == {"norm12_x_bar", "norm22_x_bar"}


def test_each_layer_norm_adjoint_sits_under_its_own_substeps_header():
    """A reader (s46): the fused adjoint took the section of the costate it writes (λ of the substep before), so
    post-ln's norm2 adjoint sat under "adjoint of substep 3: parallel …" and substep 4 had no header. Each fused op
    has its normalization's section; the control reads the section of the costate's own statement."""
    from conftest import GENERATED

    source = (GENERATED / "numpy" / "post_ln.py").read_text(encoding="utf-8").splitlines()
    header = ""
    sections = {}
    for line in source:
        if line.strip().startswith("# --- adjoint of"):
            header = line.strip()
        elif "_layer_norm_adjoint(" in line and "=" in line:
            sections[line.split("(")[1].split(",")[0]] = header
    assert sections == {"u4_bar": "# --- adjoint of substep 4: norm2, projection ---",
                        "u2_bar": "# --- adjoint of substep 2: norm1, projection ---",
                        "u1_bar": "# --- adjoint of substep 1: final_norm, projection ---"}  # a stack's final norm
    fused = _fused(lowered_backward("post-ln", DEFAULT).adjoint)
    assert {name: op.section for name, op in fused.items()} == {"u3_bar": "adjoint of substep 4: norm2, projection",
                                                                "u1_bar": "adjoint of substep 2: norm1, projection"}
    costates = {op.out: op.section for op in lowered_backward("post-ln", WITHOUT).adjoint.ops}  # control: λ's own
    assert costates["u3_bar"].startswith("adjoint of substep 3")
    assert costates["u1_bar"].startswith("adjoint of substep 1")


def test_no_adjoint_header_opens_twice_in_a_generated_numpy_module():
    """A reviewer (s46): under its own section, symmetric-parallel's norm2 adjoint (fused where u⁰'s costate is summed,
    after branch substep 1) reopened "adjoint of branch substep 3" and then substep 1 again. A fused adjoint whose
    section closed before it stays under the costate's (``_not_reopening``); every function's headers are distinct."""
    import ast

    from conftest import GENERATED

    for path in sorted((GENERATED / "numpy").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        for function in ast.walk(ast.parse(source)):
            if isinstance(function, ast.FunctionDef):
                lines = source.splitlines()[function.lineno - 1:function.end_lineno]
                headers = [line.strip() for line in lines if line.strip().startswith("# --- adjoint of")]
                assert len(headers) == len(set(headers)), (path.name, function.name, headers)
