"""The convolutional vision Transformer (CvT) as stages of one continuous model.

Each stage ``s`` lives on its own grid ``Ω_s`` (coarser and with a wider feature domain than
the last): its initial condition is the **convolutional token embedding** ``u_s(·, 0) =
LN(K_s u_{s-1}(·, T))`` — a strided convolution from the previous grid (a restriction in
space, a lifting in features), then the projection onto ``S_1`` — and ``N_s`` pre-LN GELU
steps advance it. In a step, Q, K and V are depth-wise convolutions over the grid (relative
kernels with local support), BatchNorm as a derived per-channel affine map, then point-wise
affine maps; K and V use stride ``S_kv``: the attention integral over ``x̃`` runs over a
coarser quadrature grid ``Ω_k``, whose spacing cancels in the softmax. The class node joins
the token domain in the last stage only, unconvolved; the readout is the projection onto
``S_1`` of the class node's state and a linear head.
"""

from __future__ import annotations

import sympy as sp

from .activations import activation
from .cnn_operators import BatchNorm, Convolution
from .cvt_operators import KEY, ConvolutionalAttention, DepthwiseConvolution
from .domains import X, Y
from .image import C, X1, X2
from .cvt_pieces import cvt_programs
from .network_program import NetworkProgram
from .network_spec import MultiscaleSpec
from .operators import STATE, FeedForward, LayerNorm
from .program import TIME_STEP, Assignment
from .vision_operators import ClassTokenHead
from .latex import equation
from .stages import discretize_stage, field_tensor

__all__ = ["derive_cvt", "PROJECTIONS"]

#: The three convolutional projections: name, and the configuration names of their stride and padding.
PROJECTIONS = (("q", "stride_q", "padding_q"), ("k", "stride_kv", "padding_kv"), ("v", "stride_kv", "padding_kv"))


def _tokens(name: str, node=X) -> object:
    return field_tensor(name, name.replace("_", r"\_"), (node.index, Y.index), "input")


def _update(target: str, state: str, field: str) -> Assignment:
    indices = (X.index, Y.index)
    lhs, rhs = sp.IndexedBase(target)[indices], sp.IndexedBase(state)[indices] + TIME_STEP * sp.IndexedBase(field)[indices]
    return Assignment(lhs, rhs, "explicit Euler step (the residual sum)", continuous=equation(lhs, rhs), quadrature=equation(lhs, rhs))


def derive_cvt(spec: MultiscaleSpec = MultiscaleSpec("cvt", "")) -> NetworkProgram:
    """CvT's stages (by part: the token embedding, one step, the readout) and its programs (``cvt_pieces``)."""
    image = field_tensor("u0", "u", (C.index, X1.index, X2.index), "input")
    embed = discretize_stage(Convolution("embed", inputs="c", kernel="patch_size", stride="patch_stride",
                                         padding="patch_padding"), {STATE: image})
    embed_norm = discretize_stage(LayerNorm("embed_norm"), {STATE: _tokens("tokens")})
    norm1 = discretize_stage(LayerNorm("norm1"), {STATE: _tokens("u0")})
    grid = field_tensor("grid", "u", (Y.index, X1.index, X2.index), "input")
    projections = []
    for letter, stride, padding in PROJECTIONS:
        conv = discretize_stage(DepthwiseConvolution(f"{letter}conv", "kernel_qkv", stride, padding), {STATE: grid})
        norm = discretize_stage(BatchNorm(f"{letter}bn"), {STATE: conv.tensors[conv.output]})
        projections.append((conv, norm))
    attention = discretize_stage(ConvolutionalAttention("attn"), {
        "qin": _tokens("q_in"), "kin": _tokens("k_in", KEY), "vin": _tokens("v_in", KEY)})
    norm2 = discretize_stage(LayerNorm("norm2"), {STATE: _tokens("u1")})
    ffn = discretize_stage(FeedForward("ffn", activation("gelu")), {STATE: _tokens("norm2_out")})
    final = discretize_stage(LayerNorm("final_norm"), {STATE: _tokens("cls")})
    head = discretize_stage(ClassTokenHead("head"), {STATE: _tokens("final_norm_out")})
    step = (norm1, *(stage for pair in projections for stage in pair), attention, _update("u1", "u0", attention.output),
            norm2, ffn, _update("u2", "u1", ffn.output))
    parts = {"embedding": (embed, embed_norm), "step": step, "readout": (final, head)}
    return NetworkProgram(spec, "cvt", parts, cvt_programs(spec.module_name, parts))
