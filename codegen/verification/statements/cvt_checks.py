"""Checks of the cvt model: equivariant depth-wise kernels, BatchNorm, the coarse key grid, the score scale."""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.cvt_operators import KEYS, config_symbol
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, TOKENS
from splitformer.symbolic.image import X1
from splitformer.symbolic.network_program import NetworkProgram
from . import Check
from .equivariance import shift_commutes
from .grid_checks import batch_norm_check

__all__ = ["cvt_checks"]


def _equivariance(model: NetworkProgram) -> Check:
    results = []
    for convolution in (model.stage(f"{letter}conv") for letter in "qkv"):
        stride = config_symbol(convolution.operator.stride)
        assignment = convolution.assignments[-1]
        results.append((convolution.operator.key, stride, shift_commutes(assignment, X1.index, 1, stride),
                        shift_commutes(assignment, X1.index, 1, stride + 1)))
    holds = all(right and not wrong for _, _, right, wrong in results)
    return Check(f"{model.spec.name}/translation-equivariance", model.spec.name,
                 "Each depth-wise convolution of Q, K, V is a translation-equivariant integral operator: shifting the "
                 "grid field by its stride (stride_q, stride_kv pixels of the stage's grid) shifts its output by one "
                 "node; a shift by stride + 1 does not (negative control).", "symbolic", holds,
                 "; ".join(f"{key}: shift by {stride} {'commutes' if right else 'does NOT commute'}, by {stride + 1} "
                           f"{'commutes (control failed)' if wrong else 'does not'}" for key, stride, right, wrong in results))


def _key_spacing(model: NetworkProgram) -> Check:
    gamma = next(a for a in model.stage("attn").assignments if a.target.endswith("_gamma"))
    numerator, denominator = sp.fraction(gamma.rhs)
    cancels = not gamma.rhs.has(KEYS.spacing) and isinstance(denominator, sp.Sum)
    mismatched = KEYS.spacing * numerator / (TOKENS.spacing * denominator)  # normalizer on the fine grid
    return Check(f"{model.spec.name}/key-spacing", model.spec.name,
                 "On the coarser quadrature grid of the keys (spacing Δk = stride_kv Δx), Δk cancels between the "
                 "attention kernel and its normalizing integral: the derived kernel is the row softmax over the key "
                 "nodes; normalizing on the fine grid instead would leave Δk/Δx (negative control).", "symbolic",
                 cancels and mismatched.has(KEYS.spacing),
                 f"derived γ = {sp.sstr(gamma.rhs)}; mismatched quadrature leaves {sp.sstr(KEYS.spacing / TOKENS.spacing)}")


def _score_scale(model: NetworkProgram) -> Check:
    score = next(a for a in model.stage("attn").assignments if a.target.endswith("_a"))
    scale = sp.Mul(*(factor for factor in sp.Mul.make_args(score.rhs) if not factor.has(sp.Sum)))
    d, heads = sp.symbols("d H", positive=True, integer=True)
    width = {FEATURES.size: d, HEADS.size: heads, HEAD_FEATURES.size: d / heads}
    reference = d ** sp.Rational(-1, 2)  # transformers' CvtSelfAttention: embed_dim ** -0.5
    vit = HEAD_FEATURES.size ** sp.Rational(-1, 2)  # the head's measure, as in ViT (negative control)
    holds = sp.simplify(scale.xreplace(width) - reference) == 0
    control = sp.simplify(vit.xreplace(width) - reference)
    return Check(f"{model.spec.name}/score-scale", model.spec.name,
                 "The derived score scale |Ω_y|^{-1/2} (the measure of the whole feature domain Ω_y = Ω_h × Ω_e) is "
                 "embed_dim^{-1/2}, the scale of transformers' CvtSelfAttention; ViT's head measure |Ω_e|^{-1/2} "
                 "differs from it by √H (negative control, nonzero for H > 1).", "symbolic",
                 holds and control != 0 and control.subs(heads, 1) == 0,
                 f"derived scale {sp.sstr(scale)}; ViT's minus CvT's = {sp.sstr(sp.factor(control))}")


def cvt_checks(model: NetworkProgram) -> list[Check]:
    """The checks of the cvt model."""
    from .cvt_recovery import cvt_recovery_checks

    return [_equivariance(model), batch_norm_check(model.spec.name, model.stages()), _key_spacing(model), _score_scale(model),
            *cvt_recovery_checks(model)]
